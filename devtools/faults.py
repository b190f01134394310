"""Fault drills: driving real runs of the `cockpit` command into faults, and waiting for the outcome.

Shared by the fault tests (`tests/test_faults.py`) and `benchmarks/faults.py`. Every fault is done
to real processes (a SIGKILL to a trainer rank, a SIGTERM to the supervisor, a full file system);
only the faults a process cannot be made to have from outside (a hang, a CUDA out-of-memory on a
machine without CUDA, memory that grows inside a rank) use the trainer's test hook, COCKPIT_TEST_FAULT.

Waits on real runs go by progress, never by a fixed time (a busy machine, or an op compiled again, makes
any figure wrong): as long as the run's record grows or its processes work (`Watch`), they wait; nothing
of either for `QUIET_S` is a hang.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

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


# Nothing written to the record and the processes idle for this long: a hang. Longer than the supervisor's
# own limit before a first step (`cockpit.service.stall.SetupLimits`), so that the cockpit judges a slow
# run first.
QUIET_S = 1200.0
BUSY_SHARE = 0.1  # the processes used at least this share of one core since the last progress: working


def record_bytes(root: Path) -> int:
    """What the records under `root` hold, the sampler's files aside (it writes while a run hangs)."""
    total = 0
    for path in root.rglob("*"):
        if path.name.startswith("telemetry"):
            continue
        try:
            total += path.stat().st_size if path.is_file() else 0
        except OSError:
            continue
    return total


def tree_cpu_s(pid: int | None) -> float:
    """CPU seconds used by a process and its descendants, alive and ended."""
    if pid is None:
        return 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


@dataclass
class Watch:
    """Whether a run (its record under `record`) or a command (process `pid` and its children) goes on."""

    record: Path | None = None
    pid: int | None = None
    quiet_s: float = QUIET_S
    _bytes: int = field(default=-1, init=False)
    _cpu: float = field(default=0.0, init=False)
    _since: float = field(default_factory=time.monotonic, init=False)

    def idle_s(self) -> float:
        """Seconds since the last progress: the record grew, or the processes used `BUSY_SHARE` of a core."""
        now = time.monotonic()
        size = record_bytes(self.record) if self.record is not None and self.record.exists() else 0
        cpu = tree_cpu_s(self.pid)
        if size != self._bytes or cpu - self._cpu >= BUSY_SHARE * (now - self._since):
            self._bytes, self._cpu, self._since = size, cpu, now
        return now - self._since


def run_watched(argv: list[str], watch: Watch, **popen: Any) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(argv, capture_output=True, text=True)` that waits as long as `watch` sees progress
    (`communicate_watched`)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    out, err = communicate_watched(proc, watch)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def communicate_watched(proc: subprocess.Popen[Any], watch: Watch) -> tuple[Any, Any]:
    """`proc.communicate()` for as long as `watch` sees progress (its `pid` becomes `proc`'s); the process
    and its children killed, and TimeoutError with the output's tail, after `watch.quiet_s` of none."""
    watch.pid = proc.pid
    while True:
        try:
            return proc.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:
            if watch.idle_s() <= watch.quiet_s:
                continue
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        _, err = proc.communicate()
        tail = (err or "")[-2000:] if isinstance(err, str) else ""
        raise TimeoutError(f"`{' '.join(map(str, proc.args))[:200]}` showed no progress for "
                           f"{watch.quiet_s:.0f} s: {tail}")  # fmt: skip


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
    out = run_watched(argv, Watch(record=runs), env=env_for(cache, **env), cwd=REPO)
    assert out.returncode == 0, out.stderr
    return Path(out.stdout.strip().splitlines()[-1])


def wait_for(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    every: float = 0.5,
    watch: Watch | None = None,
) -> Any:
    """Poll `predicate` (another process's doing) until it returns something true, and return that: for
    `timeout` seconds, or, given a `watch`, for as long as it sees progress."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if watch is not None and watch.idle_s() > watch.quiet_s:
            raise TimeoutError(f"gave up waiting for {what}: no progress for {watch.quiet_s:.0f} s")
        if watch is None and time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {timeout:.0f} s")
        time.sleep(every)


def rank0_steps(run_dir: Path) -> list[dict[str, Any]]:
    return [e for e in read_events(run_dir, "step") if e.get("rank", 0) == 0]


def wait_step(run_dir: Path, step: int) -> None:
    """Until rank 0 has made `step`, as long as the run progresses (`Watch`)."""

    def reached() -> bool:
        return any(e["step"] >= step for e in rank0_steps(run_dir))

    wait_for(reached, QUIET_S, f"step {step}", watch=Watch(record=run_dir))


def wait_end(run_dir: Path) -> dict[str, Any]:
    """The final manifest, once the supervisor has written a terminal status (as long as the run
    progresses)."""

    def ended() -> dict[str, Any] | None:
        manifest = load_manifest(run_dir)
        return manifest if manifest.get("status") in TERMINAL_STATUSES else None

    return wait_for(ended, QUIET_S, "a terminal status", watch=Watch(record=run_dir))


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
