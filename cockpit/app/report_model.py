"""The evaluation report as the report screen draws it: plain frozen data, and the bar chart's arithmetic.

`read_report` runs on a worker thread: it reads the run's `report.json`, or, when there is none yet but
the record has predictions, builds the report from them in memory (`cockpit.report.run_report`; the app
writes nothing into the record). The screen gets a `ReportData`. This module imports no Textual.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cockpit.record import RunPaths

METRICS = ("macro_f1", "micro_f1", "precision", "recall")
METRIC_NAMES = {"macro_f1": "macro F1", "micro_f1": "micro F1", "precision": "precision", "recall": "recall"}
REPORT_FILE = "report.json"


@dataclass(frozen=True)
class Delta:
    """The tuned model's macro-F1 delta against one other system (0..1 scale), with its 95% interval."""

    value: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        """`better` when the whole interval is above 0, `worse` when below, else `unclear`."""
        return "better" if self.low > 0 else "worse" if self.high < 0 else "unclear"


@dataclass(frozen=True)
class Row:
    """One tenant (or the mean over tenants): each system's metrics and the tuned model's deltas."""

    name: str
    n: int | None
    metrics: Mapping[str, Mapping[str, float]]  # system -> metric -> value (0..1)
    deltas: Mapping[str, Delta]  # other system -> delta of the tuned model against it


@dataclass(frozen=True)
class Serving:
    measured_on: str
    ttft_ms: float | None
    per_token_ms: float | None
    stream_tokens_per_s: float | None
    batch_tokens_per_s: float | None
    batch_size: int | None
    hour_usd: float | None
    usd_per_mtok: float | None
    api_name: str
    api_usd_per_mtok: float | None

    @property
    def on_cpu(self) -> bool:
        """Measured on a CPU: the tiny CPU model's numbers, not a production model's."""
        return self.measured_on.lower() == "cpu"


@dataclass(frozen=True)
class ReportData:
    systems: tuple[str, ...]
    tuned: str | None
    tenants: tuple[Row, ...]
    mean: Row
    serving: Serving | None
    model: str | None
    bootstrap_samples: int | None
    source: str  # "report.json", or "built from predictions" when the run has no report.json yet

    @property
    def others(self) -> tuple[str, ...]:
        return tuple(s for s in self.systems if s != self.tuned)

    @property
    def reference(self) -> str | None:
        """The system the delta chart compares against: the base model when there is one."""
        if self.tuned is None or not self.others:
            return None
        return "base" if "base" in self.others else self.others[0]

    @property
    def examples(self) -> int:
        return sum(t.n or 0 for t in self.tenants)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _deltas(raw: Mapping[str, Any]) -> dict[str, Delta]:
    out = {}
    for other, d in raw.items():
        low, high = d.get("ci95") or (d["macro_f1"], d["macro_f1"])
        out[other] = Delta(float(d["macro_f1"]), float(low), float(high))
    return out


def report_data(report: Mapping[str, Any], source: str = REPORT_FILE) -> ReportData:
    """The screen's view of a report dict (the shape `cockpit.report.build_report` returns)."""
    systems = tuple(report.get("systems") or ())
    tenants = tuple(
        Row(
            name=str(t["tenant"]),
            n=t.get("n"),
            metrics={s: {k: float(m[k]) for k in METRICS if k in m} for s, m in t.get("systems", {}).items()},
            deltas=_deltas(t.get("deltas") or {}),
        )
        for t in report.get("tenants") or ()
    )
    # The report's mean is macro F1 averaged over tenants; the other metrics are averaged the same way.
    mean_metrics: dict[str, dict[str, float]] = {}
    for s in systems:
        rows = [t.metrics[s] for t in tenants if s in t.metrics]
        if rows:
            mean_metrics[s] = {k: math.fsum(r[k] for r in rows) / len(rows) for k in METRICS if k in rows[0]}
    raw_mean = report.get("mean") or {}
    for s, m in (raw_mean.get("systems") or {}).items():
        if "macro_f1" in m:
            mean_metrics.setdefault(s, {})["macro_f1"] = float(m["macro_f1"])
    mean = Row("mean", None, mean_metrics, _deltas(raw_mean.get("deltas") or {}))
    sv = report.get("serving")
    serving = (
        Serving(
            measured_on=str(sv.get("measured_on") or sv.get("device") or "?"),
            ttft_ms=_float(sv.get("ttft_ms")),
            per_token_ms=_float(sv.get("per_token_ms")),
            stream_tokens_per_s=_float(sv.get("stream_tokens_per_s")),
            batch_tokens_per_s=_float(sv.get("batch_tokens_per_s")),
            batch_size=sv.get("batch_size"),
            hour_usd=_float(sv.get("hour_usd")) or None,
            usd_per_mtok=_float(sv.get("usd_per_mtok")),
            api_name=str(sv.get("api_name") or "API"),
            api_usd_per_mtok=_float(sv.get("api_usd_per_mtok")),
        )
        if sv
        else None
    )
    return ReportData(
        systems=systems,
        tuned=report.get("tuned"),
        tenants=tenants,
        mean=mean,
        serving=serving,
        model=report.get("model"),
        bootstrap_samples=report.get("bootstrap_samples"),
        source=source,
    )


