"""The supervisor's writes to its run's record: `run.json`, its own event file, and room for its last words.

A full disk must not cost the record its end: the keeper keeps a reserve file in the run directory
(`RESERVE_BYTES`) and frees it once, the first time a write finds no space (`durable`), so the final
status and diagnosis are still written.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cockpit.record import EventWriter, RunPaths, load_manifest, write_manifest

# Space kept aside in the run directory, freed to write the last words when the disk fills up.
RESERVE_BYTES = 256 * 1024


class RecordKeeper:
    """`run.json` and `events/supervisor.jsonl` of one run, as its supervisor writes them."""

    def __init__(self, run_dir: Path) -> None:
        self.paths = RunPaths(Path(run_dir).resolve())
        self.manifest: dict[str, Any] = load_manifest(self.paths.root)
        self.events = EventWriter(self.paths.events("supervisor"))
        self.reserve = self.paths.reserve
        self.disk_full = False  # the reserve was freed: the disk filled up

    def update_manifest(self, **fields: Any) -> None:
        """Set `fields` in `run.json` (a durable write)."""
        self.manifest.update(fields)
        self.durable(lambda: write_manifest(self.paths.root, self.manifest))

    def write(self, kind: str, **fields: Any) -> None:
        """An event in the supervisor's file (a durable write)."""
        self.durable(lambda: self.events.write(kind, **fields))

    def note(self, message: str, **fields: Any) -> None:
        """A `note` event: something a viewer shows as it happens."""
        self.write("note", message=message, **fields)

    def durable(self, write: Callable[[], Any]) -> None:
        """A record write that survives a full disk: free the reserve once and try again."""
        try:
            write()
        except OSError as exc:
            if exc.errno != errno.ENOSPC or not self.reserve.exists():
                raise
            self.reserve.unlink()
            self.disk_full = True
            write()

    def make_reserve(self) -> None:
        """Set the reserve aside (nothing where the disk has no room for it)."""
        try:
            with open(self.reserve, "wb") as f:
                f.write(b"\0" * RESERVE_BYTES)
        except OSError:
            self.reserve.unlink(missing_ok=True)

    def close(self) -> None:
        """The event file closed and the reserve given back: the attempt's record is complete."""
        self.events.close()
        self.reserve.unlink(missing_ok=True)
