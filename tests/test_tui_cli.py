"""The CLI's way into the app: `run` without --no-ui, `attach`, `replay`."""

from __future__ import annotations

from pathlib import Path

import pytest
from tui_helpers import FIXTURE, copy_until

from cockpit import cli


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, bool, float]]:
    calls: list[tuple[Path, bool, float]] = []

    def fake_run_app(run_dir: Path, *, live: bool, speed: float = 1.0) -> str:
        calls.append((Path(run_dir), live, speed))
        return "detached"

    import cockpit.app.app

    monkeypatch.setattr(cockpit.app.app, "run_app", fake_run_app)
    monkeypatch.setattr(cli, "_has_terminal", lambda: True)  # the fake app's terminal (pytest has none)
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
    import cockpit.supervisor

    spawned: list[Path] = []
    monkeypatch.setattr(
        cockpit.supervisor, "spawn_detached", lambda run_dir, resume=False: spawned.append(run_dir)
    )
    assert cli.main(["run", "--profile", "tiny-cpu", "--runs-dir", str(tmp_path)]) == 0
    assert len(spawned) == 1 and opened == [(spawned[0], True, 1.0)]
