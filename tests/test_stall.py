"""The stall detector on its own: events in, a fake clock, no processes and no waiting."""

from __future__ import annotations

from typing import Any

from cockpit.service.diagnosis import EndFacts, diagnose
from cockpit.service.stall import BUSY_CPU_PCT, SetupLimits, StallChange, StallDetector

TIMEOUT = 60.0
SETUP = SetupLimits.for_timeout(TIMEOUT)


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
    assert change.message == (
        "no step for 61 s (122x the median step time of 0.50 s); stopped after 60 s; "
        "if a step can take this long here, raise training.stall_timeout_s (now 60 s)"
    )
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
    for _ in range(10):  # a layer every 2 timeouts: progress
        stall.observe([ev("load_progress", clock.advance(2 * TIMEOUT), layer=1, layers=10, rank=0)])
        assert stall.check() is None
    stall.observe([ev("phase", clock.advance(5 * TIMEOUT), phase="train", rank=0)])
    clock.advance(SETUP.quiet_s - 1)
    assert stall.check().kind == "suspected", "before the first step, the setup's own limit"
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
    clock.advance(2 * TIMEOUT)
    assert stall.check() is None, (
        "the old steps' pace says nothing: before its first step, the setup's limits"
    )
    clock.advance(SETUP.quiet_s - 2 * TIMEOUT + 1)
    assert stall.check().message.startswith(
        "no progress for 601 s in phase train (building the DeepSpeed engine),"
    )


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


def _setup(clock: Clock, phase: str, message: str = "", resumed: bool = False) -> StallDetector:
    """A detector whose training stage is in `phase`, before its first step."""
    stall = StallDetector(TIMEOUT, clock=clock, resumed=resumed)
    stall.begin_stage("train")
    stall.observe([ev("launch", clock(), stage="train")])
    stall.observe([ev("phase", clock.advance(1), phase=phase, message=message, rank=0)])
    return stall


def busy(clock: Clock, stall: StallDetector, seconds: float, cpu_pct: float, every: float = 1.0) -> None:
    """`seconds` of the sampler's one-a-second samples, the run's processes at `cpu_pct`, checked each."""
    for _ in range(int(seconds / every)):
        stall.observe([ev("telemetry", clock.advance(every), run_cpu_pct=cpu_pct)])
        change = stall.check()
        assert change is None or change.kind != "stalled", change


def test_an_op_compiled_while_the_engine_is_built_is_not_a_stall() -> None:
    """The issue's first run: DeepSpeed compiled its CPU Adam for minutes inside "building the DeepSpeed
    engine" (phase train, no step yet), its compiler busy, and was killed at the profile's timeout."""
    clock = Clock()
    stall = _setup(clock, "train", "building the DeepSpeed engine")
    busy(clock, stall, 5 * TIMEOUT, cpu_pct=60.0)  # well past the timeout: the processes work
    assert stall.stalled is None and stall.warning is None
    busy(clock, stall, SETUP.quiet_s - 10, cpu_pct=1.0)  # then idle, but not yet for the setup's limit
    assert stall.stalled is None


def test_busy_processes_without_events_are_stopped_at_the_ceiling() -> None:
    clock = Clock()
    stall = _setup(clock, "load", "loading the model")
    for _ in range(int(SETUP.ceiling_s // 10)):
        stall.observe([ev("telemetry", clock.advance(10), run_cpu_pct=100.0)])
        assert stall.check() is None
    clock.advance(20)
    change = stall.check()
    assert change.kind == "stalled" and "no event from rank 0 for" in change.message
    assert "in phase load (loading the model), before the first step, its processes busy" in change.message


def test_setup_without_progress_is_a_stall_that_names_the_phase_and_what_to_do() -> None:
    clock = Clock()
    stall = _setup(clock, "setup", "reading and tokenizing the training data")
    busy(clock, stall, SETUP.quiet_s / 2 + 2, cpu_pct=BUSY_CPU_PCT / 4)  # a wait: processes idle
    assert stall.warning is not None and "in phase setup (reading and tokenizing" in stall.warning
    clock.advance(SETUP.quiet_s / 2 - 1)
    change = stall.check()
    assert change.kind == "stalled"
    assert change.message.startswith(
        "no progress for 601 s in phase setup (reading and tokenizing the training data), before the first "
        "step (no event, processes idle); stopped after 600 s;"
    )
    assert change.message.endswith("raise training.stall_timeout_s (now 60 s)")
    assert stall.stage_step is None


def test_a_stall_in_the_build_phase_points_at_the_doctor() -> None:
    clock = Clock()
    words = "compiling DeepSpeed's cpu_adam op (not built in this environment yet); 2 to 6 min on two cores"
    stall = _setup(clock, "build", words)
    clock.advance(SETUP.quiet_s + 1)
    message = stall.check().message
    assert "in phase build (compiling DeepSpeed's cpu_adam op (not built in this environment yet))" in message
    assert "`cockpit doctor --prebuild`" in message and "training.stall_timeout_s" in message


def test_a_stall_in_a_resumes_setup_names_no_step_of_the_attempt_before() -> None:
    """Issue 27, item 25: the first attempt stopped at step 10; its resume stalls while it tokenizes."""
    clock = Clock()
    stall = training(clock, steps=10)
    stall.observe([ev("trainer_end", clock.advance(1), outcome="stopped", rank=0)])
    resumed = StallDetector(TIMEOUT, clock=clock, resumed=True)  # the resume's supervisor reads it all
    clock.advance(600)
    resumed.begin_stage("train")
    old = [ev("phase", clock() - 700, phase="train", rank=0), ev("step", clock() - 650, step=10, rank=0)]
    resumed.observe([*old, ev("launch", clock(), stage="train")])
    resumed.observe([ev("phase", clock.advance(1), phase="setup", message="reading the data", rank=0)])
    clock.advance(SETUP.quiet_s + 1)
    change = resumed.check()
    assert (
        change.kind == "stalled"
        and "phase setup (reading the data), before the resumed run's" in change.message
    )
    assert resumed.stage_step is None
    status, line = diagnose(
        EndFacts(-15, "", stalled=True, stall_detail=change.message, last_step=10, stall_step=None)
    )
    assert status == "stalled" and line.startswith("stalled: no progress for") and "step 10" not in line
