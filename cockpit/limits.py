"""How much the cockpit reads from one input before refusing it: one line naming the limit, instead of
minutes and gigabytes (a 50 MB example cost 124 s and 10 GB in `cockpit data`) or a read without end (a
device such as /dev/zero).

The data's limits are the profile's `[data.limits]` (`--set data.limits.example_kib=N`); a foreign
file's (a log to `import`, `replay`, `compare` or `export`, predictions to import) is
`$COCKPIT_MAX_LOG_MIB`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from cockpit.units import MIB, size

LOG_LIMIT_ENV = "COCKPIT_MAX_LOG_MIB"
DEFAULT_LOG_MIB = 1024
Positive = Annotated[int, Field(gt=0)]


class DataLimits(BaseModel):
    """The largest data a profile's run reads (`[data.limits]`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    example_kib: Positive = Field(
        default=1024,
        description="The largest example, in KiB of UTF-8 text over all its fields (1 MiB: about 250,000 "
        "tokens, far past any training.seq_len); a larger one is refused, naming its line or row.",
    )
    file_mib: Positive = Field(
        default=4096,
        description="The largest data file (or save_to_disk folder) read, in MiB; it is read whole into "
        "memory, several times its size.",
    )


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a pipe"), (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return name
    return "a special file"


def size_words(n: float) -> str:
    """A size against a limit, in the unit the limit is set in: MiB at most."""
    return size(n, largest="MiB")


def file_problem(
    path: Path, limit_bytes: int, limit_name: str, more: str, folder: bool = False
) -> str | None:
    """Why `path` is not read: not a regular file (or a folder, with `folder`), or larger than
    `limit_bytes` (set by `limit_name`, raised as `more` says); None when it can be."""
    info = path.stat()
    if stat.S_ISDIR(info.st_mode) and folder:
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    elif stat.S_ISREG(info.st_mode):
        size = info.st_size
    else:
        what = "a folder" if stat.S_ISDIR(info.st_mode) else _kind(info.st_mode)
        return f"{what}, not a file to read"
    if size > limit_bytes:
        return f"{size_words(size)}, over the limit of {limit_name} ({size_words(limit_bytes)}; {more})"
    return None


def log_limit() -> int:
    """The largest foreign file read (a log, predictions), in bytes: `$COCKPIT_MAX_LOG_MIB` MiB, 1 GiB
    unset; ValueError for a setting that is not a whole number above 0."""
    raw = os.environ.get(LOG_LIMIT_ENV, "").strip() or str(DEFAULT_LOG_MIB)
    if not raw.isdigit() or int(raw) == 0:
        raise ValueError(f"{LOG_LIMIT_ENV}={raw}: expected a whole number of MiB above 0")
    return int(raw) * MIB


def foreign_file_problem(path: Path) -> str | None:
    """Why a file the cockpit imports (a training log, predictions) is not read: not a regular file, over
    `$COCKPIT_MAX_LOG_MIB`, or that setting unusable; None when it can be (OSError as `stat` raises it)."""
    try:
        limit = log_limit()
    except ValueError as exc:
        return str(exc)
    return file_problem(path, limit, LOG_LIMIT_ENV, f"set {LOG_LIMIT_ENV}=N (MiB) for more")


def value_bytes(value: Any) -> int:
    """The UTF-8 bytes of a row's text: its strings (in lists and mappings too), other values as written."""
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, dict):
        return sum(len(str(k)) + value_bytes(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(value_bytes(v) for v in value)
    return 0 if value is None else len(str(value))
