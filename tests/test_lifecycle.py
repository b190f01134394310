"""The run's lifecycle service: start, stop, kill, resume, evaluate, a lost supervisor.

The supervisor is not started here (its spawn is recorded instead); processes that must be alive
are real ones blocked on their standard input, ended by closing it or by the kill under test.
"""

from __future__ import annotations

import ast
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from cockpit import cli
from cockpit.profiles import ProfileError
from cockpit.record import EventWriter, RunPaths, load_manifest
from cockpit.record.manifest import update_manifest
from cockpit.service import lifecycle, liveness
from cockpit.service.lifecycle import LifecycleError, StopOutcome

BLOCK = [sys.executable, "-c", "import sys; sys.stdin.read()"]


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, dict[str, Any]]]:
    """Every supervisor the lifecycle starts: (run directory, how), none of them for real."""
    calls: list[tuple[Path, dict[str, Any]]] = []

    def spawn_detached(run_dir: Path, **how: Any) -> None:
        calls.append((Path(run_dir), how))

    import cockpit.service.spawn

    monkeypatch.setattr(cockpit.service.spawn, "spawn_detached", spawn_detached)
    return calls


@pytest.fixture
def run_dir(tmp_path: Path, spawned: list) -> Path:
    """A planned run of the tiny profile."""
    run_dir = lifecycle.start(tmp_path, "tiny-cpu", [], ["cockpit", "run"]).run_dir
    spawned.clear()
    return run_dir


@pytest.fixture
def blocked() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes started by a test, each in its own session, released at the end."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.stdin.close()
        proc.wait(timeout=30)


