"""The run record: one directory per run that every writer appends to and every viewer reads.

See `format.py` for the layout and `docs/record.md` for the documented format.
"""

from cockpit.record.check import check_record
from cockpit.record.errors import RecordError
from cockpit.record.format import FORMAT_VERSION, RunPaths
from cockpit.record.manifest import Manifest, load_manifest, write_manifest
from cockpit.record.reader import EventTail, RunReader, read_events
from cockpit.record.writer import EventWriter

__all__ = [
    "FORMAT_VERSION",
    "EventTail",
    "EventWriter",
    "Manifest",
    "RecordError",
    "RunPaths",
    "RunReader",
    "check_record",
    "load_manifest",
    "read_events",
    "write_manifest",
]
