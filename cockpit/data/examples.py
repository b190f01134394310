"""The user's rows mapped onto the fields the cockpit needs, checked, and split.

An example is `{"tenant", "id", "split": "train"|"eval"|"validation", "system", "user", "labels": [...],
"gold", "reasoning"}`. `data.columns` names the column of each field (a `messages` chat column can give
system, user, reasoning and gold instead). Every problem found is a `Problem` naming the file, the line or
row and the field; `load_examples(..., strict=True)` raises the first blocking one as a `DataError`.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cockpit.data.source import DataError, Table, read_table

SPLIT_ON_SOME = (
    "missing: give it on every row or on none (then data.eval_fraction holds out part of each tenant)"
)
FIELDS = ("tenant", "id", "split", "system", "user", "labels", "gold", "reasoning")
SPLITS = {
    "train": "train",
    "eval": "eval",
    "test": "eval",
    "validation": "validation",
    "val": "validation",
    "valid": "validation",
    "dev": "validation",
}
DEFAULT_TENANT = "all"
THINK_TAGS = ("<think>", "</think>")
ROLES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant"}


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the data; `blocking` ones stop a run before it starts."""

    kind: str  # missing, empty, type, label, split, duplicate, messages, no-eval, no-train, reasoning,
    # tenant-split (a tenant with no train or no eval example)
    message: str  # one line: the file, the line or row, the field and what is wrong
    blocking: bool = True


@dataclass
class DataSet:
    """A data file's examples in file order, each with its split, and what was found wrong with it."""

    path: Path
    format: str
    examples: list[dict[str, Any]]
    split_from: str  # "column 'split'", "DatasetDict splits" or the seeded per-tenant split
    problems: list[Problem] = field(default_factory=list)
    columns: tuple[str, ...] = ()
    rows: int = 0  # rows read, those left out by a problem included

    def split(self, name: str) -> list[dict[str, Any]]:
        """The examples of one split (`train`, `eval`, `validation`), in file order."""
        return [e for e in self.examples if e["split"] == name]

    @property
    def blocking(self) -> list[Problem]:
        return [p for p in self.problems if p.blocking]

    def raise_first(self) -> None:
        """DataError with the first blocking problem, if there is one."""
        if self.blocking:
            raise DataError(self.blocking[0].message)

    def fingerprint(self) -> str:
        """A hash of the examples (fields and splits) in order: equal for the same data in any format."""
        digest = hashlib.sha256()
        for e in self.examples:
            digest.update(json.dumps([e[k] for k in FIELDS], ensure_ascii=False).encode())
            digest.update(b"\n")
        return digest.hexdigest()


