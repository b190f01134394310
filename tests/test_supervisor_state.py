"""The supervisor's judgement over a record, without processes: stall clock, attempts, warnings."""

from __future__ import annotations

from pathlib import Path

import pytest

from cockpit.profiles import load_profile
from cockpit.record.view import RunView
from cockpit.runs import create_run
from cockpit.supervisor import Supervisor


def event(kind: str, t: float, **fields) -> dict:
    return {"kind": kind, "t": t, **fields}


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    profile, path = load_profile("tiny-cpu")
    return create_run(tmp_path, profile, path, ["cockpit", "run"])


def test_a_load_longer_than_the_stall_timeout_is_not_a_stall(run_dir: Path) -> None:
    clock = Clock(1000.0)
    supervisor = Supervisor(run_dir, clock=clock)
    timeout = supervisor.profile.training.stall_timeout_s
    supervisor.stall.begin_stage("train")
    clock.now += 3 * timeout  # setup and load took three timeouts
    supervisor.stall.observe([event("phase", clock.now - 5, phase="train", rank=0)])
    assert supervisor.stall.check() is None
    clock.now += timeout + 10  # then nothing at all for longer than the timeout
    change = supervisor.stall.check()
    assert change is not None and change.kind == "stalled" and "no step" in change.message


def test_a_resumed_attempt_starts_with_a_fresh_phase_and_outcome() -> None:
    view = RunView()
    view.apply(
        [
            event("phase", 1.0, phase="train", rank=0),
            event("trainer_end", 2.0, outcome="stopped", rank=0),
            event("launch", 3.0, stage="train"),
        ]
    )
    assert view.phase == "starting" and view.trainer_outcome is None and view.phase_t == 3.0
