"""Frozen snapshots of a Playback: what the screens draw, built off the UI thread.

The follow worker owns the Playback; after each tick it builds a `Snapshot` (header figures, each
chart's traces already bucketed to the width of its widget, the audit, the log tail) and posts it.
Widgets only ever see these immutable snapshots. This module imports no Textual.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from cockpit.downsample import Buckets, Series
from cockpit.plan.audit import plan_warnings
from cockpit.record.format import TERMINAL_STATUSES
from cockpit.record.playback import Playback

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
    value: str = ""  # the latest reading, for the legend


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


@dataclass(frozen=True)
class Header:
    run_id: str
    profile: str
    status: str
    phase: str
    step: int
    max_steps: int | None
    epoch: float | None
    elapsed_s: float
    eta_s: float | None
    loss: float | None
    tokens_per_s: float | None
    live: bool
    following: bool
    paused: bool
    speed: float
    loading: float | None  # fraction while the history is still being read, else None
    diagnosis: str | None
    stop_requested: bool
    eval_progress: str | None = None  # "adapter 120/200" while the evaluation stage runs
    warning: str | None = None  # a stall suspected, the supervisor lost
    phase_message: str | None = None  # what the trainer says of its phase ("building DeepSpeed CPU ops ...")


@dataclass(frozen=True)
class Audit:
    fraction_4bit: float | None
    params_trainable: int | None
    params_total: int | None
    requested: dict[str, Any]
    applied: dict[str, Any]
    lora_targets: dict[str, int]
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class Snapshot:
    header: Header
    charts: dict[str, ChartData]
    audit: Audit | None
    log_lines: tuple[str, ...]
    built_ms: float = 0.0  # building this snapshot (bucketing every chart), on the worker
    tick_ms: float = 0.0  # the Playback tick before it (read new lines, fold), on the worker
    report_due: bool = False  # the record, as of the clock, has an evaluation report (see `report_due`)
    prediction_due: bool = False  # the record, as of the clock, has a rehearsal's prediction


CHARTS = ("loss", "throughput", "gpu", "host")


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def fmt_mib(mib: float | None) -> str:
    """Memory for a legend: `23.5G`, `743M` (GiB and MiB)."""
    if mib is None:
        return "-"
    return f"{mib / 1024:.1f}G" if abs(mib) >= 1024 else f"{mib:.0f}M"


def _envelope(series: Series, lo: float, hi: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    b: Buckets = series.buckets(lo, hi, n)
    return b.ymin, b.ymax


def _line(series: Series, lo: float, hi: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    b = series.buckets(lo, hi, n)
    return b.ymean, b.ymean


def _range(traces: list[Trace], floor_zero: bool, pad: float = 0.05) -> tuple[float, float]:
    lows = [np.nanmin(t.ymin) for t in traces if np.any(~np.isnan(t.ymin))]
    highs = [np.nanmax(t.ymax) for t in traces if np.any(~np.isnan(t.ymax))]
    if not lows:
        return 0.0, 1.0
    lo, hi = float(min(lows)), float(max(highs))
    if floor_zero:
        lo = min(0.0, lo)
    if hi - lo < 1e-9:
        hi = lo + (abs(lo) * 0.1 or 1.0)
    span = hi - lo
    return (lo if floor_zero else lo - span * pad), hi + span * pad


def loss_chart(s: Any, lo: float, hi: float, k: int, x_hi: float, val_tenants: bool = False) -> ChartData:
    """Training loss (raw and smoothed) beside the validation loss (mean over tenants), and each tenant's
    validation loss when `val_tenants` is on."""
    raw = Trace("loss", LOSS_RAW, *_envelope(s.loss, lo, hi, k), value=_fmt(s.loss.last, ".4f"))
    smooth = Trace(
        "smoothed", LOSS_SMOOTH, *_line(s.loss_smooth, lo, hi, k), value=_fmt(s.loss_smooth.last, ".4f")
    )
    traces = [raw, smooth]
    if len(s.val_loss):
        traces.append(
            Trace("val", LOSS_VAL, *_line(s.val_loss, lo, hi, k), value=_fmt(s.val_loss.last, ".4f"))
        )
    if val_tenants:
        for i, (tenant, series) in enumerate(sorted(s.val_tenant_loss.items())):
            color = TENANT_COLORS[i % len(TENANT_COLORS)]
            traces.append(
                Trace(f"val {tenant}", color, *_line(series, lo, hi, k), value=_fmt(series.last, ".3f"))
            )
    y_lo, y_hi = _range(traces, floor_zero=False)
    ranges = [r for r in (s.loss.y_range(lo, hi), s.val_loss.y_range(lo, hi)) if r is not None]
    if ranges and min(r[0] for r in ranges) >= 0:
        y_lo = max(y_lo, 0.0)  # a loss is not negative: do not pad below zero
    note = "" if val_tenants or not s.val_tenant_loss else "v: validation loss per tenant"
    return ChartData("loss", 0.0, x_hi, y_lo, y_hi, "", tuple(traces), note=note)


def build_charts(pb: Playback, dots: dict[str, int], val_tenants: bool = False) -> dict[str, ChartData]:
    s = pb.series
    first = pb.first_t
    shown = pb.shown_t
    if first is None:
        first = shown = 0.0
    lo = first
    hi = max(shown or first, first + 1.0)
    x_hi = hi - first

    def n(name: str) -> int:
        return max(2, dots.get(name, DEFAULT_DOTS))

    charts: dict[str, ChartData] = {}

    # loss: raw (min..max per column), smoothed (EMA, averaged per column), validation
    charts["loss"] = loss_chart(s, lo, hi, n("loss"), x_hi, val_tenants)

    # throughput
    k = n("throughput")
    tps = Trace(
        "tokens/s", THROUGHPUT, *_envelope(s.tokens_per_s, lo, hi, k), value=_fmt(s.tokens_per_s.last, ",.0f")
    )
    mean = Trace("mean", THROUGHPUT_MEAN, *_line(s.tokens_per_s, lo, hi, k))
    y_lo, y_hi = _range([tps], floor_zero=True)
    median = pb.view.tokens_per_s
    charts["throughput"] = ChartData(
        "tokens/s", 0.0, x_hi, y_lo, y_hi, "", (tps, mean), note=f"median of last 20: {_fmt(median, ',.0f')}"
    )

    # GPU memory: used (NVML) against total, and the trainer's CUDA peak per rank
    k = n("gpu")
    traces: list[Trace] = []
    peaks = [
        Trace(
            f"peak r{r}", PEAK_COLORS[r % len(PEAK_COLORS)], *_line(peak, lo, hi, k), value=fmt_mib(peak.last)
        )
        for r, peak in sorted(s.rank_peak.items())
    ]
    if s.has_gpus:
        for i, used in sorted(s.gpu_used.items()):
            color = GPU_COLORS[i % len(GPU_COLORS)]
            traces.append(Trace(f"GPU{i}", color, *_envelope(used, lo, hi, k), value=fmt_mib(used.last)))
        traces += peaks
        totals = [t for t in s.gpu_total.values() if len(t)]
        if totals:
            total = max(totals, key=lambda t: t.last or 0)
            traces.insert(0, Trace("total", MUTED, *_line(total, lo, hi, k), value=fmt_mib(total.last)))
        y_lo, y_hi = _range(traces, floor_zero=True, pad=0.02)
        gpu_note = ""
        title = "GPU memory"
    else:
        for r, rss in sorted(s.rank_rss.items()):
            color = GPU_COLORS[r % len(GPU_COLORS)]
            traces.append(Trace(f"rank{r} RSS", color, *_envelope(rss, lo, hi, k), value=fmt_mib(rss.last)))
        traces += peaks
        y_lo, y_hi = _range(traces, floor_zero=True)
        info = s.telemetry_info or {}
        nvml = str(info.get("nvml", "no telemetry"))
        nvml = "NVML not available" if nvml.startswith("not available") else nvml
        gpu_note = f"{nvml}: each rank's process RSS instead"
        title = "GPU memory · no GPU"
    charts["gpu"] = ChartData(title, 0.0, x_hi, y_lo, y_hi, "mib", tuple(traces), note=gpu_note)

    # host RAM: used against total, the run's process tree RSS, swap
    k = n("host")
    host = [
        Trace("total", MUTED, *_line(s.ram_total, lo, hi, k), value=fmt_mib(s.ram_total.last)),
        Trace("used", RAM_USED, *_envelope(s.ram_used, lo, hi, k), value=fmt_mib(s.ram_used.last)),
        Trace("run RSS", RAM_RSS, *_envelope(s.run_rss, lo, hi, k), value=fmt_mib(s.run_rss.last)),
    ]
    if s.swap_used.last:
        host.append(
            Trace("swap", RAM_SWAP, *_envelope(s.swap_used, lo, hi, k), value=fmt_mib(s.swap_used.last))
        )
    y_lo, y_hi = _range(host, floor_zero=True, pad=0.02)
    cpu = s.last_host.get("cpu_pct")
    note = "" if s.telemetry_samples else "no telemetry in this record"
    if cpu is not None:
        note = f"CPU {cpu:.0f}%"
    charts["host"] = ChartData("host RAM", 0.0, x_hi, y_lo, y_hi, "mib", tuple(host), note=note)
    return charts


def build_header(pb: Playback, lost: str | None = None) -> Header:
    v = pb.view
    m = pb.manifest
    status = pb.status()
    epoch = v.steps[-1].epoch if v.steps else None
    eta = None if status in TERMINAL_STATUSES else v.eta_s()
    return Header(
        run_id=str(m.get("run_id") or pb.paths.run_id),
        profile=str(m.get("profile_name") or "?"),
        status=status,
        phase=v.phase,
        phase_message=v.phase_message,
        step=v.step,
        max_steps=v.max_steps,
        epoch=epoch,
        elapsed_s=pb.elapsed_s(),
        eta_s=eta,
        loss=v.last_loss,
        tokens_per_s=v.tokens_per_s,
        live=pb.live,
        following=pb.follow,
        paused=pb.paused,
        speed=pb.speed,
        loading=None if pb.loaded else pb.load_fraction,
        diagnosis=pb.series.diagnosis or m.get("diagnosis") if status in TERMINAL_STATUSES else None,
        stop_requested=pb.series.stop_requested,
        warning=(lost or pb.manifest.get("warning")) if status == "running" and pb.follow else None,
        eval_progress=(
            f"{v.eval_system or 'eval'} {v.eval_done}/{v.eval_total}"
            if v.phase == "eval" and v.eval_total
            else None
        ),
    )


def build_audit(pb: Playback, plan: dict[str, Any] | None = None) -> Audit | None:
    """The audit panel: the trainer's audit, its warnings, then what it costs against the run's `plan`."""
    a = pb.view.audit
    if not a:
        return None
    return Audit(
        fraction_4bit=a.get("fraction_4bit"),
        params_trainable=a.get("params_trainable"),
        params_total=a.get("params_total"),
        requested=dict(a.get("requested") or {}),
        applied=dict(a.get("applied") or {}),
        lora_targets=dict(a.get("lora_targets") or {}),
        warnings=(*pb.view.warnings, *plan_warnings(a, plan)),
    )


def report_due(pb: Playback) -> bool:
    """Whether the evaluation report belongs to the record as of the clock.

    Live is replay with the clock at now: the report is due once the fold has passed the supervisor's
    `report` event (live: as soon as it is written; replay: when the clock gets there). A report made
    outside the run (`cockpit report`, `cockpit import --show`), or predictions without a report, have
    no event: they count once the record is shown at its end and the run is over. Two stats at most:
    call it on the worker.
    """
    if pb.view.report is not None:
        return True
    if not pb.follow or pb.status() not in TERMINAL_STATUSES:
        return False
    from cockpit.report.store import has_report

    return has_report(pb.paths.root)


def build_snapshot(
    pb: Playback,
    dots: dict[str, int],
    log_lines: int = 200,
    tick_ms: float = 0.0,
    lost: str | None = None,
    plan: dict[str, Any] | None = None,
    val_tenants: bool = False,
) -> Snapshot:
    """Everything the run screen shows, from the Playback as it stands (call on the Playback's thread);
    `plan` is the run's plan.json, to check the audit against; `val_tenants` adds each tenant's
    validation loss to the loss chart."""
    t0 = time.perf_counter()
    charts = build_charts(pb, dots, val_tenants)
    header = build_header(pb, lost)
    audit = build_audit(pb, plan)
    log = tuple(pb.output_tail(log_lines))
    due = report_due(pb)
    built_ms = (time.perf_counter() - t0) * 1000
    predicted = pb.view.rehearsal is not None
    return Snapshot(
        header,
        charts,
        audit,
        log,
        built_ms=built_ms,
        tick_ms=tick_ms,
        report_due=due,
        prediction_due=predicted,
    )
