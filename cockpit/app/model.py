"""Frozen snapshots of a Playback: what the screens draw, built off the UI thread.

The follow worker owns the Playback; after each tick it builds a `Snapshot` (header figures, each
chart's traces already bucketed to the width of its widget, the audit, the log tail) and posts it.
Widgets only ever see these immutable snapshots. This module imports no Textual.
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from cockpit.downsample import Buckets, Series
from cockpit.plan.audit import plan_warnings
from cockpit.record.format import TERMINAL_STATUSES
from cockpit.record.playback import Playback
from cockpit.record.view import TOKENS_WINDOW

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
    activity: str = ""  # what is under way, in words: "loading the model: layer 3 of 8"; "" once ended
    eta_note: str = ""  # what the ETA leaves out or waits for: "+ eval", "eval next"
    resume_hint: str | None = None  # an ended run that can go on: "cockpit resume RUN continues from step N"
    catching_up: bool = False  # the fold is still on its way to the clock (a jump to the end of a replay)

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def stopping(self) -> bool:
        """Running, with a stop asked for: the header says STOPPING, not RUNNING."""
        return self.status == "running" and self.stop_requested

    @property
    def mode(self) -> str:
        """What the viewer shows: `live`, `paused` (a live view frozen), `behind` (a live view played
        back), `ended` (a live view of a run that is over), or `replay`."""
        if not self.live:
            return "replay"
        if self.following:
            return "ended" if self.ended else "live"
        return "paused" if self.paused else "behind"


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
    has_gpus: bool = False  # the record has GPU telemetry: the GPU chart's axis can be switched
    gpu_axis: str = "total"  # `total`: the GPU chart's axis runs to the GPU's memory; `run`: the run's range


CHARTS = ("loss", "throughput", "gpu", "host")
GPU_AXES = ("total", "run")
PHASE_WORDS = {
    "starting": "starting the trainer (launcher, imports)",
    "setup": "setting up",
    "load": "loading the model",
    "build": "building DeepSpeed ops",
    "train": "training",
    "save": "saving the adapter",
    "done": "training over",
    "stopped": "the trainer stopped",
    "eval": "evaluating on the held-out split",
    "report": "writing the evaluation report",
}


# `[2026-11-30 05:30:03,469] [WARNING] [real_accelerator.py:213:get_accelerator] text`: DeepSpeed's logger
_DS_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+\] \[(\w+)\] \[[^\]]*\] ")
_SITE_PACKAGES = re.compile(r"^\S*/(?:site|dist)-packages/")  # a Python warning's path to a library


def compact_log_line(line: str) -> str:
    """A line of output.log as the log pane shows it: DeepSpeed's time, level and source location become
    the level alone (`WARNING Setting accelerator to CPU...`), a library's path its package-relative one."""
    m = _DS_PREFIX.match(line)
    if m:
        level = m.group(1)
        return f"{level} {line[m.end() :]}" if level != "INFO" else line[m.end() :]
    return _SITE_PACKAGES.sub("", line, count=1)


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


