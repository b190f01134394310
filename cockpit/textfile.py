"""Text files the user gives (profiles, hostfiles, data) read as UTF-8, or one line that says where not.

Python's `UnicodeDecodeError` names a byte offset in a buffer; a person needs the line, the column and
the byte, and what to do about it.
"""

from __future__ import annotations

from pathlib import Path


class NotUtf8(ValueError):
    """A file that is not UTF-8 text; the message says where (`line 3: not UTF-8 text (byte 0xe9 ...)`)."""


def not_utf8(line: int, raw: bytes, start: int) -> str:
    """The words for byte `start` of line `line` (its bytes `raw`) that is not UTF-8."""
    return (
        f"line {line}: not UTF-8 text (byte {raw[start]:#04x} at column {start + 1}); save the file as UTF-8"
    )


def read_utf8(path: Path) -> str:
    """The text of `path` as `Path.read_text(encoding="utf-8")` gives it (universal newlines); `NotUtf8`
    naming the first bad byte's line, column and value; `OSError` as reading raises it."""
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        begin = data.rfind(b"\n", 0, exc.start) + 1
        end = data.find(b"\n", exc.start)
        raw = data[begin : end if end >= 0 else len(data)]
        raise NotUtf8(not_utf8(data.count(b"\n", 0, begin) + 1, raw, exc.start - begin)) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")
