"""The stall detector on its own: events in, a fake clock, no processes and no waiting."""

from __future__ import annotations

from typing import Any

from cockpit.stall import StallChange, StallDetector

TIMEOUT = 60.0


class Clock:
    """A wall clock that only moves when told to."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def ev(kind: str, t: float, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "t": t, **fields}


def training(clock: Clock, steps: int = 10, step_time_s: float = 0.5) -> StallDetector:
    """A detector whose training stage has begun and made `steps` steps, the last one now."""
    stall = StallDetector(TIMEOUT, clock=clock)
    stall.begin_stage("train")
    stall.observe(
        [ev("launch", clock(), stage="train"), ev("phase", clock.advance(1), phase="train", rank=0)]
    )
    stall.observe([ev("train_begin", clock.advance(1), start_step=0, rank=0)])
    for n in range(1, steps + 1):
        stall.observe([ev("step", clock.advance(step_time_s), step=n, step_time_s=step_time_s, rank=0)])
    return stall


def test_no_step_for_longer_than_the_timeout_is_a_stall_said_once() -> None:
    clock = Clock()
    stall = training(clock)
    clock.advance(TIMEOUT / 2 - 1)  # 29 s: 58 median steps, but not yet the suspicion's 30 s
    assert stall.check() is None and stall.stalled is None
    clock.advance(TIMEOUT / 2 + 2)
    change = stall.check()
    assert change == StallChange("stalled", stall.stalled)
    assert change.message == "no step for 61 s (122x the median step time of 0.50 s); stopped after 60 s"
    clock.advance(100)
    assert stall.check() is None, "said once"


def test_a_suspected_stall_is_said_then_cleared_when_steps_come_again() -> None:
    clock = Clock()
    stall = training(clock)
    clock.advance(31)
    change = stall.check()
    assert change is not None and change.kind == "suspected"
    assert "62x the median step time of 0.50 s" in change.message and "stop at 60 s" in change.message
    assert stall.warning == change.message and stall.stalled is None
    clock.advance(1)
    assert stall.check() is None, "still suspected: said once"
    stall.observe([ev("step", clock.advance(0.5), step=11, step_time_s=0.5, rank=0)])
    assert stall.check() == StallChange("cleared") and stall.warning is None
    assert stall.check() is None


def test_busy_gpus_are_never_suspected_but_the_timeout_still_holds() -> None:
    clock = Clock()
    stall = training(clock)
    stall.observe([ev("telemetry", clock(), gpu_util_pct=[97.0, None])])
    assert stall.gpus_idle is False
    clock.advance(40)
    assert stall.check() is None
    clock.advance(21)
    change = stall.check()
    assert change is not None and change.kind == "stalled" and "GPUs busy" in change.message


def test_a_load_longer_than_the_timeout_is_not_a_stall() -> None:
    clock = Clock()
    stall = StallDetector(TIMEOUT, clock=clock)
    stall.begin_stage("train")
    stall.observe([ev("phase", clock.advance(3 * TIMEOUT), phase="load", rank=0)])
    assert stall.check() is None, "loading is not watched"
    stall.observe([ev("phase", clock.advance(5 * TIMEOUT), phase="train", rank=0)])
    clock.advance(TIMEOUT - 1)
    assert stall.check() is None, "the clock starts at the training phase"
    clock.advance(2)
    assert stall.check().kind == "stalled"


def test_a_resumed_attempt_is_judged_by_its_own_steps() -> None:
    clock = Clock()
    stall = training(clock, steps=10, step_time_s=0.5)  # the first attempt, then a resume much later
    clock.advance(3600)
    stall.begin_stage("train")
    stall.observe(
        [ev("launch", clock(), stage="train"), ev("phase", clock.advance(1), phase="train", rank=0)]
    )
    clock.advance(31)
    assert stall.check() is None, "no median before this attempt's training begins: the timeout alone"
    clock.advance(30)
    assert stall.check().message == "no step for 61 s; stopped after 60 s"


def test_a_resume_drops_the_steps_after_its_checkpoint() -> None:
    clock = Clock()
    stall = training(clock, steps=10, step_time_s=0.5)
    stall.observe([ev("train_begin", clock.advance(1), start_step=4, rank=0)])
    assert stall.median_step_time() == 0.5
    for n in range(5, 11):
        stall.observe([ev("step", clock.advance(2.0), step=n, step_time_s=2.0, rank=0)])
    assert stall.median_step_time() == 2.0, "4 old steps at 0.5 s, 6 new ones at 2 s"


def test_only_the_training_phase_of_a_training_stage_is_watched() -> None:
    clock = Clock()
    stall = StallDetector(TIMEOUT, clock=clock)
    stall.observe([ev("phase", clock(), phase="train", rank=0)])
    clock.advance(10 * TIMEOUT)
    assert stall.check() is None, "nothing launched yet"
    stall.begin_stage("eval")
    clock.advance(10 * TIMEOUT)
    assert stall.check() is None, "evaluation is not a training stage"
    stall = training(clock)
    stall.observe([ev("trainer_end", clock(), outcome="finished", rank=0)])
    clock.advance(10 * TIMEOUT)
    assert stall.check() is None, "training is over"


def test_other_ranks_do_not_move_the_clock() -> None:
    clock = Clock()
    stall = training(clock)
    stall.observe([ev("step", clock.advance(50), step=11, step_time_s=0.5, rank=1)])
    clock.advance(11)
    assert stall.check().kind == "stalled"


def test_gpus_idle_comes_from_the_latest_telemetry_sample() -> None:
    stall = StallDetector(TIMEOUT, clock=Clock())
    assert stall.gpus_idle is None, "no GPUs seen: unknown"
    stall.observe([ev("telemetry", 1.0, gpu_util_pct=[0.0, 3.0])])
    assert stall.gpus_idle is True
    stall.observe([ev("telemetry", 2.0, gpu_util_pct=[None, None])])
    assert stall.gpus_idle is None
