"""The launcher runs this project's `trainer`, or says which other `trainer` it found and stops."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import cockpit.service.spawn
from cockpit import cli
from cockpit.profiles import load_profile
from cockpit.service import lifecycle
from cockpit.service.runs import create_run
from cockpit.service.spawn import trainer_problem
from cockpit.service.supervisor import Supervisor

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Supervisors the lifecycle would start (none for real)."""
    calls: list[Path] = []
    monkeypatch.setattr(cockpit.service.spawn, "spawn_detached", lambda run_dir, **how: calls.append(run_dir))
    return calls


def _shadow(where: Path, kind: str) -> Path:
    """Another project's `trainer` in `where`: a package, a module or a bare folder."""
    if kind == "package":
        (where / "trainer").mkdir()
        path = where / "trainer" / "__init__.py"
        path.write_text("raise SystemExit('the wrong trainer ran')\n")
    elif kind == "module":
        path = where / "trainer.py"
        path.write_text("raise SystemExit('the wrong trainer ran')\n")
    else:
        path = where / "trainer"
        path.mkdir()
        (path / "train.py").write_text("")
    return path


def test_ours_is_found_and_marked(tmp_path: Path) -> None:
    assert trainer_problem(tmp_path) is None
    assert "__cockpit_trainer__ = True" in (ROOT / "trainer" / "__init__.py").read_text()


@pytest.mark.parametrize("kind", ["package", "module"])
def test_another_trainer_first_on_the_path_is_named(tmp_path: Path, kind: str) -> None:
    found = _shadow(tmp_path, kind)
    problem = trainer_problem(tmp_path)
    assert problem is not None and "\n" not in problem
    assert str(found) in problem and "not the cockpit's trainer" in problem


def test_a_bare_trainer_folder_does_not_shadow_ours(tmp_path: Path) -> None:
    # A folder without __init__.py is only a namespace portion: our regular package still wins.
    _shadow(tmp_path, "folder")
    assert trainer_problem(tmp_path) is None


def test_cockpit_run_refuses_before_creating_a_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    spawned: list[Path],
) -> None:
    found = _shadow(tmp_path, "package")
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    assert cli.main(["run", "--no-ui", "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and str(found) in err
    assert spawned == [] and not runs.exists()


def test_supervisor_fails_the_attempt_without_launching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile, path = load_profile("tiny-cpu")
    run_dir = create_run(tmp_path / "runs", profile, path, ["cockpit", "run"])
    found = _shadow(tmp_path, "module")
    monkeypatch.chdir(tmp_path)
    supervisor = Supervisor(run_dir)
    launched: list[Any] = []
    monkeypatch.setattr(supervisor.runner, "launch", lambda *args: launched.append(args))
    outcome = supervisor.attempt()
    assert (outcome.status, outcome.exit_code) == ("failed", 2)
    assert str(found) in outcome.diagnosis and launched == []


def test_lifecycle_start_is_refused_with_a_shadowing_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spawned: list[Path]
) -> None:
    _shadow(tmp_path, "module")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(lifecycle.LifecycleError, match=r"trainer\.py"):
        lifecycle.start(tmp_path / "runs", "tiny-cpu", [], ["cockpit", "run"])
    assert spawned == []