def has_report(run_dir: Path) -> bool:
    """Whether the run has a report, or predictions to build one from (two stats; call off the UI thread)."""
    paths = RunPaths(Path(run_dir))
    return paths.report_json.is_file() or bool(paths.prediction_files())


def read_report(run_dir: Path) -> ReportData | None:
    """The run's report: `report.json`, else built in memory from its predictions; None when neither is
    there. Reads files (and may run the bootstrap): call it on a worker thread."""
    run_dir = Path(run_dir)
    path = RunPaths(run_dir).report_json
    if path.is_file():
        return report_data(json.loads(path.read_text(encoding="utf-8")))
    from cockpit.report import run_report

    report = run_report(run_dir)
    if not report["tenants"]:
        return None
    return report_data(report, source="built from predictions")


# --- the delta chart's arithmetic ---------------------------------------------------------------
NICE_STEPS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # tick labels at whole points where they can be


@dataclass(frozen=True)
class Scale:
    """A value range drawn across `width` character columns; 0 is always inside it."""

    lo: float
    hi: float
    width: int
    step: float  # between tick labels

    def col(self, x: float) -> int:
        """The column of value `x` (clamped to the field)."""
        frac = (x - self.lo) / (self.hi - self.lo)
        return min(self.width - 1, max(0, round(frac * (self.width - 1))))

    def ticks(self) -> list[float]:
        first = math.ceil(self.lo / self.step - 1e-9)
        last = math.floor(self.hi / self.step + 1e-9)
        return [round(i * self.step, 10) for i in range(first, last + 1)]


def delta_scale(deltas: Iterable[Delta], width: int, max_ticks: int = 8) -> Scale:
    """A range holding 0 and every delta with its interval, widened to round tick steps."""
    values = [0.0]
    for d in deltas:
        values += [d.value, d.low, d.high]
    lo, hi = min(values), max(values)
    span = max(hi - lo, 1e-9)
    step = next((s for s in NICE_STEPS if span / s <= max_ticks), NICE_STEPS[-1])
    lo = math.floor(lo / step + 1e-9) * step
    hi = math.ceil(hi / step - 1e-9) * step
    if hi - lo < step:
        hi = lo + step
    return Scale(lo, hi, max(2, width), step)


@dataclass(frozen=True)
class Cell:
    """One column of a delta bar: inside the bar or not, and the glyph drawn over it."""

    bar: bool
    glyph: str  # " ", "│" (the zero axis), or the interval's whisker: "├", "─", "┤", "┼", "│"
    whisker: bool = False


def bar_cells(d: Delta, scale: Scale) -> list[Cell]:
    """The bar from 0 to the delta, the 95% interval as a whisker over it, the zero axis under both."""
    zero, end = scale.col(0.0), scale.col(d.value)
    low, high = scale.col(d.low), scale.col(d.high)
    bar_lo, bar_hi = min(zero, end), max(zero, end)
    cells = []
    for c in range(scale.width):
        bar = bar_lo <= c <= bar_hi and bar_lo != bar_hi
        glyph, whisker = " ", False
        if low <= c <= high:
            whisker = True
            if low == high:
                glyph = "┼"
            elif c == low:
                glyph = "├"
            elif c == high:
                glyph = "┤"
            else:
                glyph = "┼" if c == zero else "─"
        elif c == zero:
            glyph = "│"
        cells.append(Cell(bar, glyph, whisker))
    return cells
