"""A fast path for the many same-shaped lines of a long record (step and telemetry events).

`json.loads` costs about 10 µs a line here: 100,000 step events and 100,000 telemetry samples
take seconds. Lines written by one writer for one kind share one layout (the same keys in the same
order, numbers or null as values), so their numbers can be pulled out in bulk instead:

1. the "skeleton" of a line (every byte except number characters) must be the same for every line,
   so every line has the same keys in the same order and the same strings;
2. everything but numbers and separators is dropped and numpy parses the numbers in one call, with
   a marker number at the end of each line that must land in the last column (alignment check);
3. the first line is also parsed with `json` and must give the same numbers (layout check).

Any check that fails returns None and the caller parses those lines with `json`, line by line.

Events already parsed (a live poll, a sampled preview) become the same columns through `columns_of`,
so every fold reads one shape whatever the path the lines took.
"""

from __future__ import annotations

import functools
import json
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cockpit.record.schema import NONFINITE

_NUMBER_BYTES = b"0123456789.-+E"
# Commas become the separator; every other byte that is not part of a number (keys, quotes, colons,
# brackets) is deleted, which leaves numpy less text to scan than blanking them would.
_COMMA_TO_SPACE = bytes(0x20 if c == ord(",") else c for c in range(256))
_NOT_NUMBER = bytes(c for c in range(256) if c not in _NUMBER_BYTES and c not in b", ")
_NULL = b"-9E999"  # parses to -inf: a missing value
_EOL = b" 9E999 "  # parses to +inf: the end of a line


def _unsafe(text: str) -> bool:
    """Text that the number pass could mistake for (part of) a number, or that is one (a non-finite
    number's word, `record.schema.NONFINITE`: read by `json`, it becomes the float)."""
    return any(c in "0123456789.-+E" for c in text) or "e-" in text or "e+" in text or text in NONFINITE


def _leaves(event: dict[str, Any]) -> list[tuple[str, int | None, Any]] | None:
    """(key, index in a list or None, value) for every number or null in the event, in order.

    None when the event holds something the fast path does not handle (nested objects, booleans,
    strings made of number characters).
    """
    leaves: list[tuple[str, int | None, Any]] = []
    for key, value in event.items():
        if isinstance(value, (bool, dict)):
            return None
        if _unsafe(key):
            return None
        if isinstance(value, str):
            if _unsafe(value):
                return None
            continue
        if isinstance(value, list):
            for i, item in enumerate(value):
                if item is not None and (isinstance(item, bool) or not isinstance(item, int | float)):
                    return None
                leaves.append((key, i, item))
        elif value is None or isinstance(value, int | float):
            leaves.append((key, None, value))
        else:
            return None
    return leaves


def parse_uniform(lines: list[bytes]) -> dict[str, np.ndarray] | None:
    """Numeric columns of JSON lines that share one layout, or None if they do not.

    Scalars become `key` columns; list items become `key[i]` columns. Nulls become NaN.
    """
    if not lines:
        return None
    try:
        first = json.loads(lines[0])
    except json.JSONDecodeError:
        return None
    if not isinstance(first, dict):
        return None
    leaves = _leaves(first)
    if not leaves:
        return None
    blob = b"\n".join(lines)
    # Exponents in one spelling; null as a number; nothing else in a line may vary.
    blob = blob.replace(b"e-", b"E-").replace(b"e+", b"E+").replace(b"null", _NULL)
    skeleton = blob.translate(None, _NUMBER_BYTES)
    head = skeleton[: skeleton.find(b"\n") + 1] if len(lines) > 1 else skeleton + b"\n"
    if skeleton + b"\n" != head * len(lines):
        return None
    text = blob.replace(b"\n", _EOL).translate(_COMMA_TO_SPACE, _NOT_NUMBER) + _EOL
    width = len(leaves) + 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            numbers = np.fromstring(text, dtype=np.float64, sep=" ")
        except (ValueError, DeprecationWarning):
            return None
    if numbers.size != width * len(lines):
        return None
    table = numbers.reshape(len(lines), width)
    body = table[:, :-1]
    if not np.all(table[:, -1] == math.inf) or np.any(body == math.inf):
        return None
    expected = [math.inf * -1 if v is None else float(v) for _, _, v in leaves]
    if not np.array_equal(body[0], np.array(expected)):
        return None
    body[body == -math.inf] = np.nan
    columns: dict[str, np.ndarray] = {}
    for j, (key, index, _) in enumerate(leaves):
        columns[key if index is None else f"{key}[{index}]"] = body[:, j].copy()
    return columns


def list_width(columns: dict[str, np.ndarray], key: str) -> int:
    """How many `key[i]` columns there are."""
    n = 0
    while f"{key}[{n}]" in columns:
        n += 1
    return n


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def layout(event: Mapping[str, Any]) -> tuple[Any, ...]:
    """What must be equal for events to share columns: the keys, which are strings, and list lengths."""
    return tuple(
        (k, len(v)) if isinstance(v, list) else (k, -1) if isinstance(v, str) else k for k, v in event.items()
    )


@functools.lru_cache(maxsize=256)
def _plan(shape: tuple[Any, ...]) -> tuple[list[str], list[tuple[str, int]], list[str]]:
    """For one `layout`: the scalar keys, the list keys with their lengths, and the column names."""
    scalars = [k for k in shape if isinstance(k, str)]
    lists = [(k, n) for k, n in (s for s in shape if not isinstance(s, str)) if n >= 0]
    return scalars, lists, scalars + [f"{k}[{i}]" for k, n in lists for i in range(n)]


def columns_of(
    events: Sequence[Mapping[str, Any]], shape: tuple[Any, ...] | None = None
) -> dict[str, np.ndarray]:
    """Numeric columns of parsed events with one `layout` (`shape`, when the caller has it), named and
    valued as `parse_uniform` makes them: `key` for scalars, `key[i]` for list items, NaN for a null (or
    anything that is not a number); strings are left out."""
    scalars, lists, names = _plan(layout(events[0]) if shape is None else shape)
    rows = [[e[k] for k in scalars] + [x for k, _ in lists for x in e[k]] for e in events]
    try:
        table = np.array(rows, dtype=np.float64)  # None becomes NaN
    except (TypeError, ValueError):
        table = np.array([[_number(x) for x in row] for row in rows], dtype=np.float64)
    return dict(zip(names, table.T, strict=True))  # column views of one table
