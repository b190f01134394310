"""Predictions files: reading the record's own, and checking an imported one line by line.

A predictions file is JSON Lines, one held-out example a line, with at least `tenant`, `id` and
`pred` (and `gold`, which must agree with the record's where given). The cockpit's own files start
with a `{"meta": ...}` line. An imported file is checked against the held-out split the record's
own predictions cover: every error names the file and the line, and nothing is scored silently wrong.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cockpit.limits import foreign_file_problem
from cockpit.record import RunPaths
from cockpit.record.atomic import write_jsonl_atomic
from cockpit.record.predictions_file import prediction_rows


class PredictionsError(ValueError):
    """An unusable predictions file; the message names the file and the line."""


@dataclass
class Predictions:
    """One system's predictions: (tenant, id) -> the row (ids need only be unique within a tenant)."""

    system: str
    rows: dict[tuple[str, str], dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Reference:
    """The held-out split as the record knows it: gold labels and each tenant's label set."""

    gold: dict[tuple[str, str], str]  # (tenant, id) -> gold label
    labels: dict[str, list[str]]  # tenant -> labels

    def ids_of(self, tenant: str) -> list[tuple[str, str]]:
        """The keys, (tenant, id), of one tenant's held-out examples."""
        return [key for key in self.gold if key[0] == tenant]


def _read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    rows = []
    try:
        problem = foreign_file_problem(path)  # a device or pipe reads without end
        if problem:
            raise PredictionsError(f"{path}: {problem}")
        # "\n" only: str.splitlines() also breaks at U+2028 and the like, which JSON may hold unescaped
        lines = path.read_text(encoding="utf-8").split("\n")
    except OSError as exc:
        raise PredictionsError(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise PredictionsError(f"{path}: not UTF-8 text") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PredictionsError(f"{path}:{number}: broken line, not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise PredictionsError(f"{path}:{number}: expected a JSON object")
        rows.append((number, row))
    return rows


def load_own(path: Path) -> Predictions:
    """A predictions file of the record (the cockpit's own, or an import already checked); `RecordError`
    naming the file, line and field for a line that is not a prediction."""
    meta: dict[str, Any] = {}
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for _, row in prediction_rows(path):
        if "meta" in row:
            meta = row["meta"]
            continue
        rows[(str(row["tenant"]), str(row["id"]))] = row
    return Predictions(meta.get("system", path.stem), rows, meta)


def own_predictions(run_dir: Path) -> list[Predictions]:
    """Every predictions file in the record, the cockpit's and imported ones alike (already checked)."""
    return [load_own(p) for p in RunPaths(Path(run_dir)).prediction_files()]


def reference_from(predictions: list[Predictions]) -> Reference:
    """The held-out split from the record's scored files (those with per-label scores)."""
    gold: dict[tuple[str, str], str] = {}
    labels: dict[str, list[str]] = {}
    for system in predictions:
        for key, row in system.rows.items():
            if "scores" not in row:
                continue
            gold.setdefault(key, row["gold"])
            labels.setdefault(row["tenant"], list(row["scores"]))
    return Reference(gold, labels)


REQUIRED = ("tenant", "id", "pred")


def check_import(path: Path, reference: Reference) -> Predictions:
    """Read an imported predictions file, refusing anything that would be scored wrong."""
    if not reference.gold:
        raise PredictionsError("the run has no scored held-out split yet: run `cockpit eval` on it first")
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    first_line: dict[tuple[str, str], int] = {}
    meta: dict[str, Any] = {}
    for number, row in _read_jsonl(path):
        if "meta" in row and len(row) == 1:
            meta = row["meta"] if isinstance(row["meta"], dict) else {}
            continue
        where = f"{path}:{number}"
        missing = [k for k in REQUIRED if k not in row]
        if missing:
            raise PredictionsError(f"{where}: missing field {', '.join(repr(m) for m in missing)}")
        tenant, pid, pred = str(row["tenant"]), str(row["id"]), row["pred"]
        if tenant not in reference.labels:
            raise PredictionsError(
                f"{where}: unknown tenant {tenant!r} (known: {', '.join(sorted(reference.labels))})"
            )
        key = (tenant, pid)
        if key in first_line:
            raise PredictionsError(f"{where}: duplicate id {pid!r} (first at line {first_line[key]})")
        if key not in reference.gold:
            raise PredictionsError(f"{where}: id {pid!r} is not a held-out example of tenant {tenant!r}")
        if pred not in reference.labels[tenant]:
            known = ", ".join(reference.labels[tenant])
            raise PredictionsError(f"{where}: unknown label {pred!r} for tenant {tenant!r} (labels: {known})")
        gold = reference.gold[key]
        if "gold" in row and row["gold"] != gold:
            raise PredictionsError(
                f"{where}: gold {row['gold']!r} differs from the record's {gold!r} for id {pid!r}"
            )
        first_line[key] = number
        rows[key] = {"tenant": tenant, "id": pid, "gold": gold, "pred": pred}
    by_tenant: dict[str, int] = defaultdict(int)
    for row in rows.values():
        by_tenant[row["tenant"]] += 1
    for tenant in sorted(reference.labels):
        expected = reference.ids_of(tenant)
        if not by_tenant[tenant]:
            raise PredictionsError(
                f"{path}: missing tenant {tenant!r}: no predictions for its {len(expected)} held-out examples"
            )
        absent = [i for i in expected if i not in rows]
        if absent:
            raise PredictionsError(
                f"{path}: {len(absent)} held-out example(s) of tenant {tenant!r} have no prediction "
                f"(e.g. id {absent[0][1]!r})"
            )
    return Predictions(meta.get("system", path.stem), rows, meta)


def import_predictions(run_dir: Path, name: str, source: Path) -> Path:
    """Check `source` against the run's held-out split and store it as `predictions/<name>.jsonl`."""
    if not name or "/" in name or name.startswith("."):
        raise PredictionsError(f"{name!r}: not a usable system name")
    if name in ("base", "finetuned"):
        raise PredictionsError(f"{name!r} is reserved for the cockpit's own systems; pick another name")
    reference = reference_from(own_predictions(run_dir))
    checked = check_import(source, reference)
    meta = {"meta": {"system": name, "imported_from": str(source.resolve())}}
    return write_jsonl_atomic(RunPaths(Path(run_dir)).prediction(name), [meta, *checked.rows.values()])
