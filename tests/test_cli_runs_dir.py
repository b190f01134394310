"""Where the CLI looks for run records: --runs-dir, else $COCKPIT_RUNS_DIR, else ./runs where it exists,
else the user's own runs directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from cockpit.cli import main
from cockpit.service.runs import DEFAULT_RUNS_DIR, RUNS_DIR_ENV, user_runs_dir


def test_the_runs_dir_defaults_to_the_environment_then_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(RUNS_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert main(["ls"]) == 0  # no ./runs here: the user's own directory, whatever the working directory
    assert user_runs_dir() == tmp_path / "data" / "cockpit" / "runs"
    assert f"no runs in {user_runs_dir()} " in capsys.readouterr().err
    (tmp_path / DEFAULT_RUNS_DIR).mkdir()
    assert main(["ls"]) == 0  # a checkout's own ./runs, where it exists
    assert f"no runs in {DEFAULT_RUNS_DIR} " in capsys.readouterr().err
    monkeypatch.setenv(RUNS_DIR_ENV, str(tmp_path / "elsewhere"))
    assert main(["ls"]) == 0
    assert f"no runs in {tmp_path / 'elsewhere'} " in capsys.readouterr().err
    assert main(["ls", "--runs-dir", "given"]) == 0
    assert "no runs in given " in capsys.readouterr().err
