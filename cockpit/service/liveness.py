"""Is a run's owner still there, and which processes are its own? Checks for a supervisor that died
without its last words, and for the training process group `run.json` names.

Read only: `cockpit.service.lifecycle` acts on what it finds, and signals a group only once it is proven the
run's own here (a stale record, after a reboot or with a reused PID or group id, names processes of
something else).

Process identity is proven, not taken from a number: the supervisor by its command line and its start
time (`supervisor_started_at`, which it records from `psutil`'s `create_time` when it starts), the
training group by a live member whose command line names the run directory and that started after the
supervisor did.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from cockpit.record import load_manifest

# psutil's create_time is the boot time plus the process's start in clock ticks; the boot time it reads
# moves with adjustments of the wall clock, so the same process may read a little differently later.
START_SLACK_S = 1.0


@dataclass(frozen=True)
class Group:
    """The training process group `run.json` names, as found: its id, how many live processes it has,
    and whether one of them is proven this run's (`own_group`)."""

    pgid: int | None
    members: int
    ours: bool

    def foreign(self) -> str | None:
        """Why the group is not to be signalled although processes hold it; None when it is ours or empty."""
        if self.ours or not self.members:
            return None
        return (
            f"process group {self.pgid} now holds {self.members} process(es) not proven this run's (its "
            "trainer names the run directory and starts after its supervisor): not signalled"
        )


@dataclass(frozen=True)
class Liveness:
    """What is alive of a run that its manifest says is running."""

    supervisor_alive: bool
    trainer_alive: bool
    group: Group | None = None


def started_at(pid: int) -> float:
    """When process `pid` started (seconds since the epoch), as `supervisor_alive` compares it."""
    return psutil.Process(pid).create_time()


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _pid(value: Any) -> int | None:
    """A PID or group id from the record, or None where it holds none (or something else)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def supervisor_alive(manifest: dict[str, Any], run_dir: Path) -> bool:
    """The manifest's supervisor PID is a live `cockpit.service.supervisor` process for this run, started when
    the manifest says it did (`supervisor_started_at`, where the record has one)."""
    pid = _pid(manifest.get("supervisor_pid"))
    if pid is None:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        cmdline = " ".join(proc.cmdline())
        created = proc.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    if "cockpit.service.supervisor" not in cmdline or run_dir.name not in cmdline:
        return False
    started = manifest.get("supervisor_started_at")
    return not _number(started) or abs(created - started) <= START_SLACK_S


def names_run(proc: psutil.Process, run_dir: Path) -> bool:
    """`proc`'s command line holds the run directory (an argument that, read from the process's working
    directory, is that folder): the trainer's `--run-dir`."""
    target = Path(run_dir).resolve()
    try:
        args = [arg.removeprefix("--run-dir=") for arg in proc.cmdline() if target.name in arg]
        if not args:
            return False
        cwd = Path(proc.cwd())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    for arg in args:
        try:
            if (cwd / arg).resolve() == target:
                return True
        except (OSError, ValueError):
            continue
    return False


def own_group(manifest: dict[str, Any], run_dir: Path) -> Group:
    """The group `trainer_pgid` names: its live members, and whether one of them is this run's trainer
    (its command line names `run_dir`, and it started no earlier than the run's supervisor)."""
    pgid = _pid(manifest.get("trainer_pgid"))
    if pgid is None:
        return Group(None, 0, False)
    since = manifest.get("supervisor_started_at")
    members, ours = 0, False
    for proc in psutil.process_iter(["pid", "status", "create_time"]):
        try:
            if os.getpgid(proc.info["pid"]) != pgid or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
        except (ProcessLookupError, PermissionError):
            continue
        members += 1
        after = not _number(since) or (proc.info["create_time"] or 0) >= since - START_SLACK_S
        ours = ours or (after and names_run(proc, run_dir))
    return Group(pgid, members, ours)


def check(run_dir: Path, manifest: dict[str, Any] | None = None) -> Liveness:
    """The supervisor's and the training group's state; the trainer counts as alive only when its group
    is proven this run's."""
    manifest = manifest or load_manifest(run_dir)
    group = own_group(manifest, run_dir)
    return Liveness(supervisor_alive(manifest, run_dir), group.ours, group)
