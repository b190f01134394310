"""`run.json`: the manifest of a run. Written whole and atomically, so a reader never sees half of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cockpit.record.atomic import write_json_atomic
from cockpit.record.errors import RecordError
from cockpit.record.format import FORMAT_VERSION, RunPaths
from cockpit.record.schema import MANIFEST, fields_problem

Manifest = dict[str, Any]


def write_manifest(run_dir: Path, manifest: Manifest) -> None:
    """Replace `run.json` atomically (write a temporary file, fsync, rename)."""
    write_json_atomic(RunPaths(Path(run_dir)).manifest, {"format_version": FORMAT_VERSION, **manifest})


def load_manifest(run_dir: Path) -> Manifest:
    """Read `run.json`; FileNotFoundError if the directory is not a run, `RecordError` if it is damaged
    (not JSON, not an object, a `format_version` this cockpit does not know, or a field of the wrong
    type: `record.schema.MANIFEST`)."""
    path = RunPaths(Path(run_dir)).manifest
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise RecordError(f"{path}: not valid JSON ({exc.msg} at {where})") from None
    if not isinstance(manifest, dict):
        raise RecordError(f"{path}: not a run manifest (a JSON {type(manifest).__name__}, not an object)")
    version = manifest.get("format_version")
    if version is not None and (type(version) is not int or not 1 <= version <= FORMAT_VERSION):
        raise RecordError(
            f"{path}: format_version {version!r} is unknown to this cockpit (it reads 1 to {FORMAT_VERSION})"
        )
    problem = fields_problem(manifest, MANIFEST)
    if problem is not None:
        raise RecordError(f"{path}: {problem}")
    return manifest


def update_manifest(run_dir: Path, **fields: Any) -> Manifest:
    """Read, change some fields, write back. Only the run's owner (the supervisor) calls this."""
    manifest = load_manifest(run_dir)
    manifest.update(fields)
    write_manifest(run_dir, manifest)
    return manifest
