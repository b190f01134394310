"""Is a run's owner still there? A check for a supervisor that died without its last words.

Read only: `cockpit.lifecycle.reconcile` acts on what it finds.

Process identity is checked by command line, not by PID alone, so a reused PID is not taken for
the supervisor.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from cockpit.record import load_manifest


@dataclass(frozen=True)
class Liveness:
    """What is alive of a run that its manifest says is running."""

    supervisor_alive: bool
    trainer_alive: bool


def supervisor_alive(manifest: dict[str, Any], run_dir: Path) -> bool:
    """The manifest's supervisor PID is a live `cockpit.supervisor` process for this run."""
    pid = manifest.get("supervisor_pid")
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        cmdline = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return "cockpit.supervisor" in cmdline and run_dir.name in cmdline


def group_alive(pgid: int | None) -> bool:
    """Some live (non-zombie) process still belongs to the training process group."""
    if not pgid:
        return False
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.info["pid"]) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, PermissionError):
            continue
    return False


def check(run_dir: Path, manifest: dict[str, Any] | None = None) -> Liveness:
    manifest = manifest or load_manifest(run_dir)
    return Liveness(supervisor_alive(manifest, run_dir), group_alive(manifest.get("trainer_pgid")))
