"""Room on the disk before a resume starts: what its next attempt writes against what is free.

A resume that cannot save its next checkpoint fails hours later, at its first save, after the load; this
says so in one line before anything starts. What the next attempt writes before the Trainer rotates an
old checkpoint out: one checkpoint (the size of the last one on disk, or the run's plan's where none is)
and the adapter (the plan's), and a margin for the record's own lines.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from cockpit.plan.store import load_plan
from cockpit.units import size

RECORD_MARGIN_BYTES = 64 * 2**20  # the event files, output.log and the supervisor's reserve


def folder_bytes(folder: Path) -> int:
    """The bytes of every file under `folder` (0 when it is missing)."""
    folder = Path(folder)
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def bytes_needed(run_dir: Path, checkpoint: str | None) -> int:
    """What the next attempt of the run writes before it can rotate a checkpoint out."""
    disk = (load_plan(run_dir) or {}).get("disk") or {}
    one = folder_bytes(Path(checkpoint)) if checkpoint else 0
    one = one or int(disk.get("per_checkpoint") or 0)
    return one + int(disk.get("adapter") or 0) + RECORD_MARGIN_BYTES


def room_problem(run_dir: Path, checkpoint: str | None) -> str | None:
    """One line (where, what is free, what is needed) when the run's disk lacks the room its next attempt
    needs (`bytes_needed`), else None."""
    need = bytes_needed(run_dir, checkpoint)
    free = shutil.disk_usage(run_dir).free
    if free >= need:
        return None
    what = f"a checkpoint like {Path(checkpoint).name}" if checkpoint else "a checkpoint"
    return (
        f"{run_dir.name}: {size(free)} free on the disk of {run_dir.parent}, and resuming needs about "
        f"{size(need)} ({what}, the adapter and the record): free some space first"
    )
