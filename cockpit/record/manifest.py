"""`run.json`: the manifest of a run. Written whole and atomically, so a reader never sees half of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cockpit.record.atomic import write_json_atomic
from cockpit.record.format import FORMAT_VERSION, RunPaths

Manifest = dict[str, Any]


def write_manifest(run_dir: Path, manifest: Manifest) -> None:
    """Replace `run.json` atomically (write a temporary file, fsync, rename)."""
    write_json_atomic(RunPaths(Path(run_dir)).manifest, {"format_version": FORMAT_VERSION, **manifest})


def load_manifest(run_dir: Path) -> Manifest:
    """Read `run.json`; raises FileNotFoundError if the directory is not a run."""
    path = RunPaths(Path(run_dir)).manifest
    manifest = json.loads(path.read_text(encoding="utf-8"))
    version = manifest.get("format_version")
    if version is not None and version > FORMAT_VERSION:
        raise ValueError(
            f"{path}: record format {version} is newer than this cockpit understands ({FORMAT_VERSION})"
        )
    return manifest


def update_manifest(run_dir: Path, **fields: Any) -> Manifest:
    """Read, change some fields, write back. Only the run's owner (the supervisor) calls this."""
    manifest = load_manifest(run_dir)
    manifest.update(fields)
    write_manifest(run_dir, manifest)
    return manifest
