"""The compare screen's charts: each run's curves bucketed to a chart's width. Imports no Textual.

Four charts, one trace a run in the run's colour: loss, validation loss, tokens/s and memory, against
step or against elapsed seconds. Each bucket draws the mean of its points (the max for memory), so
overlaid runs stay readable; the legend gives each run's last value.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from cockpit.app.charts import GPU_COLORS, ChartData, Trace, y_range
from cockpit.app.widgets.chart import GUTTER
from cockpit.compare import ComparedRun, Comparison, Curve
from cockpit.record.downsample import bucketize
from cockpit.units import memory

COMPARE_CHARTS = ("loss", "val_loss", "tokens", "memory")
TITLES = {"loss": "loss", "val_loss": "validation loss", "tokens": "tokens/s", "memory": "memory"}
AXES = ("step", "time")
DEFAULT_DOTS = 200


def run_color(index: int) -> str:
    return GPU_COLORS[index % len(GPU_COLORS)]


def _curve(run: ComparedRun, name: str) -> Curve:
    return {"loss": run.loss, "val_loss": run.val_loss, "tokens": run.tokens_per_s, "memory": run.memory}[
        name
    ]


def _points(curve: Curve, axis: str) -> tuple[np.ndarray, np.ndarray]:
    """The curve's finite points against `axis`, sorted by x (none when the run has no such axis)."""
    x = curve.x("step" if axis == "step" else "elapsed")
    if x is None or not len(curve):
        return np.zeros(0), np.zeros(0)
    ok = np.isfinite(curve.value) & np.isfinite(x)
    xs, ys = x[ok], curve.value[ok]
    order = np.argsort(xs, kind="stable")
    return xs[order], ys[order]


def _value(name: str, ys: np.ndarray) -> str:
    if not len(ys):
        return "-"
    last = float(ys[-1])
    if name == "memory":
        return memory(last, short=True)
    return f"{last:,.0f}" if name == "tokens" else f"{last:.4f}"


def x_range(comparison: Comparison, axis: str) -> tuple[float, float]:
    """The x span of every curve of every run, so that the four charts line up."""
    xs = [
        x
        for run in comparison.runs
        for name in COMPARE_CHARTS
        if len(x := _points(_curve(run, name), axis)[0])
    ]
    lo = min((float(x[0]) for x in xs), default=0.0)
    hi = max((float(x[-1]) for x in xs), default=1.0)
    return lo, hi if hi > lo else lo + 1.0


def build_chart(
    comparison: Comparison, name: str, axis: str, dots: int, span: tuple[float, float] | None = None
) -> ChartData:
    """One chart: each run's trace of `name` against `axis` ("step" or "time"), over `span` (default:
    every curve's)."""
    points = [_points(_curve(run, name), axis) for run in comparison.runs]
    lo, hi = span or x_range(comparison, axis)
    n = max(2, dots)
    traces = []
    missing = []
    for i, (run, (x, y)) in enumerate(zip(comparison.runs, points, strict=True)):
        s = run.summary
        b = bucketize(x, y, lo, hi, n)
        line = b.ymax if name == "memory" else b.ymean
        traces.append(Trace(f"{s.tag} {s.label}".strip(), run_color(i), line, line, value=_value(name, y)))
        if not len(x):
            missing.append(s.tag)
    y_lo, y_hi = y_range(traces, floor_zero=name in ("tokens", "memory"), keep_positive=True)
    note = ""
    if missing:
        why = "no clock" if axis == "time" and name != "val_loss" else f"no {TITLES[name]} in"
        note = f"{why}: {', '.join(missing)}"
    if name == "memory":
        kinds = sorted({r.summary.memory_kind for r in comparison.runs if r.summary.memory_kind})
        note = " · ".join(filter(None, [" / ".join(kinds), note]))
    width = n // 2 + GUTTER
    if sum(len(f"{t.label} {t.value}") + 4 for t in traces) > width:  # the legend names runs by tag alone
        traces = [replace(t, label=t.label.split(" ", 1)[0]) for t in traces]
    title = TITLES[name] + (" vs step" if axis == "step" else " vs elapsed time")
    return ChartData(title, lo, hi, y_lo, y_hi, "mib" if name == "memory" else "", tuple(traces), note=note)


def build_charts(comparison: Comparison, axis: str, dots: dict[str, int]) -> dict[str, ChartData]:
    """Every chart of the compare screen, each bucketed to its own width."""
    return {
        name: build_chart(comparison, name, axis, dots.get(name, DEFAULT_DOTS)) for name in COMPARE_CHARTS
    }