class _Mapper:
    """Maps one table's rows onto the fields, noting problems as it goes."""

    def __init__(self, table: Table, columns: Any) -> None:
        self.table = table
        self.problems: list[Problem] = []
        self.names = {f: getattr(columns, f) for f in (*FIELDS, "messages")}
        present = set(table.columns)
        for name, column in self.names.items():  # a column the profile renames must be there
            if column != name and column not in present:
                raise DataError(
                    f"{table.path}: no column {column!r} (data.columns.{name}); the data has: "
                    f"{', '.join(table.columns)}"
                )
        self.has = {name: self.names[name] in present for name in self.names}
        if not self.has["messages"]:
            for name in ("user", "gold"):
                if not self.has[name]:
                    raise DataError(
                        f"{table.path}: no column {self.names[name]!r} (field {name}) and no "
                        f"{self.names['messages']!r} chat column; the data has: {', '.join(table.columns)}; "
                        f"name yours with data.columns.{name}"
                    )

    def note(self, index: int, name: str, what: str, kind: str, blocking: bool = True) -> None:
        column = self.names.get(name, name)
        shown = name if column == name else f"{name} (column {column!r})"
        self.problems.append(
            Problem(kind, f"{self.table.path}: {self.table.where(index)}: field {shown}: {what}", blocking)
        )

    def text(self, index: int, row: dict[str, Any], name: str, required: bool) -> str | None:
        """A text field: a string (a whole number is taken as its digits); None after noting a problem."""
        if not self.has[name]:
            return None if required else ""
        value = row.get(self.names[name])
        if value is None:
            if required:
                self.note(index, name, "missing", "missing")
                return None
            return ""
        if isinstance(value, bool) or not isinstance(value, str | int):
            self.note(index, name, f"expected text, got {type(value).__name__} {_short(value)}", "type")
            return None
        value = str(value)
        if required and not value.strip():
            self.note(index, name, "empty", "empty")
            return None
        return value

    def labels(self, index: int, row: dict[str, Any]) -> list[str] | None:
        """The example's label set: a list of texts, or in text a JSON list or labels joined by '|'."""
        value = row.get(self.names["labels"])
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                try:
                    value = json.loads(text)
                except json.JSONDecodeError:
                    self.note(index, "labels", f"not a JSON list: {_short(text)}", "type")
                    return None
            else:
                value = [part.strip() for part in text.split("|")] if text else []
        if value is None:
            self.note(index, "labels", "missing", "missing")
            return None
        if not isinstance(value, list) or not all(isinstance(v, str | int) for v in value):
            self.note(index, "labels", f"expected a list of labels, got {_short(value)}", "type")
            return None
        labels = [str(v) for v in value]
        if not labels or not all(lab.strip() for lab in labels):
            self.note(index, "labels", "empty (or an empty label in it)", "empty")
            return None
        return labels

    def chat(self, index: int, row: dict[str, Any]) -> dict[str, str] | None:
        """system, user, reasoning and gold from a messages list (role/content or ShareGPT's from/value)."""
        value = row.get(self.names["messages"])
        if not isinstance(value, list) or not value:
            self.note(index, "messages", f"expected a list of messages, got {_short(value)}", "messages")
            return None
        turns: dict[str, list[str]] = defaultdict(list)
        for message in value:
            if not isinstance(message, dict):
                self.note(index, "messages", f"a message is not an object: {_short(message)}", "messages")
                return None
            role = ROLES.get(str(message.get("role", message.get("from", ""))).lower())
            content = message.get("content", message.get("value"))
            if role is None or not isinstance(content, str):
                self.note(
                    index, "messages", f"a message without role and content: {_short(message)}", "messages"
                )
                return None
            turns[role].append(content)
        if len(turns["user"]) != 1 or len(turns["assistant"]) != 1:
            self.note(
                index,
                "messages",
                f"expected one user and one assistant message, found {len(turns['user'])} and "
                f"{len(turns['assistant'])}",
                "messages",
            )
            return None
        answer = turns["assistant"][0]
        reasoning, gold = "", answer.strip()
        open_tag, close_tag = THINK_TAGS
        if close_tag in answer:
            thinking, _, gold = answer.partition(close_tag)
            reasoning = thinking.replace(open_tag, "", 1).strip()
            gold = gold.strip()
        if not gold:
            self.note(index, "messages", "the assistant's answer has no label after its thinking", "empty")
            return None
        return {
            "system": "\n".join(turns["system"]),
            "user": turns["user"][0],
            "reasoning": reasoning,
            "gold": gold,
        }


def _short(value: Any, width: int = 40) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def map_rows(table: Table, columns: Any) -> tuple[list[dict[str, Any]], list[int], list[Problem]]:
    """The rows as examples (split not yet assigned where the data has none: `None`), the index in the
    table of each, and the problems of the rows left out."""
    m = _Mapper(table, columns)
    examples, kept = [], []
    for i, row in enumerate(table.rows):
        before = len(m.problems)
        if m.has["messages"] and (not m.has["user"] or row.get(m.names["user"]) is None):
            chat = m.chat(i, row)
            system, user = (chat or {}).get("system"), (chat or {}).get("user")
            gold, reasoning = (chat or {}).get("gold"), (chat or {}).get("reasoning")
        else:
            system = m.text(i, row, "system", required=False)
            user = m.text(i, row, "user", required=True)
            gold = m.text(i, row, "gold", required=True)
            reasoning = m.text(i, row, "reasoning", required=False)
        tenant = m.text(i, row, "tenant", required=True) if m.has["tenant"] else DEFAULT_TENANT
        ident = m.text(i, row, "id", required=True) if m.has["id"] else f"{table.where(i).replace(' ', '-')}"
        split = None
        if m.has["split"]:
            raw = None
            given = row.get(m.names["split"])
            if given is None or given == "":  # a JSONL column exists once a row has it; CSV cells are ""
                m.note(i, "split", SPLIT_ON_SOME, "missing")
            else:
                raw = m.text(i, row, "split", required=True)
            split = SPLITS.get(raw.strip().lower()) if raw is not None else None
            if raw is not None and split is None:
                m.note(i, "split", f"{raw!r} is not one of {', '.join(SPLITS)}", "split")
        labels = m.labels(i, row) if m.has["labels"] else []
        if len(m.problems) > before:
            continue
        if labels and gold not in labels:
            shown = ", ".join(map(repr, labels))
            hint = " (labels in text are joined by '|')" if len(labels) == 1 and "," in labels[0] else ""
            m.note(i, "gold", f"{gold!r} is not in its tenant's label set [{shown}]{hint}", "label")
            continue
        examples.append(
            {
                "tenant": tenant,
                "id": ident,
                "split": split,
                "system": system,
                "user": user,
                "labels": labels,
                "gold": gold,
                "reasoning": reasoning,
            }
        )
        kept.append(i)
    return examples, kept, m.problems


