"""Every scalar a run recorded, exactly, as numpy columns: what export and compare read.

The viewers' folds (`view.py`, `series.py`) keep what a screen shows, bounded; this keeps every step
(rank 0's training figures, each step's memory peak over all ranks), every validation loss and every
telemetry sample, read in one pass through the bulk reader. A resumed run's repeated steps replace the
first attempt's, as in the viewers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cockpit.record.bulk import Block, read_record
from cockpit.record.columns import list_width
from cockpit.record.format import RunPaths
from cockpit.record.reader import Event
from cockpit.record.schema import (
    CUDA_PEAK_ALLOC_MIB,
    CUDA_PEAK_RESERVED_MIB,
    RSS_MIB,
    STEP,
    STEP_FIGURES,
)

STEP_COLUMNS = ("t", STEP, *STEP_FIGURES)  # the step event's training figures (`record.schema`)
MEMORY_COLUMNS = (CUDA_PEAK_ALLOC_MIB, CUDA_PEAK_RESERVED_MIB, RSS_MIB)
TELEMETRY_COLUMNS = ("ram_used_mib", "run_rss_mib")


def _empty() -> np.ndarray:
    return np.zeros(0, dtype=np.float64)


@dataclass
class RunScalars:
    """Columns of one run: `steps` (rank 0, by step), `memory` (max over ranks, by step), `val_loss`,
    `telemetry` (by time; `gpu_mem_used_mib[i]` per GPU)."""

    steps: dict[str, np.ndarray] = field(default_factory=dict)
    memory: dict[str, np.ndarray] = field(default_factory=dict)  # "step" and MEMORY_COLUMNS
    val_loss: dict[str, np.ndarray] = field(default_factory=dict)  # "t", "step", "loss"
    telemetry: dict[str, np.ndarray] = field(default_factory=dict)
    status: str | None = None  # the last `end` event's

    def column(self, name: str) -> np.ndarray:
        """A step column (NaN where a step lacks it; empty when no step has it)."""
        values = self.steps.get(name)
        return _empty() if values is None else values

    @property
    def first_t(self) -> float | None:
        ts = [c["t"][0] for c in (self.steps, self.val_loss, self.telemetry) if len(c.get("t", []))]
        return float(min(ts)) if ts else None

    def gpus(self) -> int:
        return list_width(self.telemetry, "gpu_mem_used_mib") if self.telemetry else 0


def _concat(parts: list[dict[str, np.ndarray]], names: tuple[str, ...] | list[str]) -> dict[str, np.ndarray]:
    if not parts:
        return {}
    out = {}
    for name in names:
        if any(name in p for p in parts):
            out[name] = np.concatenate(
                [p[name] if name in p else np.full(len(p["t"]), np.nan) for p in parts]
            ).astype(np.float64)
    return out


def _steps_of(blocks: list[Block], rank0: bool) -> list[dict[str, np.ndarray]]:
    return [b.columns for b in blocks if b.kind == STEP and ((b.rank or 0) == 0) == rank0]


def _replaced(columns: dict[str, np.ndarray], events: list[Event]) -> np.ndarray:
    """Which rows a later attempt repeated: before a `train_begin` and past its `start_step`."""
    replaced = np.zeros(len(columns["t"]), dtype=bool)
    for e in events:
        if e["kind"] == "train_begin" and e.get("rank", 0) == 0 and e.get("start_step") is not None:
            replaced |= (columns["t"] < e["t"]) & (columns[STEP] > e["start_step"])
    return replaced


def _resumed(columns: dict[str, np.ndarray], events: list[Event]) -> dict[str, np.ndarray]:
    """The rows a later attempt did not repeat, in time order."""
    if not columns:
        return columns
    keep = ~_replaced(columns, events)
    order = np.argsort(columns["t"][keep], kind="stable")
    return {k: v[keep][order] for k, v in columns.items()}


def _memory_by_step(blocks: list[Block], steps: np.ndarray, events: list[Event]) -> dict[str, np.ndarray]:
    """Each of `steps`' memory peak over every rank that reported it (in the attempt that counts)."""
    if len(steps) == 0:
        return {}
    index = {int(s): i for i, s in enumerate(steps)}
    out: dict[str, np.ndarray] = {}
    for b in blocks:
        if b.kind != STEP:
            continue
        rows = np.array([index.get(int(s), -1) for s in b.columns[STEP]], dtype=np.int64)
        ok = (rows >= 0) & ~_replaced(b.columns, events)
        for name in MEMORY_COLUMNS:
            if name not in b.columns:
                continue
            target = out.setdefault(name, np.full(len(steps), np.nan))
            values = b.columns[name][ok]
            current = target[rows[ok]]
            target[rows[ok]] = np.fmax(current, values)  # NaN (not reported) loses to any number
    if out:
        out[STEP] = steps.astype(np.float64)
    return out


