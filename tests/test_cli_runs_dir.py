"""Where the CLI looks for run records: --runs-dir, else $COCKPIT_RUNS_DIR, else ./runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from cockpit.cli import main
from cockpit.runs import DEFAULT_RUNS_DIR, RUNS_DIR_ENV


def test_the_runs_dir_defaults_to_the_environment_then_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(RUNS_DIR_ENV, raising=False)
    assert main(["ls"]) == 0
    assert f"no runs in {DEFAULT_RUNS_DIR} " in capsys.readouterr().err
    monkeypatch.setenv(RUNS_DIR_ENV, str(tmp_path / "elsewhere"))
    assert main(["ls"]) == 0
    assert f"no runs in {tmp_path / 'elsewhere'} " in capsys.readouterr().err
    assert main(["ls", "--runs-dir", "given"]) == 0
    assert "no runs in given " in capsys.readouterr().err
