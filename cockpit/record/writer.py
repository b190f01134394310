"""Append-only JSON Lines event writer. Each process owns its own file, so lines never interleave."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cockpit.record.schema import encode


def drop_torn_tail(path: Path, window: int = 1 << 20) -> None:
    """Cut a file back to the end of its last whole line (nothing to do when it ends in a newline)."""
    try:
        f = open(path, "rb+")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return
    with f:
        end = f.seek(0, 2)
        pos = end
        while pos > 0:
            start = max(0, pos - window)
            f.seek(start)
            data = f.read(pos - start)
            cut = data.rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            pos = start
        else:
            keep = 0
        if keep < end:
            f.truncate(keep)


class EventWriter:
    """Writes one event a line: `{"t": <unix seconds>, "kind": ..., "rank": ..., **fields}`.

    Every line is flushed as it is written, so a reader (or a crash) sees whole lines only, except
    possibly a torn last line, which readers skip until it is complete. A writer opening a file that
    ends in a torn line (its last owner crashed mid-write) drops that line, so it never ends up
    in the middle of the file, where it would be damage. `clock` stamps each event (the wall clock;
    a generator of synthetic records passes its own).
    """

    def __init__(self, path: Path, rank: int | None = None, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.rank = rank
        self.clock = clock
        path.parent.mkdir(parents=True, exist_ok=True)
        drop_torn_tail(path)
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - held open for the writer's life

    def write(self, kind: str, *, at: float | None = None, **fields: Any) -> dict[str, Any]:
        """Append one event and return it as a reader gets it back (a NaN a float, not its word); `at` is
        its time when it is not now (an imported log's)."""
        record: dict[str, Any] = {"t": round(self.clock() if at is None else at, 4), "kind": kind}
        if self.rank is not None:
            record["rank"] = self.rank
        record.update(fields)
        line = json.dumps(encode(record), separators=(",", ":"), allow_nan=False)  # NaN, inf as words
        self._file.write(line + "\n")
        self._file.flush()
        return record

    def sync(self) -> None:
        """Force the file to disk (at phase ends, not every line)."""
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