def loss_chart(
    s: Any,
    lo: float,
    hi: float,
    k: int,
    x_hi: float,
    val_tenants: bool = False,
    empty: str = "no data yet",
    best: str = "",
) -> ChartData:
    """Training loss (raw and smoothed) beside the validation loss (mean over tenants), and each tenant's
    validation loss when `val_tenants` is on; `best` (the best adapter's words) goes in the note."""
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
    hint = "" if val_tenants or not s.val_tenant_loss else "v: validation loss per tenant"
    note = " · ".join(part for part in (best, hint) if part)
    return ChartData("loss", 0.0, x_hi, y_lo, y_hi, "", tuple(traces), note=note, empty=empty)


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
    lo = first
    hi = max(shown or first, first + 1.0)
    x_hi = hi - first
    no_steps = f"no steps yet: {waiting}" if waiting else "no steps yet"
    no_telemetry = "no telemetry yet" if pb.live else "no telemetry in this record"

    def n(name: str) -> int:
        return max(2, dots.get(name, DEFAULT_DOTS))

    charts: dict[str, ChartData] = {}

    # loss: raw (min..max per column), smoothed (EMA, averaged per column), validation
    charts["loss"] = loss_chart(s, lo, hi, n("loss"), x_hi, val_tenants, empty=no_steps, best=best_note(v))

    # throughput: the legend gives the header's figure (the median of the last steps) and the run's mean
    k = n("throughput")
    tps = Trace(
        "tokens/s", THROUGHPUT, *_envelope(s.tokens_per_s, lo, hi, k), value=_fmt(v.tokens_per_s, ",.0f")
    )
    mean = Trace(
        "mean", THROUGHPUT_MEAN, *_line(s.tokens_per_s, lo, hi, k), value=_fmt(v.mean_tokens_per_s, ",.0f")
    )
    y_lo, y_hi = _range([tps], floor_zero=True)
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
            *_line(peak, lo, hi, k),
            value=fmt_mib(peak.last),
        )
        for r, peak in sorted(s.rank_peak.items())
    ]
    if len(peaks) > 2:  # one legend entry for every rank's peak: the GPUs' own entries keep their room
        known = [p.last for p in s.rank_peak.values() if p.last is not None]
        span = f"{fmt_mib(min(known))}–{fmt_mib(max(known))}" if known else "-"
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
                Trace(f"{here}GPU{i}", color, *_envelope(used, lo, hi, k), value=fmt_mib(used.last))
            )
        traces += peaks
        totals = [t for t in s.gpu_total.values() if len(t)]
        title = "GPU memory"
        if totals:
            total = max(totals, key=lambda t: t.last or 0)
            title = f"GPU memory · {fmt_mib(total.last)} each"
            if gpu_axis == "total":
                traces.insert(0, Trace("total", MUTED, *_line(total, lo, hi, k), legend=False))
        if gpu_axis == "total":
            y_lo, y_hi = _range(traces, floor_zero=True, pad=0.02)
            gpu_note = "g: the run's range"
        else:
            y_lo, y_hi = _range(traces, floor_zero=False, pad=0.1)
            y_lo = max(0.0, y_lo)
            gpu_note = "g: to the GPU's total"
        gpu_empty = no_telemetry
    else:
        for r, rss in sorted(s.rank_rss.items()):
            color = GPU_COLORS[r % len(GPU_COLORS)]
            name = f"{label(r)} RSS" if several else f"rank{r} RSS"
            traces.append(Trace(name, color, *_envelope(rss, lo, hi, k), value=fmt_mib(rss.last)))
        traces += peaks
        y_lo, y_hi = _range(traces, floor_zero=True)
        info = s.telemetry_info or {}
        nvml = str(info.get("nvml", ""))
        gpu_note = (
            "no NVML: each rank's RSS" if nvml.startswith("not available") else "no GPU: each rank's RSS"
        )
        title = "GPU memory · no GPU"
        gpu_empty = no_steps
    charts["gpu"] = ChartData(
        title, 0.0, x_hi, y_lo, y_hi, "mib", tuple(traces), note=gpu_note, empty=gpu_empty
    )

    # host RAM: used against total (in the title), the run's process tree RSS, swap
    k = n("host")
    host = [
        Trace("total", MUTED, *_line(s.ram_total, lo, hi, k), legend=False),
        Trace("used", RAM_USED, *_envelope(s.ram_used, lo, hi, k), value=fmt_mib(s.ram_used.last)),
        Trace("run RSS", RAM_RSS, *_envelope(s.run_rss, lo, hi, k), value=fmt_mib(s.run_rss.last)),
    ]
    if s.swap_used.last:
        host.append(
            Trace("swap", RAM_SWAP, *_envelope(s.swap_used, lo, hi, k), value=fmt_mib(s.swap_used.last))
        )
    y_lo, y_hi = _range(host, floor_zero=True, pad=0.02)
    cpu = s.last_host.get("cpu_pct")
    note = "" if cpu is None else f"CPU {cpu:.0f}%"
    title = f"host RAM · {fmt_mib(s.ram_total.last)} total" if s.ram_total.last else "host RAM"
    charts["host"] = ChartData(
        title, 0.0, x_hi, y_lo, y_hi, "mib", tuple(host), note=note, empty=no_telemetry
    )
    return charts


