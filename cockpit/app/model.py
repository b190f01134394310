"""Frozen snapshots of a Playback: what the screens draw, built off the UI thread.

The follow worker owns the Playback; after each tick it builds a `Snapshot` (header figures, each
chart's traces already bucketed to the width of its widget, the audit, the log tail) and posts it.
Widgets only ever see these immutable snapshots. This module imports no Textual.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from cockpit.app.charts import ChartData, build_charts
from cockpit.plan.audit import plan_warnings
from cockpit.record.format import TERMINAL_STATUSES
from cockpit.record.phases import PHASE_WORDS
from cockpit.record.playback import Playback


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
    resume_hint: str | None = None  # an ended run that can go on: "cockpit resume RUN"
    resume_from: int | None = None  # ... from its checkpoint of this step
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
    has_val_tenants: bool = False  # the record has each tenant's validation loss: `v` shows them
    gpu_axis: str = "total"  # `total`: the GPU chart's axis runs to the GPU's memory; `run`: the run's range


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


def activity(pb: Playback, stop_requested: bool = False) -> str:
    """What the run is doing as of the clock, in words; "" once it has ended (its diagnosis says).
    `stop_requested`: a stop was asked for (the record may not say so yet)."""
    v = pb.view
    status = pb.status()
    if status in TERMINAL_STATUSES:
        return ""
    if status == "planned" and not v.events_seen:
        return "waiting for the supervisor to start"
    if pb.series.stop_requested or stop_requested:
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


def build_header(pb: Playback, lost: str | None = None, stop_sent: bool = False) -> Header:
    """The header's figures as of the clock; `stop_sent`: this viewer asked for a stop (the record
    says so once the supervisor has read the request: the header says STOPPING from the asking on)."""
    v = pb.view
    m = pb.manifest
    status = pb.status()
    ended = status in TERMINAL_STATUSES
    epoch = v.steps[-1].epoch if v.steps else None
    run_id = str(m.get("run_id") or pb.paths.run_id)
    stop_requested = pb.series.stop_requested or (stop_sent and status == "running")
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
    resume_hint, resume_from = None, None
    if status in ("stopped", "failed", "stalled") and v.checkpoints and m.get("mode", "train") == "train":
        resume_hint, resume_from = f"cockpit resume {run_id}", v.checkpoints[-1]
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
        activity=activity(pb, stop_requested),
        eta_note=eta_note,
        resume_hint=resume_hint,
        resume_from=resume_from,
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
    stop_sent: bool = False,
) -> Snapshot:
    """Everything the run screen shows, from the Playback as it stands (call on the Playback's thread);
    `plan` is the run's plan.json, to check the audit against; `gpu_axis` the GPU chart's axis;
    `val_tenants` shows each tenant's validation loss in the loss chart; `stop_sent`: see `build_header`."""
    t0 = time.perf_counter()
    header = build_header(pb, lost, stop_sent)
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
        has_val_tenants=bool(pb.series.val_tenant_loss),
        gpu_axis=gpu_axis,
    )