def start_blocked(procs: list, *args: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([*BLOCK, *args], stdin=subprocess.PIPE, start_new_session=True)
    procs.append(proc)
    return proc


def ended(run_dir: Path, **fields: Any) -> None:
    update_manifest(run_dir, **{"status": "stopped", "exit_code": 1, "ended_at": 1.0, **fields})


# --- start -------------------------------------------------------------------------------------------
def test_start_creates_a_planned_record_and_starts_its_supervisor(tmp_path: Path, spawned: list) -> None:
    launch = lifecycle.start(tmp_path, "tiny-cpu", ["training.max_steps=3"], ["cockpit", "run"])
    manifest = load_manifest(launch.run_dir)
    assert manifest["status"] == "planned" and manifest["mode"] == "train"
    assert manifest["profile"]["training"]["max_steps"] == 3
    assert spawned == [(launch.run_dir, {})]
    assert not launch.running(), "no supervisor process here"


def test_a_bad_profile_starts_nothing(tmp_path: Path, spawned: list) -> None:
    with pytest.raises(ProfileError, match="learning_rate"):
        lifecycle.start(tmp_path, "tiny-cpu", ["training.learning_rate=-1"], ["cockpit", "run"])
    assert spawned == [] and not any(tmp_path.iterdir())


def test_an_evaluation_only_run_goes_through_a_supervisor(
    tmp_path: Path, spawned: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    launch = lifecycle.start_eval(tmp_path / "runs", "tiny-cpu", [("seed1", Path("m1"))], ["cockpit"])
    manifest = load_manifest(launch.run_dir)
    assert manifest["mode"] == "eval" and manifest["status"] == "planned"
    assert manifest["eval_args"] == ["--model", f"seed1={tmp_path / 'm1'}"], "paths made absolute"
    assert spawned == [(launch.run_dir, {})]


# --- resume, evaluate --------------------------------------------------------------------------------
def test_only_an_ended_run_is_resumed_or_evaluated(run_dir: Path, spawned: list) -> None:
    with pytest.raises(LifecycleError, match=r"is planned; only an ended run can be resumed$"):
        lifecycle.resume(run_dir)
    with pytest.raises(LifecycleError, match=r"is planned: evaluate it once it has ended$"):
        lifecycle.evaluate(run_dir)
    assert spawned == []


def checkpoint(run_dir: Path, step: int, complete: bool = True) -> Path:
    """A checkpoint folder as the Trainer leaves it (`trainer_state.json` written last)."""
    path = RunPaths(run_dir).checkpoints / f"checkpoint-{step}"
    path.mkdir(parents=True)
    if complete:
        (path / "trainer_state.json").write_text("{}")
    return path


def test_resume_starts_a_new_attempt_without_the_last_ones_requests(run_dir: Path, spawned: list) -> None:
    ended(run_dir, diagnosis="stopped by user at step 5", training={"status": "stopped"})
    checkpoint(run_dir, 5)
    lifecycle.request_stop(run_dir)
    launch = lifecycle.resume(run_dir)
    manifest = load_manifest(run_dir)
    assert manifest["status"] == "planned" and manifest["diagnosis"] is None and manifest["ended_at"] is None
    assert manifest["training"] is None and manifest["evaluation"] is None
    assert not RunPaths(run_dir).stop_request.exists(), "the last attempt's stop must not stop this one"
    assert spawned == [(run_dir, {"resume": True})] and launch.run_dir == run_dir
    assert launch.checkpoint == str(RunPaths(run_dir).checkpoints / "checkpoint-5") and launch.changes == ()


def test_resume_without_a_checkpoint_is_refused_unless_from_scratch(run_dir: Path, spawned: list) -> None:
    ended(run_dir)
    checkpoint(run_dir, 10, complete=False)  # cut short while saving: not one to resume from
    with pytest.raises(LifecycleError, match=r"has no complete checkpoint .* --from-scratch` starts it over"):
        lifecycle.resume(run_dir)
    assert spawned == [] and load_manifest(run_dir)["status"] == "stopped", "nothing changed"
    launch = lifecycle.resume(run_dir, from_scratch=True)
    assert launch.checkpoint is None and spawned == [(run_dir, {})], "a new start, not --resume"
    assert load_manifest(run_dir)["status"] == "planned"


def test_from_scratch_is_refused_when_there_is_a_checkpoint(run_dir: Path, spawned: list) -> None:
    ended(run_dir)
    checkpoint(run_dir, 5)
    with pytest.raises(LifecycleError, match=r"has a checkpoint \(checkpoint-5\)"):
        lifecycle.resume(run_dir, from_scratch=True)
    assert spawned == []


def test_a_finished_run_is_resumed_only_to_extend_its_schedule(run_dir: Path, spawned: list) -> None:
    ended(run_dir, status="finished", exit_code=0)
    checkpoint(run_dir, 400)
    with pytest.raises(LifecycleError, match=r"finished its schedule; nothing to resume: extend it"):
        lifecycle.resume(run_dir)
    with pytest.raises(LifecycleError, match=r"finished its schedule"):
        lifecycle.resume(run_dir, ["training.learning_rate=0.001"])  # not the schedule
    assert spawned == []
    launch = lifecycle.resume(run_dir, ["training.max_steps=800"])
    assert launch.changes == ("training.max_steps: -1 -> 800",)
    assert load_manifest(run_dir)["profile"]["training"]["max_steps"] == 800
    assert spawned == [(run_dir, {"resume": True})]


def test_resume_overrides_are_validated_before_anything_changes(run_dir: Path, spawned: list) -> None:
    ended(run_dir)
    checkpoint(run_dir, 5)
    with pytest.raises(ProfileError, match="max_steps"):
        lifecycle.resume(run_dir, ["training.max_steps=-7"])
    assert spawned == [] and load_manifest(run_dir)["status"] == "stopped"


def test_cli_resume_says_where_from_and_what_changed(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = str(run_dir.parent)
    ended(run_dir)
    assert cli.main(["resume", run_dir.name, "--runs-dir", runs, "--detach"]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "has no complete checkpoint" in err and "Traceback" not in err
    assert cli.main(["resume", run_dir.name, "--runs-dir", runs, "--detach", "--from-scratch"]) == 0
    assert "started over from step 0" in capsys.readouterr().err
    ended(run_dir)
    checkpoint(run_dir, 5)
    args = ["resume", run_dir.name, "--runs-dir", runs, "--detach", "--set", "training.max_steps=9"]
    assert cli.main(args) == 0
    err = capsys.readouterr().err
    assert "resumed from checkpoint-5" in err and "changed training.max_steps: -1 -> 9" in err


def test_evaluating_an_ended_run_keeps_its_training_outcome_aside(
    run_dir: Path, spawned: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ended(run_dir, diagnosis="stopped by user at step 5, checkpoint saved")
    monkeypatch.chdir(tmp_path)
    lifecycle.evaluate(run_dir, [("other", Path("m"))])
    manifest = load_manifest(run_dir)
    assert manifest["status"] == "planned" and manifest["diagnosis"] is None
    assert manifest["training"] == {
        "status": "stopped",
        "diagnosis": "stopped by user at step 5, checkpoint saved",
        "exit_code": 1,
    }
    assert spawned == [(run_dir, {"eval_models": [f"other={tmp_path / 'm'}"]})]


def test_evaluating_again_keeps_the_training_outcome_the_supervisor_wrote(
    run_dir: Path, spawned: list
) -> None:
    training = {"status": "finished", "diagnosis": "finished at step 3", "exit_code": 0}
    ended(run_dir, status="finished", diagnosis="finished at step 3; mean F1 80.0", training=training)
    lifecycle.evaluate(run_dir)
    assert load_manifest(run_dir)["training"] == training, "not the diagnosis with the last evaluation"
    assert spawned == [(run_dir, {"eval_models": []})]


def test_last_evaluation(run_dir: Path) -> None:
    assert lifecycle.last_evaluation(run_dir) is None
    update_manifest(
        run_dir, evaluation={"status": "failed", "summary": "evaluation failed (exit 3)", "exit_code": 3}
    )
    evaluation = lifecycle.last_evaluation(run_dir)
    assert evaluation is not None and evaluation.status == "failed" and evaluation.exit_code == 3


# --- stop --------------------------------------------------------------------------------------------
def test_stop_refuses_a_run_that_has_ended(run_dir: Path) -> None:
    ended(run_dir, status="finished")
    with pytest.raises(LifecycleError, match=r"is not running \(status finished\)"):
        lifecycle.stop(run_dir)


def test_stop_asks_the_supervisor_then_a_second_stop_kills(run_dir: Path, blocked: list) -> None:
    supervisor = start_blocked(
        blocked, "cockpit.service.supervisor", str(run_dir)
    )  # looks like its supervisor
    update_manifest(run_dir, status="running", supervisor_pid=supervisor.pid)
    paths = RunPaths(run_dir)
    assert lifecycle.stop(run_dir) is StopOutcome.STOP_REQUESTED
    assert paths.stop_request.exists() and not paths.kill_request.exists()
    assert lifecycle.stop(run_dir) is StopOutcome.KILL_REQUESTED
    assert paths.kill_request.exists()
    assert supervisor.poll() is None, "the supervisor does the killing, not the service"


def test_kill_at_once(run_dir: Path) -> None:
    assert lifecycle.stop(run_dir, kill=True) is StopOutcome.KILL_REQUESTED, "a planned run too"
    assert RunPaths(run_dir).kill_request.exists() and not RunPaths(run_dir).stop_request.exists()


def test_with_the_supervisor_lost_the_trainer_is_asked_then_its_group_killed(
    run_dir: Path, blocked: list
) -> None:
    trainer = start_blocked(blocked, "--run-dir", str(run_dir))  # its command line names the run
    update_manifest(run_dir, status="running", supervisor_pid=None, trainer_pgid=trainer.pid)
    assert lifecycle.reconcile(run_dir).startswith("supervisor lost: training processes still running")
    assert lifecycle.stop(run_dir) is StopOutcome.TRAINER_STOP_REQUESTED
    assert RunPaths(run_dir).stop_request.exists() and trainer.poll() is None
    assert lifecycle.stop(run_dir) is StopOutcome.TRAINER_KILLED
    assert trainer.wait(timeout=30) == -signal.SIGKILL


def test_stop_kill_never_signals_a_process_group_that_is_not_the_runs(
    run_dir: Path, blocked: list, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stale record (a reboot, a reused group id): the group it names holds an unrelated process."""
    stranger = start_blocked(blocked)  # its own process group; nothing in it names this run
    update_manifest(
        run_dir, status="running", supervisor_pid=None, supervisor_started_at=time.time() - 60,
        trainer_pgid=stranger.pid,
    )  # fmt: skip
    runs = str(run_dir.parent)
    assert cli.main(["stop", "--kill", run_dir.name, "--runs-dir", runs]) == cli.EXIT_BAD_INPUT
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"{run_dir.name} is not running (status failed)" in line
    assert f"process group {stranger.pid}" in line and "not signalled" in line
    assert stranger.poll() is None, "an unrelated process group was signalled"
    assert load_manifest(run_dir)["status"] == "failed"


def test_a_group_of_the_run_that_started_before_its_supervisor_is_not_taken_for_its_trainer(
    run_dir: Path, blocked: list
) -> None:
    """The run directory named on a command line is not enough: the trainer starts after the supervisor."""
    older = start_blocked(blocked, "--run-dir", str(run_dir))
    update_manifest(
        run_dir, status="running", supervisor_pid=None, trainer_pgid=older.pid,
        supervisor_started_at=psutil.Process(older.pid).create_time() + 3600,
    )  # fmt: skip
    with pytest.raises(LifecycleError, match="not signalled"):
        lifecycle.stop(run_dir, kill=True)
    assert older.poll() is None


def test_a_supervisor_is_known_by_its_pid_and_its_start_time(
    run_dir: Path, blocked: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live process whose command line looks like the run's supervisor, but which started at another
    time than run.json says (a reused PID), is not the supervisor; the one that did start then is. Where
    /proc gives no boot-relative start (another OS), the wall-clock start decides."""
    monkeypatch.setattr(liveness, "BOOT_ID", run_dir / "no-such-file")
    look_alike = start_blocked(blocked, "cockpit.service.supervisor", str(run_dir))
    assert liveness.boot_start(look_alike.pid) is None
    started = liveness.started_at(look_alike.pid)
    manifest = {"status": "running", "supervisor_pid": look_alike.pid}
    assert liveness.supervisor_alive({**manifest, "supervisor_started_at": started}, run_dir)
    assert not liveness.supervisor_alive({**manifest, "supervisor_started_at": started - 3600}, run_dir)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the boot-relative start is read from /proc")
def test_the_boot_relative_start_outweighs_the_wall_clock(run_dir: Path, blocked: list) -> None:
    """The wall clock moves (NTP, a suspended VM) and with it psutil's start times; the boot id and the
    ticks from boot do not. Recorded, they decide: the same process is alive whatever the wall-clock start
    says, and another start, or another boot, is not the supervisor."""
    look_alike = start_blocked(blocked, "cockpit.service.supervisor", str(run_dir))
    start = liveness.boot_start(look_alike.pid)
    assert start and start == liveness.boot_start(look_alike.pid)
    boot, ticks = start.rsplit(":", 1)
    moved = {"status": "running", "supervisor_pid": look_alike.pid,
             "supervisor_started_at": liveness.started_at(look_alike.pid) - 3600}  # fmt: skip
    assert liveness.supervisor_alive({**moved, "supervisor_boot_start": start}, run_dir)
    for other in (f"{boot}:{int(ticks) - 1}", f"another-boot:{ticks}"):
        now = {**moved, "supervisor_started_at": liveness.started_at(look_alike.pid)}
        assert not liveness.supervisor_alive({**now, "supervisor_boot_start": other}, run_dir), other
    for damaged in ("not a start", f"{boot}:\u00b2", f"{boot}:-{ticks}", 7):  # read as absent: the wall clock
        assert not liveness.supervisor_alive({**moved, "supervisor_boot_start": damaged}, run_dir), damaged


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the boot-relative start is read from /proc")
def test_a_trainer_is_the_runs_by_its_boot_relative_start(run_dir: Path, blocked: list) -> None:
    """The trainer's group is this run's when a member naming the run started at or after the supervisor
    by the ticks from boot, whatever the wall-clock starts say; not when it started before, or in another
    boot."""
    trainer = start_blocked(blocked, "--run-dir", str(run_dir))
    boot, ticks = liveness.boot_start(trainer.pid).rsplit(":", 1)
    base = {"status": "running", "trainer_pgid": trainer.pid,
            "supervisor_started_at": liveness.started_at(trainer.pid) + 3600}  # fmt: skip
    assert liveness.own_group({**base, "supervisor_boot_start": f"{boot}:{ticks}"}, run_dir).ours
    assert liveness.own_group({**base, "supervisor_boot_start": f"{boot}:{int(ticks) - 5}"}, run_dir).ours
    assert not liveness.own_group({**base, "supervisor_boot_start": f"{boot}:{int(ticks) + 1}"}, run_dir).ours
    assert not liveness.own_group({**base, "supervisor_boot_start": f"other:{int(ticks) - 5}"}, run_dir).ours


# --- a lost supervisor -------------------------------------------------------------------------------
def test_a_run_whose_processes_are_all_gone_is_marked_failed(run_dir: Path) -> None:
    assert lifecycle.reconcile(run_dir) is None, "planned: not the reconciler's business"
    update_manifest(run_dir, status="running", supervisor_pid=None, trainer_pgid=None)
    assert lifecycle.reconcile(run_dir) == lifecycle.LOST
    manifest = load_manifest(run_dir)
    assert manifest["status"] == "failed" and manifest["diagnosis"] == lifecycle.LOST and manifest["ended_at"]
    assert lifecycle.reconcile(run_dir) is None, "once"


def test_a_lost_evaluation_leaves_the_training_status(run_dir: Path) -> None:
    training = {"status": "finished", "diagnosis": "finished at step 3", "exit_code": 0}
    update_manifest(run_dir, status="running", supervisor_pid=None, training=training)
    lifecycle.reconcile(run_dir)
    manifest = load_manifest(run_dir)
    assert manifest["status"] == "finished" and manifest["exit_code"] == 0
    assert manifest["diagnosis"] == f"finished at step 3; {lifecycle.LOST}"
    assert manifest["evaluation"]["status"] == "failed"


# --- the CLI only asks -------------------------------------------------------------------------------
def test_the_cli_starts_and_signals_no_process_itself() -> None:
    sources = sorted(Path(cli.__file__).parent.glob("*.py"))  # the package: every command group
    assert len(sources) > 1
    nodes = [node for path in sources for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))]
    imported = {alias.name for node in nodes if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in nodes if isinstance(node, ast.ImportFrom) and node.module}
    assert not imported & {
        "os",
        "subprocess",
        "cockpit.service.supervisor",
        "cockpit.service.spawn",
        "cockpit.record.control",
        "cockpit.service.liveness",
    }
    called = {node.attr for node in nodes if isinstance(node, ast.Attribute)}
    assert not called & {"killpg", "Popen", "spawn_detached"}


def test_cli_refusals_are_bad_input(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = str(run_dir.parent)
    assert cli.main(["resume", run_dir.name, "--runs-dir", runs]) == cli.EXIT_BAD_INPUT
    assert f"{run_dir.name} is planned; only an ended run can be resumed" in capsys.readouterr().err
    ended(run_dir, status="finished")
    assert cli.main(["stop", run_dir.name, "--runs-dir", runs]) == cli.EXIT_BAD_INPUT
    assert "is not running (status finished)" in capsys.readouterr().err


# --- issue 27, item 25 ----------------------------------------------------------------------------------
def trainer_stopped_cleanly(run_dir: Path, step: int) -> None:
    """The record a trainer leaves when a stop it was asked for (its supervisor already lost) ends it:
    the supervisor's launch, its steps, the stop's checkpoint, and `trainer_end` stopped."""
    paths = RunPaths(run_dir)
    clock = iter(range(1, 100))
    with EventWriter(paths.events("supervisor"), clock=lambda: float(next(clock))) as sup:
        sup.write("launch", stage="train", argv=["deepspeed"], pid=1, world_size=1)
        with EventWriter(paths.events("trainer-rank0"), rank=0, clock=lambda: float(next(clock))) as w:
            w.write("train_begin", max_steps=400, start_step=0)
            for s in range(1, step + 1):
                w.write("step", step=s, max_steps=400, loss=2.0 / s)
            w.write("stop_ack", step=step)
            w.write("checkpoint", step=step, path=str(checkpoint(run_dir, step)))
            w.write("trainer_end", outcome="stopped", step=step)


def test_a_clean_stop_after_the_supervisor_was_lost_is_stopped_not_failed(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trainer_stopped_cleanly(run_dir, 5)
    lifecycle.request_stop(run_dir)  # `cockpit stop` with the supervisor lost: the trainer's own request
    update_manifest(run_dir, status="running", supervisor_pid=None, trainer_pgid=None)
    assert cli.main(["ls", "--format", "json", "--runs-dir", str(run_dir.parent)]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    expected = "stopped by user at step 5, checkpoint saved; the supervisor was lost before the evaluation"
    assert row["status"] == "stopped" and row["diagnosis"] == expected
    manifest = load_manifest(run_dir)
    assert manifest["status"] == "stopped" and manifest["diagnosis"] == expected and manifest["ended_at"]
    assert cli.main(["resume", run_dir.name, "--runs-dir", str(run_dir.parent), "--detach"]) == 0


def test_a_lost_trainer_that_said_stopped_without_its_checkpoint_failed(run_dir: Path) -> None:
    trainer_stopped_cleanly(run_dir, 5)
    (RunPaths(run_dir).checkpoints / "checkpoint-5" / "trainer_state.json").unlink()  # cut short
    update_manifest(run_dir, status="running", supervisor_pid=None, trainer_pgid=None)
    assert lifecycle.reconcile(run_dir) == lifecycle.LOST
    assert load_manifest(run_dir)["status"] == "failed"


def test_resume_is_refused_in_one_line_when_the_disk_lacks_room(
    run_dir: Path, spawned: list, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    from cockpit.service import disk_space

    ended(run_dir)
    (checkpoint(run_dir, 5) / "weights.bin").write_bytes(b"\0" * 2**20)
    need = disk_space.bytes_needed(run_dir, str(RunPaths(run_dir).checkpoints / "checkpoint-5"))
    assert need >= 2**20 + disk_space.RECORD_MARGIN_BYTES  # the checkpoint's own size counts
    usage = shutil.disk_usage(run_dir)
    monkeypatch.setattr(disk_space.shutil, "disk_usage", lambda _: usage._replace(free=need - 1))
    with pytest.raises(
        LifecycleError, match=r"free on the disk of .*, and resuming needs about .*: free some"
    ):
        lifecycle.resume(run_dir)
    assert spawned == [] and load_manifest(run_dir)["status"] == "stopped", "nothing changed"
    assert cli.main(["resume", run_dir.name, "--runs-dir", str(run_dir.parent), "--detach"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "resuming needs about" in err
    monkeypatch.setattr(disk_space.shutil, "disk_usage", lambda _: usage._replace(free=need))
    assert lifecycle.resume(run_dir).checkpoint is not None and len(spawned) == 1
