"""Foreign training logs into run records: HF Trainer output, LLaMA-Factory's trainer_log.jsonl, consoles.

`read_foreign(path)` finds the format and reads it (`ForeignLogError`, one line, on anything it cannot
read); `import_log(path, runs_dir)` writes the run record; `cached_import(path)` is the same into a cache
keyed by the source's path, size and time, for `cockpit replay PATH`. One module a format:
`hf_state` (trainer_state.json), `llamafactory`, `console` (HF dicts and DeepSpeed lines).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from cockpit.importers import console, hf_state, llamafactory
from cockpit.importers.model import ForeignLogError, Imported, diverged_note, read_text
from cockpit.importers.write import import_into, summary, write_record
from cockpit.record import RunPaths, load_manifest

__all__ = ["ForeignLogError", "Imported", "cached_import", "import_log", "read_foreign", "summary"]

FORMATS = (
    "an HF Trainer output directory or trainer_state.json, "
    "a LLaMA-Factory trainer_log.jsonl, or a console log"
)
IMPORT_CACHE_VERSION = 1


def read_foreign(path: Path) -> Imported:
    """Read any supported foreign log at `path` (a folder or a file)."""
    path = Path(path)
    if not path.exists():
        raise ForeignLogError(f"{path}: no such file or directory")
    imported = _read_folder(path) if path.is_dir() else _read_file(path)
    if not imported.steps:
        raise ForeignLogError(
            f"{path}: no training step with a loss in it ({len(imported.evals)} evaluation lines)"
        )
    diverged = diverged_note(imported)
    if diverged is not None:
        imported.notes.append(diverged)
    return imported


def _read_folder(folder: Path) -> Imported:
    if RunPaths(folder).manifest.is_file():
        raise ForeignLogError(f"{folder}: already a cockpit run record (replay it, or compare it, as it is)")
    if (folder / llamafactory.LOG_NAME).is_file():  # LLaMA-Factory's has the clock HF's state lacks
        return llamafactory.read_output_dir(folder)
    if hf_state.state_files(folder):
        return hf_state.read_output_dir(folder)
    raise ForeignLogError(
        f"{folder}: no {hf_state.STATE} (in it or a checkpoint-N/ folder) and no {llamafactory.LOG_NAME}"
    )


def _read_file(path: Path) -> Imported:
    text = read_text(path)
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            whole = json.loads(text)
        except json.JSONDecodeError:
            whole = None
        else:
            if isinstance(whole, dict) and "log_history" in whole:
                hf_state.check_state(path, whole)
                return hf_state.read_states(path, [path])
            if isinstance(whole, dict) and llamafactory.is_llamafactory_line(whole):
                return llamafactory.read_log(path)  # a trainer_log.jsonl of one line
            raise ForeignLogError(
                f"{path}: JSON of another shape (a {type(whole).__name__}"
                f"{' with keys ' + ', '.join(sorted(whole)[:5]) if isinstance(whole, dict) else ''}): "
                f"expected {FORMATS}"
            )
        first_line = stripped.split("\n", 1)[0]
        try:
            first = json.loads(first_line)
        except json.JSONDecodeError:
            first = None
        if first is not None:
            if llamafactory.is_llamafactory_line(first):
                return llamafactory.read_log(path)
            raise ForeignLogError(
                f"{path}:1: a JSON line without `{llamafactory.REQUIRED}`: not a LLaMA-Factory "
                f"trainer_log.jsonl (expected {FORMATS})"
            )
    if not console.looks_like_console(text):
        raise ForeignLogError(
            f"{path}: no HF Trainer log dicts and no DeepSpeed step lines: expected {FORMATS}"
        )
    return console.read_console(path)


def import_log(path: Path, runs_dir: Path) -> tuple[Path, Imported]:
    """Read the foreign log at `path` and write it as a new run under `runs_dir`."""
    imported = read_foreign(path)
    return import_into(imported, runs_dir), imported


def cache_dir() -> Path:
    """Where replay keeps imported records: `imports/` of the cockpit's (private) cache,
    `cockpit.cache.cache_root`."""
    from cockpit.cache import cache_root

    return cache_root() / "imports"


def _source_key(path: Path) -> str:
    """The source's identity: its resolved path, and the size and time of each file read from it."""
    path = path.resolve()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    wanted = [p for p in files if p.name in (hf_state.STATE, llamafactory.LOG_NAME) or not path.is_dir()]
    stamp = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in wanted]
    blob = json.dumps({"v": IMPORT_CACHE_VERSION, "path": str(path), "files": stamp}).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cached_import(path: Path) -> tuple[Path, Imported | None]:
    """A record of the foreign log at `path`, imported once into the cache (None: it was there already)."""
    path = Path(path)
    if not path.exists():
        raise ForeignLogError(f"{path}: no such file or directory")
    run_dir = cache_dir() / _source_key(path)
    try:
        if load_manifest(run_dir).get("mode") == "import":
            return run_dir, None
    except (OSError, ValueError):
        shutil.rmtree(run_dir, ignore_errors=True)  # a half-written entry: import again
    imported = read_foreign(path)
    tmp = run_dir.with_name(f".{run_dir.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    write_record(imported, tmp, run_id=f"import-{imported.format}-{path.resolve().name}")
    try:
        tmp.rename(run_dir)
    except OSError:  # another process cached it first
        shutil.rmtree(tmp, ignore_errors=True)
    return run_dir, imported
