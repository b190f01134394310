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
import math
from collections.abc import Iterator
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


Row = tuple[int, float, dict[str, float]]  # step, time, metrics


def rows(scalars: RunScalars) -> Iterator[Row]:
    """Every (step, time, metrics) the record holds, in time order; a metric is left out where absent."""
    out: list[Row] = []
    steps = scalars.column("step")
    t = scalars.column("t")
    for i in range(len(steps)):
        metrics = {
            name: float(scalars.steps[col][i]) for name, col in STEP_METRICS.items() if col in scalars.steps
        }
        for name, col in MEMORY_METRICS.items():
            if col in scalars.memory:
                metrics[name] = float(scalars.memory[col][i])
        out.append((int(steps[i]), float(t[i]), _finite(metrics)))
    vals = scalars.val_loss
    for i in range(len(vals.get("t", []))):
        out.append((int(vals["step"][i]), float(vals["t"][i]), _finite({"val/loss": float(vals["loss"][i])})))
    tel = scalars.telemetry
    if tel and len(steps):
        order = np.argsort(t, kind="stable")
        at = np.searchsorted(t[order], tel["t"], side="right") - 1  # the last step ended before the sample
        gpu_cols = [k for k in tel if k.startswith("gpu_mem_used_mib[")]
        for j in range(len(tel["t"])):
            step = int(steps[order][at[j]]) if at[j] >= 0 else 0
            metrics = {f"gpu{k[len('gpu_mem_used_mib[') : -1]}/used": float(tel[k][j]) for k in gpu_cols}
            if "ram_used_mib" in tel:
                metrics["ram/used"] = float(tel["ram_used_mib"][j])
            metrics = _finite(metrics)
            if metrics:
                out.append((step, float(tel["t"][j]), metrics))
    out.sort(key=lambda r: r[1])
    yield from (r for r in out if r[2])


def _finite(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if math.isfinite(v)}


def _wall_clock(run_dir: Path) -> bool:
    """Whether the record's times are Unix times (an imported log may have only elapsed time or steps)."""
    imported = load_manifest(run_dir).get("imported") or {}
    return imported.get("clock", "wall") == "wall"


def write_csv(run_dir: Path, output: Path) -> int:
    """trackio's CSV import format: a header, a `step` column, a `timestamp` column, one column a metric.

    Returns the number of rows."""
    scalars = load_scalars(run_dir)
    all_rows = list(rows(scalars))
    names: list[str] = []
    for _, _, metrics in all_rows:
        names += [n for n in metrics if n not in names]
    wall = _wall_clock(run_dir)
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(output, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "timestamp", *names])
        for step, t, metrics in all_rows:
            stamp = datetime.fromtimestamp(t, UTC).isoformat() if wall else ""
            writer.writerow([step, stamp, *(repr(metrics[n]) if n in metrics else "" for n in names)])
    return len(all_rows)


def write_tensorboard(run_dir: Path, logdir: Path) -> int:
    """TensorBoard event files under `logdir` (one scalar per metric, row and step). Returns the scalars."""
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        raise ExportError(TENSORBOARD_MISSING) from None
    scalars = load_scalars(run_dir)
    logdir.mkdir(parents=True, exist_ok=True)
    writer = EventFileWriter(str(logdir), filename_suffix=f".{run_dir.name}")
    count = 0
    try:
        for step, t, metrics in rows(scalars):
            values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in metrics.items()]
            writer.add_event(
                event_pb2.Event(wall_time=t, step=step, summary=summary_pb2.Summary(value=values))
            )
            count += len(values)
    finally:
        writer.close()
    return count
