"""What `cockpit data` says of a data set before any GPU is touched.

Tenants with their examples per split, labels per tenant with their counts, token lengths of prompt,
reasoning and answer (a histogram each, the share over `seq_len` and what truncation would cut), and the
problems found: repeated ids, gold labels outside their tenant's set, empty reasoning. Pure: the token
lengths come in, counted by `count_tokens` (`cockpit.data.chat`'s count: the trainer's own tokenization,
or the estimate where the model's tokenizer is not on this machine).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cockpit.data.chat import Lengths
from cockpit.data.examples import DataSet, Problem

PARTS = ("prompt", "reasoning", "answer", "total")
BINS = 10


@dataclass(frozen=True)
class Histogram:
    """Counts of values in `len(counts)` equal bins from `lo` to `hi`."""

    lo: int
    hi: int
    counts: tuple[int, ...]

    @classmethod
    def of(cls, values: list[int], bins: int = BINS, hi: int | None = None) -> Histogram:
        """Bins from the smallest value to the largest (or to `hi`, if larger: the sequence length)."""
        lo = min(values, default=0)
        top = max([*values, hi or 0, lo + 1])
        width = max(1, -(-(top - lo + 1) // bins))
        counts = [0] * bins
        for v in values:
            counts[min(bins - 1, (v - lo) // width)] += 1
        return cls(lo, lo + width * bins, tuple(counts))

    def edges(self) -> list[int]:
        width = (self.hi - self.lo) // max(1, len(self.counts))
        return [self.lo + i * width for i in range(len(self.counts) + 1)]


def _summary(values: list[int]) -> dict[str, float]:
    if not values:
        return {"min": 0, "median": 0, "p95": 0, "max": 0, "mean": 0}
    ordered = sorted(values)
    return {
        "min": ordered[0],
        "median": statistics.median(ordered),
        "p95": ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))],
        "max": ordered[-1],
        "mean": round(statistics.fmean(ordered), 1),
    }


@dataclass
class Truncation:
    """What cutting every example to `seq_len` would do (the trainer cuts the prompt's start first)."""

    seq_len: int
    over: int = 0  # examples longer than seq_len
    prompt_tokens_cut: int = 0
    answer_cut: int = 0  # examples whose answer is cut too (their label lost)

    @classmethod
    def of(cls, lengths: list[tuple[int, int, int]], seq_len: int) -> Truncation:
        t = cls(seq_len)
        for prompt, reasoning, answer in lengths:
            total = prompt + reasoning + answer
            if total <= seq_len:
                continue
            t.over += 1
            keep = max(0, seq_len - reasoning - answer)
            t.prompt_tokens_cut += prompt - min(prompt, keep)
            t.answer_cut += reasoning + answer > seq_len
        return t


@dataclass
class Inspection:
    """Everything `cockpit data` prints, as data (`to_dict` for `--format json`)."""

    path: str
    format: str
    split_from: str
    examples: int
    splits: dict[str, dict[str, int]]  # tenant -> split -> examples
    labels: dict[str, dict[str, int]]  # tenant -> label -> gold count (every split), in label-set order
    counted_with: str
    seq_len: int
    lengths: dict[str, list[int]] = field(default_factory=dict)  # part -> tokens, one per example
    truncation: Truncation | None = None
    problems: list[Problem] = field(default_factory=list)
    rows: int = 0  # rows read; `examples` of them usable

    @property
    def blocking(self) -> list[Problem]:
        return [p for p in self.problems if p.blocking]

    def problems_of(self, kind: str) -> list[Problem]:
        return [p for p in self.problems if p.kind == kind]

    def histogram(self, part: str) -> Histogram:
        return Histogram.of(self.lengths.get(part, []), hi=self.seq_len if part == "total" else None)

    def over_share(self) -> float:
        total = self.lengths.get("total", [])
        return sum(1 for n in total if n > self.seq_len) / max(1, len(total))

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "split_from": self.split_from,
            "examples": self.examples,
            "rows": self.rows,
            "tenants": {t: dict(s) for t, s in self.splits.items()},
            "labels": {t: dict(c) for t, c in self.labels.items()},
            "tokens": {
                "counted_with": self.counted_with,
                "seq_len": self.seq_len,
                "over_seq_len_share": round(self.over_share(), 4),
                **{
                    part: {**_summary(values), "histogram": _hist_dict(self.histogram(part))}
                    for part, values in self.lengths.items()
                },
                "truncation": vars(self.truncation) if self.truncation else None,
            },
            "problems": [
                {"kind": p.kind, "blocking": p.blocking, "message": p.message} for p in self.problems
            ],
        }


