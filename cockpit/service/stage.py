"""The watch loop: one stage's processes (training, evaluation), launched in a group of their own and
watched until they exit.

At every poll it reads the record's new events (`RunView`), and acts on what it sees: a stop or kill
request (`control/`), a stall (`cockpit.service.stall`), the host RAM guard (`cockpit.service.ramguard`).
A stop asked for is the trainer's to honour (it checkpoints, then exits); a stage with nothing to
checkpoint, a kill, or a group that did not end within `KILL_GRACE_S` is signalled.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

import psutil

from cockpit.profiles import Profile
from cockpit.record import RunReader
from cockpit.record.control import request_stop
from cockpit.record.view import RunView
from cockpit.service.diagnosis import stall_where
from cockpit.service.keeper import RecordKeeper
from cockpit.service.ramguard import ram_limit_mib, ram_verdict
from cockpit.service.spawn import POLL_S, GroupEnd, popen_logged
from cockpit.service.stall import StallDetector
from cockpit.service.telemetry import ProcessTree

STACK_WAIT_S = 3.0  # for the ranks' stack dumps, when a stall is judged
# Phases of a training stage with nothing to checkpoint yet: a stop request ends the processes at once.
BEFORE_TRAINING = ("starting", "build", "setup", "load")


class StageRunner:
    """Launches a run's stages one at a time and watches each until its processes exit."""

    def __init__(
        self, keeper: RecordKeeper, profile: Profile, resumed: bool, clock: Callable[[], float] = time.time
    ) -> None:
        self.keeper = keeper
        self.paths = keeper.paths
        self.profile = profile
        self.reader = RunReader(self.paths.root, strict=False)  # a damaged line must not stop the run's owner
        self.view = RunView()
        self.proc: subprocess.Popen[bytes] | None = None
        self.stage = ""
        self.ending = GroupEnd()  # the stage's process group: asked to end when, killed or not
        self.tree: ProcessTree | None = None  # the stage's processes: the launcher and its ranks
        self.stop_requested_at: float | None = None
        self.stop_reason = "user"
        self.ram_peak_fraction = 0.0
        self.ram_peak_mib = 0.0
        self.ram_limit_mib = ram_limit_mib(
            profile.hardware.host_ram_limit_gib, psutil.virtual_memory().total / 2**20
        )
        self.ram_stop: str | None = None  # the guard's diagnosis, once it has stopped the run
        self.stall = StallDetector(profile.training.stall_timeout_s, clock, resumed=resumed)
        self.stall_where = ""  # which rank stalled, when a stall was judged with several ranks

    # --- the stage -------------------------------------------------------------------------------------
    def launch(self, argv: list[str], stage: str) -> None:
        """Start one stage's processes in their own group, output appended to `output.log`."""
        self.ending.terminated_at = None
        self.stage = stage
        self.stall.begin_stage(stage)
        # Its own process group: stop and kill reach every rank.
        self.proc = popen_logged(argv, self.paths.output_log)
        self.tree = ProcessTree(self.proc.pid)
        self.keeper.events.write(
            "launch", stage=stage, argv=argv, pid=self.proc.pid, world_size=self.profile.world_size
        )
        self.keeper.update_manifest(trainer_pgid=self.proc.pid)

    def watch(self) -> int:
        """Poll until the stage's processes exit; returns their exit code."""
        assert self.proc is not None
        while True:
            now = time.time()
            events = self.reader.poll()
            self.view.apply(events)
            self.stall.observe(events)
            self._sample_host()
            self._check_host_ram()
            self._check_requests(now)
            self._check_stall()
            rc = self.proc.poll()
            if rc is not None:
                self.view.apply(self.reader.poll())
                return rc
            time.sleep(POLL_S)

    def follow(self) -> None:
        """Read the record's new events (after the stage's processes have ended)."""
        self.view.apply(self.reader.poll())

    # --- stop requests and signals ---------------------------------------------------------------------
    def on_signal(self, signum: int, _frame: Any) -> None:
        """SIGTERM or SIGINT to the supervisor: the run is stopped as a user's stop would."""
        name = signal.Signals(signum).name
        if self.stop_requested_at is None:
            self.stop_reason = f"{name} to the supervisor"
        self.keeper.note(f"supervisor received {name}: stopping the run")
        self.request_stop()

    def request_stop(self) -> None:
        """Ask the trainer to checkpoint and exit (it polls the request file at every step)."""
        request_stop(self.paths.root)

    def signal_group(self, sig: signal.Signals) -> None:
        """Send `sig` to the stage's process group (nothing once it has ended)."""
        self.ending.signal(self.proc, sig, time.time())

    def _check_requests(self, now: float) -> None:
        if self.stop_requested_at is None and self.paths.stop_request.exists():
            self.stop_requested_at = now
            self.keeper.write("stop_request", phase=self.view.phase, step=self.view.step)
            if self.stage != "train" or self.view.phase in BEFORE_TRAINING:  # nothing to checkpoint (yet)
                self.signal_group(signal.SIGTERM)
        if self.paths.kill_request.exists() and not self.ending.killed:
            self.keeper.note("kill requested: SIGKILL to the training processes")
            self.signal_group(signal.SIGKILL)
        if self.ending.overdue(now):
            self.signal_group(signal.SIGKILL)

    # --- stalls ----------------------------------------------------------------------------------------
    def _check_stall(self) -> None:
        """Say when a stall is suspected or cleared; stop a stalled run (see `cockpit.service.stall`)."""
        change = self.stall.check()
        if change is None:
            return
        step = self.stall.stage_step  # this attempt's: a resume's setup is before any step of its own
        if change.kind == "cleared":  # steps, or before the first step progress, came again
            again = f"steps again at step {step}" if step is not None else "progress again"
            self.keeper.note(again, stall_suspected=False)
            self.keeper.update_manifest(warning=None)
        elif change.kind == "suspected":
            self.keeper.note(change.message, stall_suspected=True)
            at = f"at step {step}" if step is not None else "before the first step"
            self.keeper.update_manifest(warning=f"stall suspected {at}: {change.message}")
        else:
            self.stall_where = self._stalled_rank()
            where = f"{self.stall_where}; " if self.stall_where else ""
            self.keeper.note(f"stalled: {where}{change.message}")
            self.signal_group(signal.SIGTERM)

    def _stalled_rank(self) -> str:
        """With several ranks: ask this host's ranks for their Python stacks (SIGUSR1, `trainer/recipe.py`)
        and say which one is stuck outside a collective (`cockpit.service.diagnosis.stall_where`)."""
        if self.profile.world_size <= 1:
            return ""
        here = socket.gethostname()
        sizes: dict[int, int] = {}
        for rank, info in self.view.ranks.items():
            path = self.paths.stack(rank)
            if info.get("host") != here or not path.exists():
                continue
            sizes[rank] = path.stat().st_size
            try:
                os.kill(int(info["pid"]), signal.SIGUSR1)
            except (ProcessLookupError, PermissionError, KeyError, ValueError):
                sizes.pop(rank)
        deadline = time.monotonic() + STACK_WAIT_S
        while time.monotonic() < deadline and any(
            self.paths.stack(r).stat().st_size == n for r, n in sizes.items()
        ):
            time.sleep(0.1)
        time.sleep(0.2)  # a dump is written in one go, all threads: let the last one finish
        stacks = {}
        for rank, size in sizes.items():
            with open(self.paths.stack(rank), encoding="utf-8", errors="replace") as f:
                f.seek(size)
                stacks[rank] = f.read()
        return stall_where(stacks, self.view.ranks)

    # --- host RAM --------------------------------------------------------------------------------------
    def _check_host_ram(self) -> None:
        """Once, when the stage's processes reach the RAM limit: ask for a checkpoint and a stop
        (`cockpit.service.ramguard`). A stop already asked for (by the user, a signal) is left to run
        its course."""
        if self.ram_stop is not None or self.tree is None or self.stop_requested_at is not None:
            return
        if self.paths.stop_request.exists():
            return
        rss = self.tree.sample().get("run_rss_mib")
        verdict = ram_verdict(rss, self.ram_limit_mib)
        if verdict is None:
            return
        self.ram_stop = verdict
        self.stop_reason = verdict
        self.keeper.note(
            f"{verdict}: checkpoint and stop requested",
            run_rss_mib=rss,
            host_ram_limit_mib=round(self.ram_limit_mib, 1),
        )
        self.request_stop()

    def _sample_host(self) -> None:
        vm = psutil.virtual_memory()
        used = vm.total - vm.available
        if used / vm.total > self.ram_peak_fraction:
            self.ram_peak_fraction = used / vm.total
            self.ram_peak_mib = used / 2**20
