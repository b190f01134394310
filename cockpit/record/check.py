"""The record check: a run's files read through, before a command reads them for what they hold.

`report`, `replay`, `attach`, `eval`, `compare` and `export` call `check_record` first, so a damaged
record (a line that is not an event, a field of the wrong type by `record.schema`, a run.json or a stored
prediction that is not one) is one line naming the file, the line and the field, never a traceback in a
reader further on. The event files go through the bulk reader, the one that opens long records: its
columns are checked against the schema as they are made, and only a chunk with damage in it is parsed
line by line to name the line. A torn last line is not damage.
"""

from __future__ import annotations

from pathlib import Path

from cockpit.record.bulk import read_file
from cockpit.record.format import RunPaths
from cockpit.record.manifest import Manifest, load_manifest
from cockpit.record.predictions_file import prediction_rows


def check_events(run_dir: Path) -> None:
    """Read every event file of a run through, keeping nothing: `RecordError` at the first damaged line."""
    for path in RunPaths(Path(run_dir)).event_files():
        for _ in read_file(path, strict=True):
            pass


def check_record(run_dir: Path) -> Manifest:
    """The run's manifest, once it, every event file and every predictions file have been read through
    and found well-typed (`record.schema`); `RecordError` naming the file, line and field if damaged."""
    manifest = load_manifest(run_dir)
    check_events(run_dir)
    for path in RunPaths(Path(run_dir)).prediction_files():
        for _ in prediction_rows(path):
            pass
    return manifest
