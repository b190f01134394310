"""The supervisor's judgement over a record, without processes: stall clock, attempts, warnings."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cockpit.profiles import load_profile
from cockpit.record.view import RunView
from cockpit.runs import create_run
from cockpit.supervisor import Supervisor


def event(kind: str, t: float, **fields) -> dict:
    return {"kind": kind, "t": t, **fields}


@pytest.fixture
def supervisor(tmp_path: Path) -> Supervisor:
    profile, path = load_profile("tiny-cpu")
    run_dir = create_run(tmp_path, profile, path, ["cockpit", "run"])
    sup = Supervisor(run_dir)
    sup.stage = "train"
    return sup


def test_a_load_longer_than_the_stall_timeout_is_not_a_stall(supervisor: Supervisor) -> None:
    timeout = supervisor.profile.training.stall_timeout_s
    now = time.time()
    supervisor.stage_started_at = now - 3 * timeout  # setup and load took three timeouts
    supervisor.view.apply([event("phase", now - 5, phase="train", rank=0)])
    supervisor._check_stall(now)
    assert not supervisor.stall_detail
    supervisor._check_stall(now + timeout + 10)  # then nothing at all for longer than the timeout
    assert "no step" in supervisor.stall_detail


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
