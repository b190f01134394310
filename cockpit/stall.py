"""Stall detection: no training step for too long, judged against the run's own pace.

The supervisor feeds a `StallDetector` the run's events as they arrive and asks it at every poll
what changed. The clock is injected: tests drive it without waiting.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from cockpit.diagnosis import stall_verdict

MEDIAN_WINDOW = 50  # steps the median step time is taken over (as the viewers' ETA)
GPU_IDLE_PCT = 5.0  # every GPU below this utilization: idle


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
    """Watches one training stage for steps that stop coming.

    The idle clock starts at the stage's launch, its entry into the training phase (loading can take
    longer than the timeout), its training's start or its last step, whichever is latest. Steps are
    due, and the run's median step time counts, only once this attempt's training has begun: a resumed
    run's old steps say nothing about the new attempt.
    """

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.time) -> None:
        self.timeout_s = timeout_s
        self.clock = clock
        self._watching = False
        self._stage_started_at: float | None = None
        self._phase = "starting"
        self._phase_t: float | None = None
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

    def observe(self, events: Iterable[Mapping[str, Any]]) -> None:
        """Fold new record events (in time order): rank 0's phases and steps, the GPUs' utilization."""
        for e in events:
            kind, rank0 = e.get("kind"), e.get("rank", 0) == 0
            if kind == "phase" and rank0:
                self._phase, self._phase_t = e["phase"], e["t"]
            elif kind == "launch" and e.get("stage") == "train":
                self._phase, self._phase_t = "starting", e["t"]
            elif kind == "train_begin" and rank0:
                self._train_started_t = e["t"]
                start = e.get("start_step", 0)  # a resume repeats the steps after its checkpoint
                self._steps = [s for s in self._steps if s.step <= start]
            elif kind == "step" and rank0:
                self._steps.append(_Step(e["t"], e["step"], e.get("step_time_s")))
            elif kind == "trainer_end" and rank0:
                self._phase = "done"
            elif kind == "telemetry" and "gpu_util_pct" in e:
                self._gpu_util = dict(enumerate(e["gpu_util_pct"]))

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
        """Judge now (see `diagnosis.stall_verdict`); returns what changed since the last check."""
        if not self._watching or self._phase != "train" or self._stalled is not None:
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
        verdict, message = stall_verdict(self.clock() - last, median, self.timeout_s, self.gpus_idle)
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
