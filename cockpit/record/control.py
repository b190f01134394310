"""Requests to a running run, written as files in its `control/` folder.

Files work from any process that can see the run directory, need no PID bookkeeping, and survive a
supervisor restart. The trainer polls `stop` at every step; the supervisor polls both.
"""

from __future__ import annotations

from pathlib import Path

from cockpit.record import RunPaths


def request_stop(run_dir: Path) -> bool:
    """Ask for a checkpoint and a clean exit. False if a stop was already asked for."""
    paths = RunPaths(Path(run_dir))
    paths.control_dir.mkdir(exist_ok=True)
    if paths.stop_request.exists():
        return False
    paths.stop_request.touch()
    return True


def request_kill(run_dir: Path) -> None:
    """Ask the supervisor to kill the training processes now."""
    paths = RunPaths(Path(run_dir))
    paths.control_dir.mkdir(exist_ok=True)
    paths.kill_request.touch()


def clear_requests(run_dir: Path) -> None:
    """Forget the requests of an attempt that has ended, before a new one starts (a resume)."""
    paths = RunPaths(Path(run_dir))
    paths.stop_request.unlink(missing_ok=True)
    paths.kill_request.unlink(missing_ok=True)
