"""Fault drills: driving real runs of the `cockpit` command into faults, and waiting for the outcome.

Shared by the fault tests (`tests/test_faults.py`) and `benchmarks/faults.py`. Every fault is done
to real processes (a SIGKILL to a trainer rank, a SIGTERM to the supervisor, a full file system);
only the faults a process cannot be made to have from outside (a hang, a CUDA out-of-memory on a
machine without CUDA, memory that grows inside a rank) use the trainer's test hook, COCKPIT_TEST_FAULT.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cockpit.record import load_manifest, read_events
from cockpit.record.format import TERMINAL_STATUSES

# The source tree this cockpit is imported from: the commands started here import the same code.
REPO = Path(__file__).resolve().parent.parent
# Short runs: no evaluation, a checkpoint every 2 steps, a quick stall timeout.
SHORT = [
    "--set", "eval.enabled=false",
    "--set", "training.save_steps=2",
    "--set", "training.stall_timeout_s=20",
]  # fmt: skip


def env_for(cache: Path, **extra: str) -> dict[str, str]:
    """This environment for a `cockpit` child: the asset cache `cache`, this source tree, no stray
    fault hook, then `extra`."""
    env = dict(os.environ)
    env["COCKPIT_CACHE"] = str(cache)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("COCKPIT_TEST_FAULT", None)
    env.update(extra)
    return env


def start_detached(runs: Path, cache: Path, max_steps: int, *more: str, **env: str) -> Path:
    """`cockpit run --detach` for real; returns the run directory."""
    argv = [sys.executable, "-m", "cockpit", "run", "--detach", "--runs-dir", str(runs)]
    argv += [*SHORT, "--set", f"training.max_steps={max_steps}", *more]
    out = subprocess.run(
        argv, env=env_for(cache, **env), capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert out.returncode == 0, out.stderr
    return Path(out.stdout.strip().splitlines()[-1])


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.5) -> Any:
    """Poll `predicate` (another process's doing) until it returns something true, and return that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"gave up waiting for {what} after {timeout:.0f} s")


def rank0_steps(run_dir: Path) -> list[dict[str, Any]]:
    return [e for e in read_events(run_dir, "step") if e.get("rank", 0) == 0]


def wait_step(run_dir: Path, step: int, timeout: float = 600) -> None:
    wait_for(lambda: any(e["step"] >= step for e in rank0_steps(run_dir)), timeout, f"step {step}")


def wait_end(run_dir: Path, timeout: float = 600) -> dict[str, Any]:
    """The final manifest, once the supervisor has written a terminal status."""

    def ended() -> dict[str, Any] | None:
        manifest = load_manifest(run_dir)
        return manifest if manifest.get("status") in TERMINAL_STATUSES else None

    return wait_for(ended, timeout, "a terminal status")


def trainer_pid(run_dir: Path, rank: int = 0) -> int:
    phases = [e for e in read_events(run_dir, "phase") if e.get("rank") == rank]
    return phases[-1]["pid"]


def supervisor_pid(run_dir: Path) -> int:
    return load_manifest(run_dir)["supervisor_pid"]


def kill(pid: int, sig: signal.Signals) -> float:
    """Send a signal; returns when it was sent (for time-to-diagnosis)."""
    os.kill(pid, sig)
    return time.time()


def try_mount_tmpfs(path: Path, size: str) -> bool:
    """Mount a small tmpfs (needs root); False where this machine does not allow it."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    return done.returncode == 0


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)
