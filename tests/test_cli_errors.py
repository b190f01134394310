"""Bad input ends in one plain line and exit 2, whatever characters it holds."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cockpit.cli import main


def test_an_error_quoting_markup_like_text_is_printed_as_is(tmp_path: Path, capsys) -> None:
    code = main(["stop", "[/x] [bold]", "--runs-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert "[/x] [bold]" in err and "Traceback" not in err


def test_replay_speed_must_be_a_finite_positive_number(tmp_path: Path, capsys) -> None:
    for speed in ("nan", "0", "-2", "inf"):
        assert main(["replay", "latest", "--speed", speed, "--runs-dir", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert f"argument --speed: {speed}: expected a finite number above 0" in err, err
        assert len(err.strip().splitlines()) == 1


def _one_error(capsys, code: int) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


def test_an_output_that_cannot_be_written_is_one_line(tmp_path: Path, capsys) -> None:
    """report --output in a missing folder, export --output under a file: the flag named, no traceback."""
    from tests.synthetic_run import make_run

    runs = tmp_path / "runs"
    make_run(runs, "report")
    missing = tmp_path / "missing" / "dir" / "x.md"
    err = _one_error(capsys, main(["report", "latest", "--runs-dir", str(runs), "--output", str(missing)]))
    assert f"--output {missing}: cannot write it (No such file or directory)" in err
    (tmp_path / "afile").write_text("")
    for fmt, out in (("csv", "afile/x.csv"), ("tensorboard", "afile/tb")):
        output = str(tmp_path / out)
        err = _one_error(capsys, main(["export", "latest", "--runs-dir", str(runs), "--format", fmt,
                                       "--output", output]))  # fmt: skip
        assert f"--output {output}: cannot write it" in err


@pytest.mark.parametrize("command", [["run", "--no-ui"], ["ls"], ["report", "latest"]])
def test_a_runs_dir_that_is_a_file_is_one_line(command: list[str], tmp_path: Path, capsys) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    for runs, words in ((afile, "a file, not a folder"), (afile / "sub", f"{afile} is a file, not a folder")):
        err = _one_error(capsys, main([*command, "--runs-dir", str(runs)]))
        assert f"--runs-dir {runs}: {words} for run records" in err


def test_a_log_that_is_not_a_file_or_too_large_is_refused_before_it_is_read(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`export /dev/zero` read without end; a pipe never ends either (a log, or predictions to import),
    and a log over the limit ($COCKPIT_MAX_LOG_MIB) is refused naming it."""
    from tests.synthetic_run import make_run

    monkeypatch.setenv("COCKPIT_CACHE", str(tmp_path / "cache"))
    pipe = tmp_path / "log.txt"
    os.mkfifo(pipe)
    make_run(tmp_path / "scored", "report")
    for command, runs in (
        (["export", str(pipe), "--format", "csv"], "runs"),
        (["import", str(pipe)], "runs"),
        (["import", "latest", "--predictions", f"mine={pipe}"], "scored"),
    ):
        err = _one_error(capsys, main([*command, "--runs-dir", str(tmp_path / runs)]))
        assert f"{pipe}: a pipe, not a file to read" in err
    big = tmp_path / "trainer_log.jsonl"
    line = json.dumps({"current_steps": 1, "total_steps": 9, "loss": 1.0, "pad": "x" * 1000}) + "\n"
    big.write_text(line * 1100)
    monkeypatch.setenv("COCKPIT_MAX_LOG_MIB", "1")
    err = _one_error(capsys, main(["import", str(big), "--runs-dir", str(tmp_path / "runs")]))
    assert "over the limit of COCKPIT_MAX_LOG_MIB (1.0 MiB; set COCKPIT_MAX_LOG_MIB=N (MiB) for more)" in err
    monkeypatch.setenv("COCKPIT_MAX_LOG_MIB", "2")
    assert main(["import", str(big), "--runs-dir", str(tmp_path / "runs")]) == 0
    capsys.readouterr()
    monkeypatch.setenv("COCKPIT_MAX_LOG_MIB", "lots")
    err = _one_error(capsys, main(["import", str(big), "--runs-dir", str(tmp_path / "runs")]))
    assert "COCKPIT_MAX_LOG_MIB=lots: expected a whole number of MiB above 0" in err
