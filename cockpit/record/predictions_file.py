"""A stored predictions file (`predictions/<system>.jsonl`) read line by line against `record.schema`.

The record check reads every one through (`check_record`), and so does the report's reader
(`cockpit.predictions.load_own`): a line that is not a prediction is a `RecordError` naming the file, the
line and the field, never a `KeyError` in a reader.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cockpit.record.errors import RecordError
from cockpit.record.schema import PREDICTION, PREDICTION_META, fields_problem


def prediction_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) for each line of a stored predictions file, its `{"meta": ...}` line included."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RecordError(f"{path}: not UTF-8 text") from None
    for number, line in enumerate(text.split("\n"), 1):  # "\n" only, as JSON Lines break
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RecordError(f"{path}: line {number}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise RecordError(f"{path}: line {number}: not a prediction (a JSON {type(row).__name__})")
        problem = fields_problem(row, PREDICTION_META if "meta" in row else PREDICTION)
        if problem is None and row.get("scores") is not None and row.get("gold") is None:
            problem = "field gold: missing (a scored prediction holds its gold label)"
        if problem is not None:
            raise RecordError(f"{path}: line {number}: {problem}")
        yield number, row
