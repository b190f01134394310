"""Bad input ends in one plain line and exit 2, whatever characters it holds."""

from __future__ import annotations

from pathlib import Path

from cockpit.cli import main


def test_an_error_quoting_markup_like_text_is_printed_as_is(tmp_path: Path, capsys) -> None:
    code = main(["stop", "[/x] [bold]", "--runs-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert "[/x] [bold]" in err and "Traceback" not in err
