"""`run.json`: the manifest of a run. Written whole and atomically, so a reader never sees half of it."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from cockpit.record.format import FORMAT_VERSION, RunPaths

Manifest = dict[str, Any]


def write_manifest(run_dir: Path, manifest: Manifest) -> None:
    """Replace `run.json` atomically (write a temporary file, fsync, rename)."""
    path = RunPaths(Path(run_dir)).manifest
    manifest = {"format_version": FORMAT_VERSION, **manifest}
    fd, tmp = tempfile.mkstemp(prefix=".run.json.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2, sort_keys=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
