"""An `Imported` run into a run record: a manifest and one event file, through the record's own writer.

The record is the cockpit's usual one (`cockpit.record`), so replay, compare and export read it like any
other. Step events carry only the fields the log held; the manifest's `imported` says where it came
from, which clock its times are on (`wall`: Unix time; `elapsed`: seconds since training began; `step`:
none, one second a step), which fields are absent and which lines were skipped.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Any

from cockpit.importers.model import Imported
from cockpit.record import EventWriter, RunPaths, write_manifest

WRITER = "import"  # events/import.jsonl
STATUS_FINISHED, STATUS_CUT = "finished", "stopped"
BEFORE_S = 0.001  # the import's own events (phase, train_begin) come this long before the first step


def new_import_id(imported: Imported) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-import-{imported.format}-{secrets.token_hex(2)}"


def _times(imported: Imported) -> dict[int, float]:
    """Each step's time on the record's clock."""
    if imported.clock == "step":
        return {step: float(step) for step in imported.steps}
    return {step: float(fields["t"]) for step, fields in imported.steps.items()}


def _eval_time(event: dict[str, Any], times: dict[int, float], clock: str) -> float | None:
    if clock == "step":
        return float(event["step"])
    if event.get("t") is not None:
        return float(event["t"])
    earlier = [s for s in times if s <= event["step"]]
    return times[max(earlier)] if earlier else None


def is_cut(imported: Imported) -> bool:
    """Whether the log stops short: before the total it states, or in the middle of its last line. A log
    that states no total and ends whole is not taken for a stopped run."""
    if imported.finished:
        return False
    return imported.max_steps is not None or imported.cut_off


def write_record(imported: Imported, run_dir: Path, run_id: str | None = None) -> Path:
    """Write `imported` as a new run record at `run_dir` (which must not exist yet); `run_id` is the name
    its manifest gives it (default: the folder's)."""
    run_dir.mkdir(parents=True, mode=0o700)
    paths = RunPaths(run_dir)
    paths.events_dir.mkdir(mode=0o700)
    times = _times(imported)
    steps = sorted(imported.steps)
    first_t = min(times.values()) if times else None
    last_step = steps[-1] if steps else None
    with EventWriter(paths.events(WRITER), rank=0) as w:
        if first_t is not None:
            # Just before the first step: readers order events of one time by kind, not by line.
            begin = first_t - BEFORE_S
            w.write("phase", at=begin, phase="train", message=f"imported from {imported.source.name}")
            if imported.load_memory:
                w.write("load_peak", at=begin, **imported.load_memory)
            w.write("train_begin", at=begin, max_steps=imported.max_steps, start_step=steps[0] - 1)
        evals = sorted(imported.evals, key=lambda e: e["step"])
        pending = list(evals)
        for step in steps:
            fields = {k: v for k, v in imported.steps[step].items() if k != "t"}
            w.write("step", at=times[step], step=step, max_steps=imported.max_steps, **fields)
            while pending and pending[0]["step"] <= step:
                _write_eval(w, pending.pop(0), times, imported.clock)
        for event in pending:
            _write_eval(w, event, times, imported.clock)
        cut = is_cut(imported)
        if last_step is not None:
            w.write("trainer_end", at=times[last_step], outcome="cut" if cut else "finished", step=last_step)
    status = STATUS_CUT if cut else STATUS_FINISHED
    diagnosis = None
    if cut:
        of = f" of {imported.max_steps}" if imported.max_steps else ""
        diagnosis = f"the imported log ends at step {last_step}{of}: the rest is not in it"
    elif not imported.finished:  # no total to fall short of, nothing cut off: the log ends, no more is known
        diagnosis = f"the imported log ends at step {last_step}; it states no total number of steps"
    write_manifest(
        run_dir,
        {
            "run_id": run_id or run_dir.name,
            "status": status,
            "mode": "import",
            "profile_name": f"import:{imported.format}",
            "profile": None,
            "argv": [],
            "created_at": time.time(),
            "started_at": first_t if imported.clock == "wall" else None,
            "ended_at": times[last_step] if imported.clock == "wall" and last_step is not None else None,
            "exit_code": None,
            "diagnosis": diagnosis,
            "imported": summary(imported),
        },
    )
    return run_dir


def _write_eval(w: EventWriter, event: dict[str, Any], times: dict[int, float], clock: str) -> None:
    at = _eval_time(event, times, clock)
    if at is not None:
        w.write("val_loss", at=at, step=event["step"], loss=event["loss"])


def summary(imported: Imported) -> dict[str, Any]:
    """What the manifest and the CLI say of an import."""
    return {
        "source": str(imported.source.resolve()),
        "format": imported.format,
        "clock": imported.clock,
        "steps": len(imported.steps),
        "val_losses": len(imported.evals),
        "finished": imported.finished,
        "cut": is_cut(imported),
        "absent": imported.absent,
        "skipped": imported.skipped_lines(),
        "notes": list(imported.notes),
    }


def import_into(imported: Imported, runs_dir: Path) -> Path:
    """Write `imported` as a new run under `runs_dir`; returns the run directory."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    run_dir = runs_dir / new_import_id(imported)
    write_record(imported, run_dir)
    os.chmod(run_dir, 0o700)
    return run_dir