def activity(pb: Playback) -> str:
    """What the run is doing as of the clock, in words; "" once it has ended (its diagnosis says)."""
    v = pb.view
    status = pb.status()
    if status in TERMINAL_STATUSES:
        return ""
    if status == "planned" and not v.events_seen:
        return "waiting for the supervisor to start"
    if pb.series.stop_requested:
        if v.trainer_outcome == "stopped" or v.phase == "stopped":
            saved = " with a checkpoint" if v.checkpoints and v.checkpoints[-1] == v.step else ""
            return f"stopped at step {v.step}{saved}; closing"
        if v.phase == "eval":
            return "stop requested: the evaluation ends"
        return "stop requested: a checkpoint after this step, then exit"
    if v.phase == "eval":
        if not v.eval_total:
            return "evaluating: loading the model"
        systems = v.eval_systems
        which = (
            f" ({systems.index(v.eval_system) + 1} of {len(systems)})"
            if v.eval_system in systems and len(systems) > 1
            else ""
        )
        return f"evaluating {v.eval_system} {v.eval_done}/{v.eval_total}{which}"
    resumed = v.resumed and len(v.steps) <= v.attempt_from  # a resume, before its first step
    words = v.phase_message or PHASE_WORDS.get(v.phase, v.phase)
    if v.phase == "load" and v.load_layers:
        words = f"loading the model: {v.load_words()}"
    elif v.phase == "train" and not v.phase_message and len(v.steps) <= v.attempt_from:
        words = "the engine is built: waiting for the first step"
    if resumed and v.phase in ("starting", "setup", "load", "build", "train"):
        return f"resuming from step {v.step}: {words}"
    return words


def build_header(pb: Playback, lost: str | None = None) -> Header:
    v = pb.view
    m = pb.manifest
    status = pb.status()
    ended = status in TERMINAL_STATUSES
    epoch = v.steps[-1].epoch if v.steps else None
    run_id = str(m.get("run_id") or pb.paths.run_id)
    stop_requested = pb.series.stop_requested
    eval_next = (
        m.get("mode", "train") == "train"
        and bool(((m.get("profile") or {}).get("eval") or {}).get("enabled"))
        and v.phase not in ("eval", "report")
        and not stop_requested
    )
    eta, eta_note = (None if ended or stop_requested else v.eta_s()), ""
    if not ended and eval_next:
        if v.phase in ("save", "done"):
            eta, eta_note = None, "eval next"
        elif eta is not None:
            eta_note = "+ eval"
    training_figures = ended or v.phase not in ("eval", "report")
    resume_hint = None
    if status in ("stopped", "failed", "stalled") and v.checkpoints and m.get("mode", "train") == "train":
        resume_hint = f"cockpit resume {run_id} continues from step {v.checkpoints[-1]}"
    return Header(
        run_id=run_id,
        profile=str(m.get("profile_name") or "?"),
        status=status,
        phase=v.phase,
        phase_message=v.phase_message,
        step=v.step,
        max_steps=v.max_steps,
        epoch=epoch,
        elapsed_s=pb.elapsed_s(),
        eta_s=eta,
        # Training's figures, while it trains (and once the run is over); not beside an evaluation's progress.
        loss=v.last_loss if training_figures else None,
        tokens_per_s=v.tokens_per_s if training_figures else None,
        live=pb.live,
        following=pb.follow,
        paused=pb.paused,
        speed=pb.speed,
        loading=None if pb.loaded else pb.load_fraction,
        diagnosis=pb.series.diagnosis or m.get("diagnosis") if ended else None,
        stop_requested=stop_requested,
        warning=(lost or pb.manifest.get("warning")) if status == "running" and pb.follow else None,
        eval_progress=(
            f"{v.eval_system or 'eval'} {v.eval_done}/{v.eval_total}"
            if v.phase == "eval" and v.eval_total
            else None
        ),
        activity=activity(pb),
        eta_note=eta_note,
        resume_hint=resume_hint,
        catching_up=pb.catching_up,
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
    gpu_axis: str = "total",
    val_tenants: bool = False,
) -> Snapshot:
    """Everything the run screen shows, from the Playback as it stands (call on the Playback's thread);
    `plan` is the run's plan.json, to check the audit against; `gpu_axis` the GPU chart's axis;
    `val_tenants` adds each tenant's validation loss to the loss chart."""
    t0 = time.perf_counter()
    header = build_header(pb, lost)
    charts = build_charts(pb, dots, gpu_axis, waiting=header.activity, val_tenants=val_tenants)
    audit = build_audit(pb, plan)
    log = tuple(compact_log_line(line) for line in pb.output_tail(log_lines))
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
        has_gpus=pb.series.has_gpus,
        gpu_axis=gpu_axis,
    )
