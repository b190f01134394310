"""The CLI's way into the app: `run` without --no-ui, `attach`, `replay`."""

from __future__ import annotations

from pathlib import Path

import pytest
from tui_helpers import FIXTURE, copy_until

from cockpit import cli
from cockpit.cli import follow


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, bool, float]]:
    calls: list[tuple[Path, bool, float]] = []

    def fake_run_app(run_dir: Path, *, live: bool, speed: float = 1.0) -> str:
        calls.append((Path(run_dir), live, speed))
        return "detached"

    import cockpit.app.app

    monkeypatch.setattr(cockpit.app.app, "run_app", fake_run_app)
    monkeypatch.setattr(follow, "_has_terminal", lambda: True)  # the fake app's terminal (pytest has none)
    return calls


def test_replay_opens_the_app_on_the_record(opened: list, tmp_path: Path) -> None:
    run = copy_until(tmp_path)
    assert cli.main(["replay", str(run), "--speed", "8"]) == 0
    assert opened == [(run, False, 8.0)]


def test_replay_refuses_a_bad_speed_and_an_unknown_run(opened: list, tmp_path: Path) -> None:
    assert cli.main(["replay", str(FIXTURE), "--speed", "0"]) == cli.EXIT_BAD_INPUT
    assert cli.main(["replay", "nope", "--runs-dir", str(tmp_path)]) == cli.EXIT_BAD_INPUT
    assert opened == []


def test_attach_opens_the_app_live_and_says_the_run_goes_on(
    opened: list, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_until(tmp_path, until=0.0 + 1e12)  # the whole record, but its manifest says running
    assert cli.main(["attach", run.name, "--runs-dir", str(tmp_path)]) == 0
    assert opened == [(run, True, 1.0)]
    assert "goes on" in capsys.readouterr().err


def test_run_without_no_ui_opens_the_app(
    opened: list, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import cockpit.service.spawn

    spawned: list[Path] = []
    monkeypatch.setattr(
        cockpit.service.spawn, "spawn_detached", lambda run_dir, resume=False: spawned.append(run_dir)
    )
    assert cli.main(["run", "--profile", "tiny-cpu", "--runs-dir", str(tmp_path)]) == 0
    assert len(spawned) == 1 and opened == [(spawned[0], True, 1.0)]


# --- resume follows like run; attach finds the run; leaving a stopped run says how to go on -----------
@pytest.fixture
def stopped_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A stopped tiny-cpu run with a complete checkpoint, its supervisor never started for real."""
    import cockpit.service.spawn
    from cockpit.record.manifest import update_manifest
    from cockpit.service import lifecycle

    monkeypatch.setattr(cockpit.service.spawn, "spawn_detached", lambda run_dir, **how: None)
    run_dir = lifecycle.start(tmp_path, "tiny-cpu", [], ["cockpit", "run"]).run_dir
    checkpoint = run_dir / "checkpoints" / "checkpoint-150"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text('{"global_step": 150}')
    update_manifest(
        run_dir, status="stopped", exit_code=3, ended_at=1.0, diagnosis="stopped by user at step 150"
    )
    return run_dir


@pytest.fixture
def headless(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every headless follow (the progress line): recorded, returning at once."""
    calls: list[Path] = []

    def followed(run_dir: Path, running, **how) -> str:
        calls.append(Path(run_dir))
        return "stopped"

    monkeypatch.setattr(follow, "follow_headless", followed)
    return calls


def test_resume_opens_the_app_like_run(
    opened: list, headless: list, stopped_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `resume` always showed the progress line, whose Ctrl-C stopped the run."""
    assert cli.main(["resume", stopped_run.name, "--runs-dir", str(stopped_run.parent)]) == 0
    assert opened == [(stopped_run, True, 1.0)] and headless == []
    err = capsys.readouterr().err
    assert "resumed from checkpoint-150" in err and f"cockpit attach {stopped_run.name}" in err


def test_resume_no_ui_is_the_line_and_detach_is_neither(
    opened: list, headless: list, stopped_run: Path
) -> None:
    runs = ["--runs-dir", str(stopped_run.parent)]
    assert cli.main(["resume", stopped_run.name, "--no-ui", *runs]) == 3  # the line, to the run's end
    assert headless == [stopped_run] and opened == []
    from cockpit.record.manifest import update_manifest

    update_manifest(stopped_run, status="stopped")
    assert cli.main(["resume", stopped_run.name, "--detach", *runs]) == 0
    assert headless == [stopped_run] and opened == []


def test_resume_without_a_terminal_follows_with_plain_lines(
    opened: list, headless: list, stopped_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(follow, "_has_terminal", lambda: False)
    cli.main(["resume", stopped_run.name, "--runs-dir", str(stopped_run.parent)])
    assert headless == [stopped_run] and opened == []


def test_leaving_a_stopped_run_says_how_to_resume_it(
    opened: list, stopped_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: quitting printed the status alone."""
    assert cli.main(["attach", stopped_run.name, "--runs-dir", str(stopped_run.parent)]) == 3
    err = capsys.readouterr().err
    assert f"run {stopped_run.name}: stopped" in err
    assert f"cockpit resume {stopped_run.name}` (from checkpoint-150)" in err


def test_attach_without_a_run_takes_the_latest_running_one(
    opened: list, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a usage error."""
    from synthetic_run import SyntheticRun

    running = SyntheticRun(tmp_path, "20261202-090000-tiny-cpu-aaaa").start()
    running.close()
    older = running.root
    SyntheticRun(tmp_path, "20261202-100000-tiny-cpu-bbbb").start().end("finished", "finished", 0)
    assert cli.main(["attach", "--runs-dir", str(tmp_path)]) == 0
    assert opened == [(older, True, 1.0)]
    assert f"attaching to {older.name}, the latest running run" in capsys.readouterr().err


def test_attach_without_a_run_and_none_running_says_so(
    opened: list, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy_until(tmp_path)  # finished
    assert cli.main(["attach", "--runs-dir", str(tmp_path)]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no running run" in err[0] and "cockpit ls" in err[0] and opened == []