def load_scalars(run_dir: Path) -> RunScalars:
    """Read every event file of a run (`RecordError` on a damaged line) into exact columns."""
    blocks, events, _, _ = read_record(RunPaths(Path(run_dir)).events_dir)
    scalars = RunScalars()
    rank0 = _concat(_steps_of(blocks, True), STEP_COLUMNS)
    # A few step events come back as events (short files are parsed as JSON): gather them as columns.
    loose = [e for e in events if e["kind"] == STEP and e.get("rank", 0) == 0]
    if loose:
        extra = {n: np.array([_num(e.get(n)) for e in loose], dtype=np.float64) for n in STEP_COLUMNS}
        rank0 = _concat([p for p in (rank0, extra) if p], STEP_COLUMNS)
    scalars.steps = _resumed(rank0, events)
    others = [e for e in events if e["kind"] == STEP]
    memory_blocks = list(blocks)
    if others:
        memory_blocks.append(_as_block(others))
    scalars.memory = _memory_by_step(memory_blocks, scalars.column(STEP), events)
    telemetry = [b.columns for b in blocks if b.kind == "telemetry"]
    loose_tel = [e for e in events if e["kind"] == "telemetry"]
    if loose_tel:
        telemetry.append(_as_block(loose_tel).columns)
    names = sorted({k for c in telemetry for k in c if k == "t" or k.startswith("gpu_mem_used_mib[")})
    names += [n for n in TELEMETRY_COLUMNS if any(n in c for c in telemetry)]
    merged = _concat(telemetry, names)
    if merged:
        order = np.argsort(merged["t"], kind="stable")
        scalars.telemetry = {k: v[order] for k, v in merged.items()}
    vals = [e for e in events if e["kind"] == "val_loss" and _num(e.get("loss")) == _num(e.get("loss"))]
    if vals:
        scalars.val_loss = {
            "t": np.array([e["t"] for e in vals], dtype=np.float64),
            "step": np.array([_num(e.get("step")) for e in vals], dtype=np.float64),
            "loss": np.array([_num(e.get("loss")) for e in vals], dtype=np.float64),
        }
    ends = [e for e in events if e["kind"] == "end"]
    scalars.status = ends[-1].get("status") if ends else None
    return scalars


def _num(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return float("nan")
    return float(value)


def _as_block(events: list[Event]) -> Block:
    """Step or telemetry events parsed one by one (short files), as one block of their numeric fields."""
    names: set[str] = set()
    for e in events:
        for k, v in e.items():
            if isinstance(v, list):
                names.update(f"{k}[{i}]" for i in range(len(v)))
            elif (isinstance(v, int | float) and not isinstance(v, bool)) or v is None:
                names.add(k)

    def value(e: Event, name: str) -> float:
        if name.endswith("]"):
            key, i = name[:-1].split("[")
            seq = e.get(key)
            return _num(seq[int(i)]) if isinstance(seq, list) and int(i) < len(seq) else float("nan")
        return _num(e.get(name))

    columns = {n: np.array([value(e, n) for e in events], dtype=np.float64) for n in sorted(names)}
    return Block(events[0]["kind"], None, columns)
