"""The run screen's charts as data: each curve of a Playback bucketed to a chart's width. Imports no Textual.

`build_charts` makes the four charts (loss, tokens/s, GPU memory, host RAM) of a snapshot; `ChartData` and
`Trace` are what a `BrailleChart` draws (the compare screen's charts too).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from cockpit.record.downsample import Buckets, Series, bucketize
from cockpit.record.playback import Playback
from cockpit.record.view import TOKENS_WINDOW
from cockpit.units import memory

DEFAULT_DOTS = 200  # bucket count before the widget has told us its width
MUTED = "#8a8a8a"
GPU_COLORS = ("#4e9be6", "#f28e2b", "#e15759", "#59c3a1", "#b07aa1", "#edc948", "#9c755f", "#ff9da7")
PEAK_COLORS = ("#a9d1ff", "#ffd29e", "#ffb0b1", "#b4f0dd", "#e3c3dc", "#fff0a8", "#d9bfae", "#ffd6db")
LOSS_RAW, LOSS_SMOOTH, LOSS_VAL = "#4e79a7", "#f28e2b", "#e15759"
TENANT_COLORS = ("#59c3a1", "#b07aa1", "#edc948", "#9c755f", "#ff9da7", "#76b7b2", "#bab0ac", "#a0cbe8")
THROUGHPUT, THROUGHPUT_MEAN = "#2f7d32", "#7bd36a"
RAM_USED, RAM_RSS, RAM_SWAP = "#4e9be6", "#f28e2b", "#e15759"


@dataclass(frozen=True)
class Trace:
    """One curve, one bucket per dot column: `envelope` draws min..max, `line` draws the mean."""

    label: str
    color: str
    ymin: np.ndarray
    ymax: np.ndarray
    value: str = ""  # the reading the legend gives (said in the chart's note when it is not the latest)
    legend: bool = True  # False: drawn, named elsewhere (a total in the chart's title)
    keep: int = 0  # short of room, the legend drops the values of the lowest first (`cockpit.app.legend`)


@dataclass(frozen=True)
class ChartData:
    title: str
    x_lo: float  # seconds since the first event
    x_hi: float
    y_lo: float
    y_hi: float
    y_unit: str  # "" or "mib" (shown as GiB/MiB)
    traces: tuple[Trace, ...]
    note: str = ""
    empty: str = "no data yet"  # said across the plot while no trace has a point
    marks: tuple[float, ...] = ()  # x positions marked across the plot (where the run resumed)


CHARTS = ("loss", "throughput", "gpu", "host")
GPU_AXES = ("total", "run")


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


@dataclass(frozen=True)
class Window:
    """What the charts show: record times `lo` to `hi`, on the run's own clock: the time between a stop
    and its resume (`RunView.pauses`) is left out, and each resume is a mark on the time axis."""

    lo: float
    hi: float
    pauses: tuple[tuple[float, float], ...] = ()

    def run_time(self, t: np.ndarray) -> np.ndarray:
        """Seconds of the run from `lo` to each record time of `t`, pauses left out."""
        out = t - self.lo
        for a, b in self.pauses:
            out = out - np.clip(t - a, 0.0, b - a)
        return out

    @property
    def x_hi(self) -> float:
        return float(self.run_time(np.array([self.hi]))[0])

    @property
    def marks(self) -> tuple[float, ...]:
        """Where the run resumed, in run seconds."""
        return tuple(float(self.run_time(np.array([b]))[0]) for _, b in self.pauses if self.lo < b <= self.hi)

    def buckets(self, series: Series, n: int) -> Buckets:
        if not self.pauses:  # the run's clock is the record's: no copy of the points
            return series.buckets(self.lo, self.hi, n)
        return bucketize(self.run_time(series.x), series.y, 0.0, self.x_hi, n)


def _envelope(series: Series, w: Window, n: int) -> tuple[np.ndarray, np.ndarray]:
    b = w.buckets(series, n)
    return b.ymin, b.ymax


def _line(series: Series, w: Window, n: int) -> tuple[np.ndarray, np.ndarray]:
    b = w.buckets(series, n)
    return b.ymean, b.ymean


def y_range(
    traces: list[Trace], floor_zero: bool, pad: float = 0.05, keep_positive: bool = False
) -> tuple[float, float]:
    """A chart's y-axis for `traces`: their lowest to their highest value, `pad` of the span added above
    (and below, unless the axis starts at zero: `floor_zero`); `keep_positive`: the padding never takes a
    positive range below zero. 0 to 1 when nothing is drawn; a flat line gets a span of its own."""
    lows = [float(np.nanmin(t.ymin)) for t in traces if np.any(np.isfinite(t.ymin))]
    highs = [float(np.nanmax(t.ymax)) for t in traces if np.any(np.isfinite(t.ymax))]
    if not lows:
        return 0.0, 1.0
    lo, hi = min(lows), max(highs)
    if floor_zero:
        lo = min(0.0, lo)
    if hi - lo < 1e-9:
        hi = lo + (abs(lo) * 0.1 or 1.0)
    span = hi - lo
    bottom = lo if floor_zero else lo - span * pad
    if keep_positive and lo >= 0:
        bottom = max(0.0, bottom)
    return bottom, hi + span * pad


def loss_chart(
    s: Any,
    w: Window,
    k: int,
    val_tenants: bool = False,
    empty: str = "no data yet",
    best: str = "",
) -> ChartData:
    """Training loss (raw and smoothed) beside the validation loss (mean over tenants); with `val_tenants`,
    the validation loss alone, its mean and each tenant's, on their own scale. `best` (the best adapter's
    words) goes in the note. Short of room, the legend keeps the validation loss's value longest."""
    val = Trace("val", LOSS_VAL, *_line(s.val_loss, w, k), value=_fmt(s.val_loss.last, ".4f"), keep=2)
    if val_tenants and s.val_tenant_loss:
        traces = [val]
        for i, (tenant, series) in enumerate(sorted(s.val_tenant_loss.items())):
            color = TENANT_COLORS[i % len(TENANT_COLORS)]
            traces.append(Trace(tenant, color, *_line(series, w, k), value=_fmt(series.last, ".3f")))
        title, shown = "validation loss per tenant", [s.val_loss, *s.val_tenant_loss.values()]
    else:
        raw = Trace("loss", LOSS_RAW, *_envelope(s.loss, w, k), value=_fmt(s.loss.last, ".4f"))
        smooth = Trace(
            "smoothed",
            LOSS_SMOOTH,
            *_line(s.loss_smooth, w, k),
            value=_fmt(s.loss_smooth.last, ".4f"),
            keep=1,
        )
        traces = [raw, smooth, val] if len(s.val_loss) else [raw, smooth]
        title, shown = "loss", [s.loss, s.val_loss]
    y_lo, y_hi = y_range(traces, floor_zero=False)
    ranges = [r for r in (series.y_range(w.lo, w.hi) for series in shown) if r is not None]
    if ranges and min(r[0] for r in ranges) >= 0:
        y_lo = max(y_lo, 0.0)  # a loss is not negative: do not pad below zero
    note = " · ".join(part for part in (best, "┊ resumed" if w.marks else "") if part)
    return ChartData(title, 0.0, w.x_hi, y_lo, y_hi, "", tuple(traces), note=note, empty=empty, marks=w.marks)


