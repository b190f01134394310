"""Reading a run record: tail event files incrementally, wait for torn last lines, merge writers by time.

The same reader serves a live run (poll again and again) and a saved one (read once). A torn last
line (a writer still writing it, or one that crashed mid-write) is left for later: it is not an error.
A line that is not an event before the end of a file is: `RecordError` names the file and the line,
unless the reader was made lenient (`strict=False`, the supervisor's: it counts them and goes on).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cockpit.record.errors import RecordError
from cockpit.record.format import RunPaths
from cockpit.record.schema import event_problem

Event = dict[str, Any]


def _parsed(line: bytes) -> tuple[Event | None, str | None]:
    """The event a line holds, or why it holds none (`record.schema`: a field of the wrong type)."""
    try:
        event = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None, "not an event (damaged or not JSON)"
    problem = event_problem(event)
    return (None, problem) if problem is not None else (event, None)


def _event(line: bytes) -> Event | None:
    """The event a line holds (its non-finite words made floats), or None if it holds none."""
    return _parsed(line)[0]


def first_bad_line(lines: list[bytes]) -> int | None:
    """The index of the first line that is neither blank nor an event."""
    return next((i for i, line in enumerate(lines) if line.strip() and _event(line) is None), None)


def bad_line_error(path: Path | None, line_no: int, line: bytes = b"") -> RecordError:
    """The error for line `line_no` (its text `line`): the file, the line, and what is wrong with it."""
    why = _parsed(line)[1] or "not an event (damaged or not JSON)"
    return RecordError(f"{path or 'event file'}: line {line_no}: {why}")


def parse_lines(
    lines: list[bytes], path: Path | None = None, first_line: int | None = None
) -> tuple[list[Event], int]:
    """Events from whole JSON lines, and how many lines were not events (blank lines are neither).

    With `first_line` (the file's line number of `lines[0]`) a line that is not an event raises
    `RecordError` naming `path` and its line instead of being counted.
    """
    events: list[Event] = []
    bad = 0
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        event = _event(line)
        if event is not None:
            events.append(event)
        elif first_line is not None:
            raise bad_line_error(path, first_line + i, line)
        else:
            bad += 1
    return events, bad


class EventTail:
    """Follows one append-only JSONL file, returning only whole new lines on each `poll`.

    The offset stays at the end of the last whole line read: a torn last line is read again at the
    next poll, so a writer that drops it (a resumed process, see `EventWriter`) loses nothing here.
    """

    def __init__(self, path: Path, offset: int = 0, *, strict: bool = True, first_line: int = 1) -> None:
        self.path = path
        self._offset = offset  # where to start: 0, or just past the last line already read in bulk
        self.strict = strict
        self._line = first_line  # the file's line number at `_offset` (exact when reading from 0)
        self.bad_lines = 0

    def poll(self, max_bytes: int | None = None) -> list[Event]:
        """New complete events since the last call; a torn last line waits for its newline."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read() if max_bytes is None else f.read(max_bytes)
        except FileNotFoundError:
            return []
        cut = chunk.rfind(b"\n")
        if cut < 0:
            return []
        lines = chunk[:cut].split(b"\n")
        events, bad = parse_lines(lines, self.path, self._line if self.strict else None)
        self._offset += cut + 1
        self._line += len(lines)
        self.bad_lines += bad
        return events


class RunReader:
    """Follows every event file of a run (new writers are picked up as they appear)."""

    def __init__(self, run_dir: Path, *, strict: bool = True) -> None:
        self.paths = RunPaths(Path(run_dir))
        self.strict = strict
        self._tails: dict[Path, EventTail] = {}

    def follow(self, path: Path, offset: int, first_line: int = 1) -> None:
        """Follow `path` from `offset` (line `first_line`) on: its lines before were read another way."""
        self._tails[path] = EventTail(path, offset, strict=self.strict, first_line=first_line)

    def poll(self) -> list[Event]:
        """All new events from all writers, merged by time."""
        for path in self.paths.event_files():
            if path not in self._tails:
                self._tails[path] = EventTail(path, strict=self.strict)
        events: list[Event] = []
        for tail in self._tails.values():
            events.extend(tail.poll())
        events.sort(key=lambda e: e["t"])
        return events

    @property
    def bad_lines(self) -> int:
        return sum(t.bad_lines for t in self._tails.values())


def read_events(run_dir: Path, kind: str | None = None) -> list[Event]:
    """Every event of a run (optionally one kind), merged by time; `RecordError` on a damaged line."""
    events = RunReader(run_dir).poll()
    return events if kind is None else [e for e in events if e["kind"] == kind]
