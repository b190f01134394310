"""Stall detection: no training step for too long, judged against the run's own pace; before the first
step, no progress at all for longer than the setup's own limits.

The supervisor feeds a `StallDetector` the run's events as they arrive and asks it at every poll
what changed. The clock is injected: tests drive it without waiting.

Before an attempt's first step (launch, op builds, data, load, the engine's build) there is no pace to
judge by, and the work can take minutes on a slow machine: a compile, a model load, tokenization. There a
run is judged stalled only when nothing progresses: rank 0 writes no event and the run's processes are
idle (the sampler's `run_cpu_pct`, compilers and every rank included), for `SetupLimits.quiet_s`; or
rank 0 writes no event for `SetupLimits.ceiling_s` whatever the processors do (a hang that spins).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from cockpit.service.diagnosis import setup_stall_verdict, stall_verdict

MEDIAN_WINDOW = 50  # steps the median step time is taken over (as the viewers' ETA)
GPU_IDLE_PCT = 5.0  # every GPU below this utilization: idle
# The run's processes use at least this share of one core (percent): work goes on. Waiting (a lock, a
# collective, the supervisor's polls) stays near 1%; a compile or tokenization on a busy machine >30%.
BUSY_CPU_PCT = 10.0
# Before the first step: no progress at all for max(QUIET_MIN_S, the profile's timeout) is a stall, and no
# event from rank 0 for max(CEILING_FACTOR x the timeout, CEILING_MIN_S) is one even with busy processors.
QUIET_MIN_S = 600.0
CEILING_MIN_S = 3600.0
CEILING_FACTOR = 4.0


@dataclass(frozen=True)
class SetupLimits:
    """How long the phases before an attempt's first step may go without progress."""

    quiet_s: float  # no event from rank 0 and the run's processes idle
    ceiling_s: float  # no event from rank 0, whatever the processors do

    @classmethod
    def for_timeout(cls, timeout_s: float) -> SetupLimits:
        """The setup's limits for a profile's `training.stall_timeout_s`: never below it."""
        return cls(max(QUIET_MIN_S, timeout_s), max(CEILING_MIN_S, CEILING_FACTOR * timeout_s))


@dataclass(frozen=True)
class StallChange:
    """What a check found new: a stall `suspected` (say so, go on), `cleared` (steps again), `stalled`."""

    kind: Literal["suspected", "cleared", "stalled"]
    message: str = ""


@dataclass(frozen=True)
class _Step:
    t: float
    step: int
    step_time_s: float | None