def best_note(v: Any) -> str:
    """The loss chart's word on the adapter validation picks: `best val 0.3980 at 120` while training;
    `adapter: val 0.3980 at 120 of 160` once saved (the run's adapter is the best one, of step 120)."""
    if v.best_step is None or v.best_val_loss is None:
        return ""
    if v.adapter is None:
        return f"best val {v.best_val_loss:.4f} at {v.best_step}"
    last = v.adapter.get("last_step")
    of = f" of {last}" if last is not None and last != v.best_step else ""
    return f"adapter: val {v.best_val_loss:.4f} at {v.best_step}{of}"


def build_charts(
    pb: Playback, dots: dict[str, int], gpu_axis: str = "total", waiting: str = "", val_tenants: bool = False
) -> dict[str, ChartData]:
    """The four charts, bucketed to `dots` columns each. `gpu_axis` is the GPU chart's axis (`total`:
    to the GPU's memory; `run`: the run's own range); `waiting` says why a chart of steps is empty;
    `val_tenants` adds each tenant's validation loss to the loss chart."""
    s = pb.series
    v = pb.view
    first = pb.first_t
    shown = pb.shown_t
    if first is None:
        first = shown = 0.0
    w = Window(first, max(shown or first, first + 1.0), tuple(v.pauses))
    x_hi, marks = w.x_hi, w.marks
    no_steps = f"no steps yet: {waiting}" if waiting else "no steps yet"
    no_telemetry = "no telemetry yet" if pb.live else "no telemetry in this record"

    def n(name: str) -> int:
        return max(2, dots.get(name, DEFAULT_DOTS))

    charts: dict[str, ChartData] = {}

    # loss: raw (min..max per column), smoothed (EMA, averaged per column), validation
    charts["loss"] = loss_chart(s, w, n("loss"), val_tenants, empty=no_steps, best=best_note(v))

    # throughput: the legend gives the header's figure (the median of the last steps) and the run's mean
    k = n("throughput")
    tps = Trace("tokens/s", THROUGHPUT, *_envelope(s.tokens_per_s, w, k), value=_fmt(v.tokens_per_s, ",.0f"))
    mean = Trace(
        "mean", THROUGHPUT_MEAN, *_line(s.tokens_per_s, w, k), value=_fmt(v.mean_tokens_per_s, ",.0f")
    )
    y_lo, y_hi = y_range([tps], floor_zero=True)
    charts["throughput"] = ChartData(
        "tokens/s",
        0.0,
        x_hi,
        y_lo,
        y_hi,
        "",
        (tps, mean),
        note=f"median of last {TOKENS_WINDOW}",
        empty=no_steps,
        marks=marks,
    )

    # GPU memory: used (NVML) and the trainer's CUDA peak per rank, against the GPU's total or on their own
    k = n("gpu")
    traces: list[Trace] = []
    # Several nodes: each rank's line by its host and index; the sampler's GPUs are its own host's.
    label, several = pb.view.rank_label, pb.view.nodes > 1
    here = f"{(pb.manifest.get('host') or {}).get('hostname', '?')} " if several else ""
    peaks = [
        Trace(
            f"peak {label(r)}",
            PEAK_COLORS[r % len(PEAK_COLORS)],
            *_line(peak, w, k),
            value=memory(peak.last, short=True),
        )
        for r, peak in sorted(s.rank_peak.items())
    ]
    if len(peaks) > 2:  # one legend entry for every rank's peak: the GPUs' own entries keep their room
        known = [p.last for p in s.rank_peak.values() if p.last is not None]
        span = f"{memory(min(known), short=True)}–{memory(max(known), short=True)}" if known else "-"
        peaks = [
            dataclasses.replace(t, label=f"peak r0–{len(peaks) - 1}", value=span)
            if i == 0
            else dataclasses.replace(t, legend=False)
            for i, t in enumerate(peaks)
        ]
    if s.has_gpus:
        for i, used in sorted(s.gpu_used.items()):
            color = GPU_COLORS[i % len(GPU_COLORS)]
            traces.append(
                Trace(f"{here}GPU{i}", color, *_envelope(used, w, k), value=memory(used.last, short=True))
            )
        traces += peaks
        totals = [t for t in s.gpu_total.values() if len(t)]
        title = "GPU memory"
        if totals:
            total = max(totals, key=lambda t: t.last or 0)
            title = f"GPU memory · {memory(total.last, short=True)} each"
            if gpu_axis == "total":
                traces.insert(0, Trace("total", MUTED, *_line(total, w, k), legend=False))
        if gpu_axis == "total":
            y_lo, y_hi = y_range(traces, floor_zero=True, pad=0.02)
            gpu_note = "g: the run's range"
        else:
            y_lo, y_hi = y_range(traces, floor_zero=False, pad=0.1)
            y_lo = max(0.0, y_lo)
            gpu_note = "g: to the GPU's total"
        gpu_empty = no_telemetry
    else:
        for r, rss in sorted(s.rank_rss.items()):
            color = GPU_COLORS[r % len(GPU_COLORS)]
            name = f"{label(r)} RSS" if several else f"rank{r} RSS"
            traces.append(Trace(name, color, *_envelope(rss, w, k), value=memory(rss.last, short=True)))
        traces += peaks
        y_lo, y_hi = y_range(traces, floor_zero=True)
        info = s.telemetry_info or {}
        nvml = str(info.get("nvml", ""))
        gpu_note = (
            "no NVML: each rank's RSS" if nvml.startswith("not available") else "no GPU: each rank's RSS"
        )
        title = "GPU memory · no GPU"
        gpu_empty = no_steps
    charts["gpu"] = ChartData(
        title, 0.0, x_hi, y_lo, y_hi, "mib", tuple(traces), note=gpu_note, empty=gpu_empty, marks=marks
    )

    # host RAM: used against total (in the title), the run's process tree RSS, swap
    k = n("host")
    host = [
        Trace("total", MUTED, *_line(s.ram_total, w, k), legend=False),
        Trace("used", RAM_USED, *_envelope(s.ram_used, w, k), value=memory(s.ram_used.last, short=True)),
        Trace("run RSS", RAM_RSS, *_envelope(s.run_rss, w, k), value=memory(s.run_rss.last, short=True)),
    ]
    if s.swap_used.last:
        host.append(
            Trace("swap", RAM_SWAP, *_envelope(s.swap_used, w, k), value=memory(s.swap_used.last, short=True))
        )
    y_lo, y_hi = y_range(host, floor_zero=True, pad=0.02)
    cpu = s.last_host.get("cpu_pct")
    note = "" if cpu is None else f"CPU {cpu:.0f}%"
    title = f"host RAM · {memory(s.ram_total.last, short=True)} total" if s.ram_total.last else "host RAM"
    charts["host"] = ChartData(
        title, 0.0, x_hi, y_lo, y_hi, "mib", tuple(host), note=note, empty=no_telemetry, marks=marks
    )
    return charts
