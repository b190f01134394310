"""Reading a run record: tail event files incrementally, skip torn last lines, merge writers by time.

The same reader serves a live run (poll again and again) and a saved one (read once).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cockpit.record.format import RunPaths

Event = dict[str, Any]


def parse_lines(lines: list[bytes]) -> tuple[list[Event], int]:
    """Events from whole JSON lines, and how many lines were not events (blank lines are neither)."""
    events: list[Event] = []
    bad = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(event, dict) and "kind" in event and "t" in event:
            events.append(event)
        else:
            bad += 1
    return events, bad


class EventTail:
    """Follows one append-only JSONL file, returning only whole new lines on each `poll`."""

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = path
        self._offset = offset  # where to start: 0, or just past the last line already read in bulk
        self._partial = b""
        self.bad_lines = 0

    def poll(self, max_bytes: int | None = None) -> list[Event]:
        """New complete events since the last call; a torn last line waits for its newline."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read() if max_bytes is None else f.read(max_bytes)
        except FileNotFoundError:
            return []
        if not chunk:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        events, bad = parse_lines(lines)
        self.bad_lines += bad
        return events


class RunReader:
    """Follows every event file of a run (new writers are picked up as they appear)."""

    def __init__(self, run_dir: Path) -> None:
        self.paths = RunPaths(Path(run_dir))
        self._tails: dict[Path, EventTail] = {}

    def follow(self, path: Path, offset: int) -> None:
        """Follow `path` from `offset` on (its lines before were read another way, e.g. in bulk)."""
        self._tails[path] = EventTail(path, offset)

    def poll(self) -> list[Event]:
        """All new events from all writers, merged by time."""
        for path in self.paths.event_files():
            if path not in self._tails:
                self._tails[path] = EventTail(path)
        events: list[Event] = []
        for tail in self._tails.values():
            events.extend(tail.poll())
        events.sort(key=lambda e: e["t"])
        return events

    @property
    def bad_lines(self) -> int:
        return sum(t.bad_lines for t in self._tails.values())


def read_events(run_dir: Path, kind: str | None = None) -> list[Event]:
    """Every event of a run (optionally one kind), merged by time."""
    events = RunReader(run_dir).poll()
    return events if kind is None else [e for e in events if e["kind"] == kind]
