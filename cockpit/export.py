"""A run's series in the forms trackers import: trackio's CSV, and TensorBoard event files.

Metric names are the same in both, and short enough that trackio's CSV import keeps them as they are
(it keeps the first 10 letters, digits and `/` of a column name):

| name | from the record | unit |
|---|---|---|
| `loss`, `lr`, `gradnorm`, `epoch` | rank 0's step events | |
| `tokens/s`, `samples/s`, `steptime` | rank 0's step events | per second; seconds |
| `mem/peak`, `mem/rss` | each step's `cuda_peak_alloc_mib`, `rss_mib`, the highest over the ranks | MiB |
| `val/loss` | `val_loss` events | |
| `gpu0/used`... , `ram/used` | telemetry, at the step in progress | MiB |

Each row or scalar has its step and its time: the CSV's `timestamp` is ISO 8601 (UTC) when the record's
clock is wall time, and empty for an imported log without one; TensorBoard's `wall_time` is the record's
time either way. TensorBoard stores scalars as 32-bit floats.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from cockpit.record import load_manifest
from cockpit.record.scalars import RunScalars, load_scalars

STEP_METRICS = {
    "loss": "loss",
    "lr": "learning_rate",
    "gradnorm": "grad_norm",
    "epoch": "epoch",
    "tokens/s": "tokens_per_s",
    "samples/s": "samples_per_s",
    "steptime": "step_time_s",
}
MEMORY_METRICS = {"mem/peak": "cuda_peak_alloc_mib", "mem/rss": "rss_mib"}
FORMATS = ("csv", "tensorboard")
TENSORBOARD_MISSING = (
    "--format tensorboard needs the `tensorboard` package: "
    "pip install 'cockpit[tensorboard]' (or tensorboard)"
)


class ExportError(ValueError):
    """The export cannot be written (a missing optional package, an unusable output path)."""


@dataclass(frozen=True)
class Table:
    """Every row to export, in time order: its time, its step, and one column a metric (NaN: absent)."""

    t: np.ndarray
    step: np.ndarray
    columns: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.t)

    def rows(self) -> Iterator[tuple[int, float, dict[str, float]]]:
        """(step, time, metrics present in the row), one row at a time."""
        names = list(self.columns)
        values = np.column_stack([self.columns[n] for n in names]) if names else np.zeros((len(self), 0))
        for i in range(len(self)):
            row = values[i].tolist()
            yield (
                int(self.step[i]),
                float(self.t[i]),
                {n: v for n, v in zip(names, row, strict=True) if v == v},
            )


def table(scalars: RunScalars) -> Table:
    """The record's steps, validation losses and telemetry as one table (see the module's names)."""
    parts: list[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]] = []
    steps, t = scalars.column("step"), scalars.column("t")
    if len(steps):
        cols = {name: scalars.steps[col] for name, col in STEP_METRICS.items() if col in scalars.steps}
        cols |= {name: scalars.memory[col] for name, col in MEMORY_METRICS.items() if col in scalars.memory}
        parts.append((t, steps, cols))
    vals = scalars.val_loss
    if len(vals.get("t", [])):
        parts.append((vals["t"], vals["step"], {"val/loss": vals["loss"]}))
    tel = scalars.telemetry
    if tel and len(steps):
        order = np.argsort(t, kind="stable")
        at = np.searchsorted(t[order], tel["t"], side="right") - 1  # the last step ended before the sample
        step_at = np.where(at >= 0, steps[order][np.clip(at, 0, None)], 0.0)
        cols = {
            f"gpu{k[len('gpu_mem_used_mib[') : -1]}/used": tel[k]
            for k in tel
            if k.startswith("gpu_mem_used_mib[")
        }
        if "ram_used_mib" in tel:
            cols["ram/used"] = tel["ram_used_mib"]
        if cols:
            parts.append((tel["t"], step_at, cols))
    names: list[str] = []
    for _, _, cols in parts:
        names += [n for n in cols if n not in names]
    if not parts:
        return Table(np.zeros(0), np.zeros(0), {})
    columns = {
        n: np.concatenate([c.get(n, np.full(len(tt), np.nan)) for tt, _, c in parts]).astype(np.float64)
        for n in names
    }
    times = np.concatenate([tt for tt, _, _ in parts]).astype(np.float64)
    step_col = np.concatenate([st for _, st, _ in parts]).astype(np.float64)
    keep = np.zeros(len(times), dtype=bool)
    for n in names:
        keep |= np.isfinite(columns[n])
    order = np.argsort(times[keep], kind="stable")
    return Table(times[keep][order], step_col[keep][order], {n: c[keep][order] for n, c in columns.items()})


def _wall_clock(run_dir: Path) -> bool:
    """Whether the record's times are Unix times (an imported log may have only elapsed time or steps)."""
    imported = load_manifest(run_dir).get("imported") or {}
    return imported.get("clock", "wall") == "wall"


def write_csv(run_dir: Path, output: Path) -> int:
    """trackio's CSV import format: a header, a `step` column, a `timestamp` column, one column a metric.

    Returns the number of rows."""
    data = table(load_scalars(run_dir))
    names = list(data.columns)
    cells = {n: [repr(v) if v == v else "" for v in data.columns[n].tolist()] for n in names}
    if _wall_clock(run_dir):
        stamps = [datetime.fromtimestamp(t, UTC).isoformat() for t in data.t.tolist()]
    else:
        stamps = [""] * len(data)
    steps = [str(int(s)) for s in data.step.tolist()]
    with _writing(output):
        output.parent.mkdir(parents=True, exist_ok=True)
        with open(output, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["step", "timestamp", *names])
            writer.writerows(zip(steps, stamps, *(cells[n] for n in names), strict=True))
    return len(data)


@contextmanager
def _writing(output: Path) -> Iterator[None]:
    """An output that cannot be made or written (a missing or read-only folder, a file in its path) is an
    `ExportError` naming it."""
    try:
        yield
    except OSError as exc:
        raise ExportError(f"--output {output}: cannot write it ({exc.strerror}: {exc.filename})") from None


def write_tensorboard(run_dir: Path, logdir: Path) -> int:
    """TensorBoard event files under `logdir` (one scalar per metric, row and step). Returns the scalars."""
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        raise ExportError(TENSORBOARD_MISSING) from None
    data = table(load_scalars(run_dir))
    with _writing(logdir):
        logdir.mkdir(parents=True, exist_ok=True)
        writer = EventFileWriter(str(logdir), filename_suffix=f".{run_dir.name}")
    count = 0
    try:
        for step, t, metrics in data.rows():
            values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in metrics.items()]
            writer.add_event(
                event_pb2.Event(wall_time=t, step=step, summary=summary_pb2.Summary(value=values))
            )
            count += len(values)
    finally:
        writer.close()
    return count
