"""A data file or folder read into rows with `datasets`, or one line that says where it is broken.

Formats: JSON Lines, JSON (a list of objects), Parquet, CSV (every value read as text) and a folder
written by `save_to_disk` (a `DatasetDict` folder gives each row its split's name). Text files are checked
to be UTF-8 line by line first, so a bad byte is named by its line. `datasets` is imported here, only when a
file is read: the trainer's synthetic-token paths (rehearsals, speed benchmarks) never need it.
"""

from __future__ import annotations

import csv
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cockpit.limits import DataLimits, file_problem, size_words, value_bytes
from cockpit.textfile import not_utf8
from cockpit.units import KIB, MIB

SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
}
FORMATS = ("jsonl", "json", "parquet", "csv", "arrow")  # arrow: a folder written by `save_to_disk`
TEXT_FORMATS = ("jsonl", "json", "csv")


class DataError(ValueError):
    """Data that cannot be used: the message names the file, the line or row, and the field."""


@dataclass(frozen=True)
class Table:
    """The rows of a data file, in its order, and how to name each row's place in the file."""

    path: Path
    format: str
    rows: list[dict[str, Any]]
    columns: tuple[str, ...]
    unit: str = "row"  # "line": `numbers` are the file's line numbers (JSON Lines); "row": 1-based rows
    numbers: tuple[int, ...] = ()

    def where(self, index: int) -> str:
        """`line 12` or `row 12`: where row `index` (0-based) is in the file."""
        number = self.numbers[index] if self.numbers else index + 1
        return f"{self.unit} {number}"


def detect_format(path: Path, declared: str = "auto") -> str:
    """The format of `path`: `declared` unless `auto`; then a folder is `arrow`, a file's suffix says."""
    if declared != "auto":
        if declared == "arrow" and not path.is_dir():
            raise DataError(f"{path}: data.format arrow needs a folder written by save_to_disk")
        if declared != "arrow" and path.is_dir():
            raise DataError(f"{path}: a folder; data.format {declared} needs a file")
        return declared
    if path.is_dir():
        return "arrow"
    fmt = SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        known = ", ".join(sorted(SUFFIXES))
        raise DataError(
            f"{path}: cannot tell the format from the suffix {path.suffix or '(none)'!r}: use {known} or a "
            "save_to_disk folder, or set data.format"
        )
    return fmt


def _first_line(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    text = str(cause if cause is not None and not str(exc).strip() else exc).strip()
    if "An error occurred while generating the dataset" in text and cause is not None:
        text = str(cause).strip()
    return (text.splitlines() or [type(exc).__name__])[0][:200]


def check_text(path: Path) -> list[int]:
    """Line numbers of the non-blank lines of a text file; DataError for a line that is not UTF-8, or
    for a file with nothing in it."""
    numbers = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{path}: {not_utf8(number, raw, exc.start)}") from None
            if line.strip() and line.strip() != "\ufeff":
                numbers.append(number)
    if not numbers:
        raise DataError(f"{path}: empty file: no examples")
    return numbers


def _parse_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON Lines file by Python's json, or DataError at the first bad line."""
    rows = []
    with open(path, encoding="utf-8-sig") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line.rstrip("\r\n"))  # a column of this line, not of the next
            except json.JSONDecodeError as exc:
                raise DataError(
                    f"{path}: line {number}: not valid JSON ({exc.msg} at column {exc.colno})"
                ) from None
            if not isinstance(row, dict):
                raise DataError(f"{path}: line {number}: not a JSON object (got {type(row).__name__})")
            rows.append(row)
    return rows


