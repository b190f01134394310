"""Is a run's owner still there, and which processes are its own? Checks for a supervisor that died
without its last words, and for the training process group `run.json` names.

Read only: `cockpit.service.lifecycle` acts on what it finds, and signals a group only once it is proven the
run's own here (a stale record, after a reboot or with a reused PID or group id, names processes of
something else).

Process identity is proven, not taken from a number: the supervisor by its command line and its start
(`supervisor_boot_start`: this boot's id and the clock ticks from boot to the process's start, exact
and blind to the wall clock; else, on another OS or in an older record, `supervisor_started_at`,
`psutil`'s `create_time`, within `START_SLACK_S`), the training group by a live member whose command line
names the run directory and that started after the supervisor did.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from cockpit.record import load_manifest

# psutil's create_time is the boot time plus the process's start in clock ticks; the boot time it reads
# (the wall clock less the uptime) moves with adjustments of the wall clock, so the same process may read
# differently later: by a second or more on a loaded VM, by hours after a suspend. The boot-relative
# start (`boot_start`) does not move; this slack serves where it is missing.
START_SLACK_S = 2.0
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


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


def boot_start(pid: int) -> str | None:
    """`"<boot id>:<clock ticks from boot to the start of pid>"` (Linux's /proc), the same for the life of
    the process whatever the wall clock does; None where /proc cannot say (another OS, the process gone)."""
    try:
        boot = BOOT_ID.read_text().strip()
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22, starttime (after pid and comm)
    except (OSError, ValueError, IndexError):
        return None
    return f"{boot}:{ticks}"


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _pid(value: Any) -> int | None:
    """A PID or group id from the record, or None where it holds none (or something else)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def supervisor_alive(manifest: dict[str, Any], run_dir: Path) -> bool:
    """The manifest's supervisor PID is a live `cockpit.service.supervisor` process for this run, started when
    the manifest says it did: by `supervisor_boot_start` where the record and /proc both have one, else by
    `supervisor_started_at` within `START_SLACK_S` (where the record has that)."""
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
    starts = _boot_starts(pid, manifest)
    if starts:
        recorded, now = starts
        return recorded == now  # a reboot changes the id; a reused PID, the ticks
    started = manifest.get("supervisor_started_at")
    return not _number(started) or abs(created - started) <= START_SLACK_S


def _parse_start(value: Any) -> tuple[str, int] | None:
    """A `boot_start` as (boot id, ticks); None for anything else (absent, or not one)."""
    if not isinstance(value, str):
        return None
    boot, _, ticks = value.rpartition(":")
    return (boot, int(ticks)) if boot and ticks.isascii() and ticks.isdigit() else None


def _boot_starts(pid: int, manifest: dict[str, Any]) -> tuple[tuple[str, int], tuple[str, int]] | None:
    """The supervisor's boot-relative start as the manifest recorded it and process `pid`'s now, each as
    (boot id, ticks); None unless both are known."""
    recorded, now = _parse_start(manifest.get("supervisor_boot_start")), _parse_start(boot_start(pid))
    return (recorded, now) if recorded and now else None


def _started_since(pid: int, create_time: float | None, manifest: dict[str, Any]) -> bool:
    """Process `pid` started no earlier than the run's supervisor: by the boot-relative starts where both
    are known (a process of another boot never did), else by the wall clock within `START_SLACK_S`."""
    starts = _boot_starts(pid, manifest)
    if starts:
        recorded, now = starts
        return now[0] == recorded[0] and now[1] >= recorded[1]
    since = manifest.get("supervisor_started_at")
    return not _number(since) or (create_time or 0) >= since - START_SLACK_S


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
    members, ours = 0, False
    for proc in psutil.process_iter(["pid", "status", "create_time"]):
        try:
            if os.getpgid(proc.info["pid"]) != pgid or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
        except (ProcessLookupError, PermissionError):
            continue
        members += 1
        after = _started_since(proc.info["pid"], proc.info["create_time"], manifest)
        ours = ours or (after and names_run(proc, run_dir))
    return Group(pgid, members, ours)


def check(run_dir: Path, manifest: dict[str, Any] | None = None) -> Liveness:
    """The supervisor's and the training group's state; the trainer counts as alive only when its group
    is proven this run's."""
    manifest = manifest or load_manifest(run_dir)
    group = own_group(manifest, run_dir)
    return Liveness(supervisor_alive(manifest, run_dir), group.ours, group)
