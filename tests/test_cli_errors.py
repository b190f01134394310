"""Bad input ends in one plain line and exit 2, whatever characters it holds."""

from __future__ import annotations

from pathlib import Path

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