class StallDetector:
    """Watches one training stage for steps that stop coming, and its setup for progress that stops.

    Until the attempt's first step, every phase is judged by `SetupLimits`. From it on, the training
    phase is: its idle clock starts at the stage's training start or its last step, whichever is later.
    Steps are due, and the run's median step time counts, only once this attempt's training has begun:
    a resumed run's old steps say nothing about the new attempt.
    """

    def __init__(
        self, timeout_s: float, clock: Callable[[], float] = time.time, resumed: bool = False
    ) -> None:
        self.timeout_s = timeout_s
        self.resumed = resumed  # a resume: its setup is not the run's first
        self.setup_limits = SetupLimits.for_timeout(timeout_s)
        self.clock = clock
        self._watching = False
        self._stage_started_at: float | None = None
        self._phase = "starting"
        self._phase_words = ""  # what rank 0 said of its phase ("compiling DeepSpeed's cpu_adam op ...")
        self._phase_t: float | None = None
        self._event_t: float | None = None  # rank 0's latest event in this stage
        self._busy_t: float | None = None  # the latest sample with the run's processes busy
        self._stage_step: int | None = None  # the attempt's latest step (None: none yet)
        self._train_started_t: float | None = None
        self._steps: list[_Step] = []
        self._gpu_util: dict[int, float | None] = {}
        self._warning: str | None = None
        self._stalled: str | None = None

    # --- input -------------------------------------------------------------------------------------
    def begin_stage(self, stage: str) -> None:
        """A stage's processes were just launched: only `train` is watched, from now on."""
        self._watching = stage == "train"
        self._stage_started_at = self.clock()
        self._stage_step = None
        self._phase, self._phase_words, self._phase_t = "starting", "", self._stage_started_at

    def _this_stage(self, t: float) -> bool:
        return self._stage_started_at is not None and t >= self._stage_started_at

    def observe(self, events: Iterable[Mapping[str, Any]]) -> None:
        """Fold new record events (in time order): rank 0's phases, steps and other events, the GPUs'
        utilization and how busy the run's processes are."""
        for e in events:
            kind, rank0 = e.get("kind"), e.get("rank", 0) == 0
            if e.get("rank") == 0 and self._this_stage(e["t"]):  # a trainer's event: progress
                self._event_t = e["t"]
            if kind in ("phase", "trainer_end") and self._stage_started_at and not self._this_stage(e["t"]):
                continue  # an earlier attempt's (a resume reads the record from its start)
            if kind == "phase" and rank0:
                self._phase, self._phase_t = e["phase"], e["t"]
                self._phase_words = str(e.get("message") or "")
            elif kind == "launch" and e.get("stage") == "train":
                self._phase, self._phase_words, self._phase_t = "starting", "", e["t"]
            elif kind == "train_begin" and rank0:
                self._train_started_t = e["t"]
                start = e.get("start_step", 0)  # a resume repeats the steps after its checkpoint
                self._steps = [s for s in self._steps if s.step <= start]
            elif kind == "step" and rank0:
                self._steps.append(_Step(e["t"], e["step"], e.get("step_time_s")))
                if self._this_stage(e["t"]):
                    self._stage_step = e["step"]
            elif kind == "trainer_end" and rank0:
                self._phase = "done"
            elif kind == "telemetry":
                if "gpu_util_pct" in e:
                    self._gpu_util = dict(enumerate(e["gpu_util_pct"]))
                if (e.get("run_cpu_pct") or 0) >= BUSY_CPU_PCT:
                    self._busy_t = e["t"]

    # --- answers -----------------------------------------------------------------------------------
    @property
    def warning(self) -> str | None:
        """The message while a stall is suspected (and not yet final), else None."""
        return self._warning

    @property
    def stalled(self) -> str | None:
        """The message once the stage is judged stalled (final), else None."""
        return self._stalled

    @property
    def stage_step(self) -> int | None:
        """This attempt's latest step; None before its first."""
        return self._stage_step

    @property
    def gpus_idle(self) -> bool | None:
        """From the sampler's latest GPU samples: all idle, some busy, or unknown (no GPUs)."""
        utils = [u for u in self._gpu_util.values() if u is not None]
        if not utils:
            return None
        return max(utils) < GPU_IDLE_PCT

    def median_step_time(self) -> float | None:
        """Median seconds per step over the last `MEDIAN_WINDOW` steps."""
        times = [s.step_time_s for s in self._steps[-MEDIAN_WINDOW:] if s.step_time_s]
        return statistics.median(times) if times else None

    def check(self) -> StallChange | None:
        """Judge now (`diagnosis.setup_stall_verdict` before the attempt's first step, then
        `diagnosis.stall_verdict`); returns what changed since the last check."""
        if not self._watching or self._phase == "done" or self._stalled is not None:
            return None
        if self._stage_step is None:
            return self._change(*self._setup_verdict())
        if self._phase != "train":
            return None
        marks = [
            self._stage_started_at,
            self._phase_t,
            self._train_started_t,
            self._steps[-1].t if self._steps else None,
        ]
        last = max(t for t in marks if t is not None)
        training = self._train_started_t is not None and self._train_started_t >= (
            self._stage_started_at or 0
        )
        median = self.median_step_time() if training else None
        return self._change(*stall_verdict(self.clock() - last, median, self.timeout_s, self.gpus_idle))

    def _setup_verdict(self) -> tuple[str, str]:
        """Before the attempt's first step: how long since rank 0's last event, and since any progress."""
        events = [self._stage_started_at, self._phase_t, self._event_t]
        last_event = max(t for t in events if t is not None)
        last_progress = max(last_event, self._busy_t or 0.0)
        now = self.clock()
        return setup_stall_verdict(
            self._phase,
            self._phase_words,
            quiet_s=now - last_progress,
            silent_s=now - last_event,
            limits=(self.setup_limits.quiet_s, self.setup_limits.ceiling_s),
            timeout_s=self.timeout_s,
            resumed=self.resumed,
        )

    def _change(self, verdict: str, message: str) -> StallChange | None:
        if verdict == "ok" and self._warning is not None:
            self._warning = None
            return StallChange("cleared")
        if verdict == "suspect" and self._warning is None:
            self._warning = message
            return StallChange("suspected", message)
        if verdict == "stalled":
            self._stalled = message
            return StallChange("stalled", message)
        return None
