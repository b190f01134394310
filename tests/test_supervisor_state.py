"""The supervisor's judgement over a record, without processes: stall clock, attempts, warnings."""

from __future__ import annotations

from pathlib import Path

import pytest

from cockpit.profiles import load_profile
from cockpit.record.view import RunView
from cockpit.service.outcome import Evaluation, Outcome
from cockpit.service.runs import create_run
from cockpit.service.supervisor import Supervisor


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
    supervisor.runner.stall.begin_stage("train")
    clock.now += 3 * timeout  # setup and load took three timeouts
    supervisor.runner.stall.observe([event("phase", clock.now - 5, phase="train", rank=0)])
    assert supervisor.runner.stall.check() is None
    clock.now += timeout + 10  # then nothing for longer than the timeout: before the first step, the
    assert supervisor.runner.stall.check().kind == "suspected"  # setup's own limit (SetupLimits) holds
    clock.now += supervisor.runner.stall.setup_limits.quiet_s
    change = supervisor.runner.stall.check()
    assert change is not None and change.kind == "stalled" and "in phase train" in change.message


def test_a_stall_suspected_in_a_resumes_setup_names_no_step_of_the_attempt_before(run_dir: Path) -> None:
    """Issue 27, item 25: the resume's warning and notes are about its own attempt."""
    from cockpit.record import load_manifest, read_events

    clock = Clock(1000.0)
    supervisor = Supervisor(run_dir, resume=True, clock=clock)
    earlier = [event("step", 900.0 + n, step=n, rank=0) for n in range(1, 11)]
    supervisor.runner.view.apply(earlier)
    supervisor.runner.stall.begin_stage("train")
    supervisor.runner.stall.observe(
        [*earlier, event("phase", clock.now, phase="setup", message="tokenizing", rank=0)]
    )
    clock.now += supervisor.runner.stall.setup_limits.quiet_s / 2 + 1
    supervisor.runner._check_stall()
    warning = load_manifest(run_dir)["warning"]
    assert warning.startswith("stall suspected before the first step: no progress for")
    assert "phase setup (tokenizing), before the resumed run's first step" in warning
    supervisor.runner.stall.observe([event("phase", clock.now, phase="load", rank=0)])
    supervisor.runner._check_stall()
    supervisor.keeper.events.close()
    notes = [e["message"] for e in read_events(run_dir, "note")]
    assert notes[-1] == "progress again" and load_manifest(run_dir)["warning"] is None


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


def test_training_then_evaluation_keeps_both_outcomes(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    supervisor = Supervisor(run_dir)
    monkeypatch.setattr(supervisor, "train", lambda: ("finished", "finished at step 3", 0))
    monkeypatch.setattr(supervisor, "evaluate", lambda args: Evaluation("finished", "mean F1 80.0", 0))
    outcome = supervisor.attempt()
    assert outcome.status == "finished" and outcome.diagnosis == "finished at step 3; mean F1 80.0"
    assert outcome.fields["training"] == {
        "status": "finished",
        "diagnosis": "finished at step 3",
        "exit_code": 0,
    }
    assert outcome.fields["evaluation"] == {"status": "finished", "summary": "mean F1 80.0", "exit_code": 0}


def test_evaluating_an_ended_run_keeps_its_training_status(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cockpit.record.manifest import update_manifest

    training = {
        "status": "stopped",
        "diagnosis": "stopped by user at step 5, checkpoint saved",
        "exit_code": 0,
    }
    update_manifest(run_dir, training=training)
    supervisor = Supervisor(run_dir, eval_args=["--model", "other=/m"])
    asked: list[list[str]] = []

    def evaluate(args: list[str]) -> Evaluation:
        asked.append(args)
        return Evaluation("failed", "evaluation failed (exit 1: ValueError: x)", 1)

    monkeypatch.setattr(supervisor, "evaluate", evaluate)
    assert supervisor.attempt() == Outcome(
        "stopped",
        "stopped by user at step 5, checkpoint saved; evaluation failed (exit 1: ValueError: x)",
        0,
        {
            "evaluation": {
                "status": "failed",
                "summary": "evaluation failed (exit 1: ValueError: x)",
                "exit_code": 1,
            }
        },
    )
    assert asked == [["--model", "other=/m"]]


def test_children_wait_passively_unless_the_user_says_otherwise(monkeypatch) -> None:
    from cockpit.service.spawn import child_env

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert child_env()["OMP_WAIT_POLICY"] == "PASSIVE"
    assert child_env()["NCCL_NVLS_ENABLE"] == "0"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert child_env()["OMP_WAIT_POLICY"] == "ACTIVE"


def test_children_pin_host_memory_by_registering_it_unless_the_user_says_how(monkeypatch) -> None:
    """Registered pinned memory is added to the allocator's settings, beside the user's own; a user who
    says how to pin, or who uses torch's newer variable, keeps theirs."""
    from cockpit.service.spawn import PINNED_REGISTER, child_env

    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    assert child_env()["PYTORCH_CUDA_ALLOC_CONF"] == PINNED_REGISTER
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    assert child_env()["PYTORCH_CUDA_ALLOC_CONF"] == f"expandable_segments:True,{PINNED_REGISTER}"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "pinned_use_cuda_host_register:False")
    assert child_env()["PYTORCH_CUDA_ALLOC_CONF"] == "pinned_use_cuda_host_register:False"
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    env = child_env()
    assert env["PYTORCH_ALLOC_CONF"] == f"expandable_segments:True,{PINNED_REGISTER}"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env


def test_children_find_the_ninja_beside_their_interpreter_first(monkeypatch, tmp_path) -> None:
    """Whether or not the environment was activated, a run's op builds run the ninja installed beside the
    interpreter (two ninja versions make each other rebuild every op, `dsops.ninja_first`), through a
    folder holding only that ninja: no other tool (compiler, nvcc) changes."""
    import os
    import shutil
    import sys

    from cockpit.service.spawn import child_env

    monkeypatch.setenv("COCKPIT_CACHE", str(tmp_path / "cache"))
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "ninja").write_text("#!/bin/sh\necho 1.13.2\n")
    (venv / "ninja").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    monkeypatch.setenv("PATH", os.pathsep.join(["/usr/local/bin", "/usr/bin", "/bin"]))
    path = child_env()["PATH"].split(os.pathsep)
    assert path[1:] == ["/usr/local/bin", "/usr/bin", "/bin"]  # nothing else moved
    assert os.listdir(path[0]) == ["ninja"]
    found = shutil.which("ninja", path=os.pathsep.join(path))
    assert found is not None and os.path.realpath(found) == str(venv / "ninja")
    monkeypatch.setenv("PATH", child_env()["PATH"])
    assert child_env()["PATH"].split(os.pathsep) == path  # already first: unchanged
    (venv / "ninja").unlink()  # no ninja beside the interpreter: the PATH as it was
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert child_env()["PATH"] == "/usr/bin:/bin"