def assign_splits(examples: list[dict[str, Any]], eval_fraction: float, seed: int) -> None:
    """Each tenant's share `eval_fraction` (at least one example of two or more) to `eval`, seeded; the
    rest to `train`."""
    by_tenant: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in examples:
        by_tenant[e["tenant"]].append(e)
    for tenant, members in by_tenant.items():
        held = max(1, round(len(members) * eval_fraction)) if len(members) > 1 else 0
        chosen = set(random.Random(f"{seed}-{tenant}").sample(range(len(members)), held))
        for i, e in enumerate(members):
            e["split"] = "eval" if i in chosen else "train"


def label_sets(examples: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    """Each tenant's labels: those its examples list, in first-seen order (their gold labels if none)."""
    sets: dict[str, dict[str, None]] = defaultdict(dict)
    for e in examples:
        sets[e["tenant"]].update(dict.fromkeys(e["labels"] or [e["gold"]]))
    return {t: list(labels) for t, labels in sets.items()}


def _fill_labels(examples: list[dict[str, Any]]) -> None:
    """Examples with no labels of their own get their tenant's set of gold labels."""
    golds: dict[str, dict[str, None]] = defaultdict(dict)
    for e in examples:
        golds[e["tenant"]][e["gold"]] = None
    sets = {t: sorted(g) for t, g in golds.items()}
    for e in examples:
        if not e["labels"]:
            e["labels"] = list(sets[e["tenant"]])


def _dataset_problems(ds: DataSet, table: Table, kept: list[int]) -> None:
    """Problems of the whole: repeated ids, a split with nothing in it, empty reasoning (a warning)."""
    first: dict[str, int] = {}
    for e, i in zip(ds.examples, kept, strict=True):
        if e["id"] in first:
            where = table.where(first[e["id"]])
            ds.problems.append(
                Problem("duplicate", f"{table.path}: {table.where(i)}: field id: {e['id']!r} repeats {where}")
            )
        else:
            first[e["id"]] = i
    splits = Counter(e["split"] for e in ds.examples)
    if ds.examples and not splits["train"]:
        ds.problems.append(
            Problem("no-train", f"{table.path}: no example is in the train split ({ds.split_from})")
        )
    if ds.examples and not splits["eval"]:
        ds.problems.append(
            Problem("no-eval", f"{table.path}: no example is held out in the eval split ({ds.split_from})")
        )
    empty = [i for e, i in zip(ds.examples, kept, strict=True) if not e["reasoning"].strip()]
    if empty:
        ds.problems.append(
            Problem(
                "reasoning",
                f"{table.path}: {len(empty)} example(s) with empty reasoning (first at "
                f"{table.where(empty[0])}): their answer is the label alone",
                blocking=False,
            )
        )


def load_examples(path: Path, spec: Any, *, strict: bool = True, cache_dir: Path | None = None) -> DataSet:
    """Read, map, check and split the data of `spec` (a profile's `data` section) at `path`.

    With `strict`, the first blocking problem is raised as a `DataError`; without, every problem is kept
    in `problems` (for `cockpit data`) and the examples are those without one.
    """
    table = read_table(path, spec.format, cache_dir, spec.limits)
    examples, kept, problems = map_rows(table, spec.columns)
    if strict and problems:
        raise DataError(problems[0].message)
    if spec.columns.split in table.columns:
        split_from = f"column {spec.columns.split!r}"
    else:
        assign_splits(examples, spec.eval_fraction, spec.seed)
        split_from = (
            f"seeded per-tenant split: data.eval_fraction {spec.eval_fraction:g}, data.seed {spec.seed}"
        )
    _fill_labels(examples)
    ds = DataSet(Path(path), table.format, examples, split_from, problems, table.columns, len(table.rows))
    _dataset_problems(ds, table, kept)
    if strict:
        ds.raise_first()
    return ds


def validation_sample(ds: DataSet, per_tenant: int) -> tuple[list[dict[str, Any]], str]:
    """The first `per_tenant` examples of each tenant in the validation split, else in the eval split;
    and the split's name."""
    source = "validation" if ds.split("validation") else "eval"
    taken: Counter[str] = Counter()
    picked = []
    for e in ds.split(source):
        if taken[e["tenant"]] < per_tenant:
            taken[e["tenant"]] += 1
            picked.append(e)
    return picked, source
