"""A damaged record: one error type whose message names the file (and the line or field)."""

from __future__ import annotations


class RecordError(ValueError):
    """A run record that cannot be read as written: corrupt JSON, an unknown format, garbage in an event file.

    The message is one line, starting with the file's path.
    """
