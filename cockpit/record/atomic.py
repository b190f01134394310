"""Whole-file writes that a reader never sees half of: write a temporary file beside the target, flush it
to disk, then rename it over the target. On any failure the target is left as it was and the temporary
file is removed.

The temporary file is hidden and ends in `.tmp`, so globs over a run's files (`*.jsonl`, `*.json`)
never pick it up.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO


@contextmanager
def atomic_writer(path: Path) -> Iterator[TextIO]:
    """A text file to write `path`'s new content into; it replaces `path` only if the block succeeds."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    # O_EXCL: never write through someone else's file; 0o666 less the umask, as `open` would create it.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> Path:
    """Replace `path` with `text` (UTF-8) atomically."""
    with atomic_writer(path) as f:
        f.write(text)
    return Path(path)


def write_json_atomic(path: Path, data: Any, *, indent: int | None = 2) -> Path:
    """Replace `path` with `data` as JSON (and a final newline) atomically."""
    with atomic_writer(path) as f:
        json.dump(data, f, indent=indent)
        f.write("\n")
    return Path(path)


def write_jsonl_atomic(path: Path, rows: Iterable[Any]) -> Path:
    """Replace `path` with one JSON line per row atomically (the rows may be a generator)."""
    with atomic_writer(path) as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return Path(path)