def _parse_json(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON file holding a list of them, or DataError with the line of the fault."""
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as exc:
        raise DataError(
            f"{path}: line {exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno})"
        ) from None
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a list of objects (one an example), got a {type(data).__name__}")
    for i, row in enumerate(data, 1):
        if not isinstance(row, dict):
            raise DataError(f"{path}: row {i}: not a JSON object (got {type(row).__name__})")
    return data


def _quiet_datasets() -> Any:
    import datasets

    datasets.disable_progress_bars()
    # `datasets` logs a loader's failure before raising it; the error we raise says it in one line.
    datasets.utils.logging.set_verbosity(logging.CRITICAL)
    return datasets


def read_table(
    path: Path, declared: str = "auto", cache_dir: Path | None = None, limits: DataLimits | None = None
) -> Table:
    """Read `path` with `datasets` (its Arrow copy cached in `cache_dir`); DataError if it cannot be, or
    if it or one of its examples is over `limits` (a profile's `data.limits`)."""
    path = Path(path).expanduser()
    limits = limits or DataLimits()
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    more = "--set data.limits.file_mib=N for more"
    problem = file_problem(path, limits.file_mib * MIB, "data.limits.file_mib", more, folder=True)
    if problem:
        raise DataError(f"{path}: {problem}")
    fmt = detect_format(path, declared)
    numbers: list[int] = check_text(path) if fmt in TEXT_FORMATS else []
    datasets = _quiet_datasets()
    cache = str(cache_dir) if cache_dir is not None else None
    unit = "row"
    if fmt == "jsonl":
        try:
            rows = datasets.Dataset.from_json(str(path), cache_dir=cache).to_list()
        except Exception:  # a broken line, or types that differ from line to line: Python's json says where
            rows = _parse_jsonl(path)
        unit = "line" if len(rows) == len(numbers) else "row"
    elif fmt == "json":
        try:
            rows = datasets.Dataset.from_json(str(path), cache_dir=cache).to_list()
        except Exception:
            rows = _parse_json(path)
    elif fmt == "csv":
        rows = _read_csv(path, cache, limits.example_kib * KIB)
    elif fmt == "parquet":
        try:
            rows = datasets.Dataset.from_parquet(str(path), cache_dir=cache).to_list()
        except Exception as exc:
            raise DataError(f"{path}: not a readable Parquet file ({_first_line(exc)})") from None
    else:
        rows = _read_saved(path, datasets)
    if not rows:
        raise DataError(f"{path}: no examples" + (" (only a header)" if fmt == "csv" else ""))
    columns: dict[str, None] = {}
    for row in rows[:1000]:
        columns.update(dict.fromkeys(row))
    table = Table(path, fmt, rows, tuple(columns), unit, tuple(numbers) if unit == "line" else ())
    _check_sizes(table, limits.example_kib * KIB)
    return table


def _check_sizes(table: Table, limit: int) -> None:
    """DataError at the first example whose text is over `limit` bytes (`data.limits.example_kib`)."""
    for i, row in enumerate(table.rows):
        size = value_bytes(row)
        if size > limit:
            raise DataError(
                f"{table.path}: {table.where(i)}: an example of {size_words(size)}, over the limit of "
                f"data.limits.example_kib ({size_words(limit)}; --set data.limits.example_kib=N for more)"
            )


def _read_csv(path: Path, cache: str | None, field_limit: int) -> list[dict[str, Any]]:
    """Every value as text (no guessing of numbers or NA), a UTF-8 byte-order mark ignored; every row
    with the header's number of columns (`check_csv`)."""
    datasets = _quiet_datasets()
    header = check_csv(path, field_limit)
    features = datasets.Features({name: datasets.Value("string") for name in header})
    try:
        ds = datasets.Dataset.from_csv(
            str(path), cache_dir=cache, features=features, keep_default_na=False, encoding="utf-8-sig"
        )
    except Exception as exc:
        raise DataError(f"{path}: not a readable CSV file ({_first_line(exc)})") from None
    return ds.to_list()


def check_csv(path: Path, field_limit: int) -> list[str]:
    """The header of a CSV file, once every row is known to have as many columns, no field is longer than
    `field_limit` (an example's limit) and there is a row; DataError naming the row and its line."""
    previous = csv.field_size_limit(field_limit)  # the csv module's own is 128 KiB
    rows = 0
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f)
            header = next(reader, [])
            if not header or not any(h.strip() for h in header):
                raise DataError(f"{path}: line 1: no header row naming the columns")
            for fields in reader:
                if not fields:  # a blank line, which `datasets` (pandas) skips too
                    continue
                rows += 1
                if len(fields) != len(header):
                    raise DataError(
                        f"{path}: row {rows} (line {reader.line_num}): {len(fields)} columns, where the "
                        f"header has {len(header)}: a ragged row (a missing or extra comma, or an unquoted "
                        "comma in a value)"
                    )
    except csv.Error as exc:
        line = f"row {rows + 1} (line {reader.line_num})"
        if "field larger than field limit" in str(exc):
            raise DataError(
                f"{path}: {line}: a field over the limit of data.limits.example_kib "
                f"({size_words(field_limit)}; --set data.limits.example_kib=N for more)"
            ) from None
        raise DataError(f"{path}: {line}: not a readable CSV row ({exc})") from None
    finally:
        csv.field_size_limit(previous)
    if not rows:
        raise DataError(f"{path}: no examples (only a header)")
    return header


def _read_saved(path: Path, datasets: Any) -> list[dict[str, Any]]:
    """A `save_to_disk` folder: a Dataset, or a DatasetDict whose split names become a `split` column."""
    try:
        saved = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise DataError(f"{path}: not a folder written by save_to_disk ({_first_line(exc)})") from None
    if isinstance(saved, datasets.DatasetDict):
        rows = []
        for name, part in saved.items():
            rows += [row if "split" in row else {**row, "split": name} for row in part.to_list()]
        return rows
    return saved.to_list()