def _hist_dict(h: Histogram) -> dict[str, Any]:
    return {"edges": h.edges(), "counts": list(h.counts)}


def inspect(
    ds: DataSet, lengths: list[tuple[int, int, int]] | None, counted_with: str, seq_len: int
) -> Inspection:
    """The inspection of a data set read without `strict` (its problems kept), with the examples'
    (prompt, reasoning, answer) token lengths when they were counted."""
    splits: dict[str, Counter[str]] = defaultdict(Counter)
    golds: dict[str, Counter[str]] = defaultdict(Counter)
    order: dict[str, dict[str, None]] = defaultdict(dict)
    for e in ds.examples:
        splits[e["tenant"]][e["split"]] += 1
        golds[e["tenant"]][e["gold"]] += 1
        order[e["tenant"]].update(dict.fromkeys(e["labels"]))
    labels = {t: {label: golds[t][label] for label in order[t]} for t in order}
    parts: dict[str, list[int]] = {}
    truncation = None
    if lengths is not None:
        parts = {
            "prompt": [p for p, _, _ in lengths],
            "reasoning": [r for _, r, _ in lengths],
            "answer": [a for _, _, a in lengths],
            "total": [p + r + a for p, r, a in lengths],
        }
        truncation = Truncation.of(lengths, seq_len)
    return Inspection(
        str(ds.path),
        ds.format,
        ds.split_from,
        len(ds.examples),
        {t: dict(c) for t, c in splits.items()},
        labels,
        counted_with,
        seq_len,
        parts,
        truncation,
        list(ds.problems) + tenant_split_problems(str(ds.path), splits),
        ds.rows,
    )


def tenant_split_problems(path: str, splits: dict[str, Counter[str]]) -> list[Problem]:
    """A tenant with no training example (nothing of its labels is learned) or no held-out one (its F1
    cannot be measured): not blocking, since the others' still are, but said."""
    if len(splits) < 2:  # one tenant: the data set's own no-train / no-eval problems say it
        return []
    out = []
    for tenant, counts in sorted(splits.items()):
        for split, words in (
            ("train", "nothing of its labels is trained"),
            ("eval", "its F1 is not measured"),
        ):
            if not counts.get(split):
                out.append(
                    Problem(
                        "tenant-split", f"{path}: tenant {tenant!r} has no {split} example: {words}", False
                    )
                )
    return out


def count_tokens(examples: list[dict[str, Any]], model_path: str) -> tuple[list[Lengths], str]:
    """Token lengths of `examples` as the trainer tokenizes them with the model at `model_path`
    (`cockpit.data.chat.token_count`), and how they were counted."""
    from cockpit.data.builtin import tokenizer_folder
    from cockpit.data.chat import token_count

    count = token_count(tokenizer_folder(model_path), model_path)
    return count.lengths(examples), count.how


def source_path(profile: Any, path: str | None = None) -> Path:
    """The data `cockpit data` and the pre-run check read: PATH, else the profile's `data.source` (the
    built-in tenants are generated into the cache if they are not there yet)."""
    from cockpit.profiles import BUILTIN_PREFIX

    source = path or profile.data.source
    if source.startswith(BUILTIN_PREFIX):
        from cockpit.data.builtin import data_path

        d = profile.data
        return data_path(d.seed, d.train_examples_per_tenant, d.eval_examples_per_tenant)
    return Path(source).expanduser()
