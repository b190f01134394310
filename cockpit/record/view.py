"""The state of a run, folded from its events: what every viewer (headless, TUI, replay) shows.

Feed it events in time order with `apply` (or rows of step and telemetry events as columns with
`apply_block`); read its fields. Live viewing is replay with the clock at now: the same fold, fed as
lines arrive. Checking the audit against the run's plan is the viewers' business, not the record's.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from cockpit.record.bulk import Block
from cockpit.record.fold import Fold
from cockpit.record.reader import Event


def _num(value: Any) -> Any:
    """A column value as the event held it: NaN (a null) back to None."""
    return None if value is None or value != value else float(value)


def _int(value: Any) -> int | None:
    return None if value is None or value != value else int(value)


@dataclass(slots=True)
class StepPoint:
    """One optimizer step as seen by rank 0."""

    t: float
    step: int
    loss: float | None
    tokens_per_s: float | None
    step_time_s: float | None
    learning_rate: float | None
    grad_norm: float | None
    epoch: float | None


@dataclass
class RunView(Fold):
    """Everything a viewer needs, updated event by event (or block by block)."""

    phase: str = "starting"
    phase_t: float | None = None  # when rank 0 entered `phase`
    phase_message: str | None = None  # what rank 0 said of its phase (the `build` phase says what it builds)
    max_steps: int | None = None
    start_step: int = 0
    train_started_t: float | None = None
    first_t: float | None = None
    last_t: float | None = None
    steps: list[StepPoint] = field(default_factory=list)
    step_events: int = 0  # rank 0's step events folded, also those a resume replaced (the log's lines)
    audit: dict[str, Any] | None = None
    load_peaks: dict[int, dict[str, Any]] = field(default_factory=dict)
    memory: dict[int, dict[str, Any]] = field(default_factory=dict)  # last step event's memory, per rank
    checkpoints: list[int] = field(default_factory=list)
    trainer_outcome: str | None = None
    supervisor_notes: list[str] = field(default_factory=list)
    eval_done: int = 0
    eval_total: int = 0
    eval_system: str | None = None
    report: dict[str, Any] | None = None  # the supervisor's `report` event: report.json is written
    rehearsal: dict[str, Any] | None = None  # the supervisor's `rehearsal` event: rehearsal.json is written
    val_loss: float | None = None  # the last validation loss (mean over tenants) and its step
    val_step: int | None = None
    early_stop: str | None = None  # why early stopping ended training (the trainer's `early_stop` event)
    events_seen: int = 0

    def apply_event(self, e: Event) -> None:
        self._seen(1, e["t"], e["t"])
        super().apply_event(e)

    def apply_block(self, block: Block, lo: int = 0, hi: int | None = None) -> None:
        """Fold rows `lo:hi` of a block: one rank's rows of one kind in time order, with no other event of
        that rank between them."""
        hi = len(block) if hi is None else hi
        if hi <= lo:
            return
        self._seen(hi - lo, float(block.t[lo]), float(block.t[hi - 1]))
        if block.kind == "step":
            self._fold_steps(block.rank or 0, block.columns, lo, hi)

    def _seen(self, n: int, t0: float, t1: float) -> None:
        self.events_seen += n
        self.first_t = t0 if self.first_t is None else min(self.first_t, t0)
        self.last_t = t1 if self.last_t is None else max(self.last_t, t1)

    # --- one fold per kind: step rows in blocks, the rest event by event ------------------------
    def _fold_steps(self, rank: int, columns: dict[str, Any], lo: int, hi: int) -> None:
        t, last = columns["t"], hi - 1
        self.memory[rank] = {k: _num(v[last]) for k, v in columns.items() if k.endswith("_mib")}
        if rank != 0:
            return
        if "max_steps" in columns:
            self.max_steps = _int(columns["max_steps"][last])

        def col(name: str) -> list[Any]:
            values = columns.get(name)
            return [None] * (hi - lo) if values is None else [_num(v) for v in values[lo:hi].tolist()]

        steps = [int(s) for s in columns["step"][lo:hi].tolist()]
        self.step_events += len(steps)
        self.steps.extend(
            map(
                StepPoint,
                t[lo:hi].tolist(),
                steps,
                col("loss"),
                col("tokens_per_s"),
                col("step_time_s"),
                col("learning_rate"),
                col("grad_norm"),
                col("epoch"),
            )
        )

    def _on_phase(self, e: Event) -> None:
        if e.get("rank", 0) == 0:
            self.phase, self.phase_t, self.phase_message = e["phase"], e["t"], e.get("message")

    def _on_launch(self, e: Event) -> None:
        """A new training attempt (a resume): the last attempt's phase and outcome no longer hold."""
        if e.get("stage") == "train":
            self.phase, self.phase_t, self.trainer_outcome = "starting", e["t"], None
            self.phase_message = self.early_stop = None

    def _on_train_begin(self, e: Event) -> None:
        if e.get("rank", 0) != 0:
            return
        self.max_steps = e.get("max_steps")
        self.start_step = e.get("start_step", 0)
        self.train_started_t = e["t"]
        # A resumed run repeats the steps after its checkpoint: the new ones replace the old.
        self.steps = [s for s in self.steps if s.step <= self.start_step]

    def _on_audit(self, e: Event) -> None:
        if e.get("rank", 0) == 0:
            self.audit = e

    def _on_load_peak(self, e: Event) -> None:
        self.load_peaks[e.get("rank", 0)] = e

    def _on_checkpoint(self, e: Event) -> None:
        if e.get("rank", 0) == 0:
            self.checkpoints.append(e["step"])

    def _on_trainer_end(self, e: Event) -> None:
        if e.get("rank", 0) == 0:
            self.trainer_outcome = e.get("outcome")
            self.phase = "done" if self.trainer_outcome == "finished" else self.trainer_outcome or "done"

    def _on_val_loss(self, e: Event) -> None:
        if e.get("rank", 0) == 0:
            self.val_loss, self.val_step = e.get("loss"), e.get("step")

    def _on_early_stop(self, e: Event) -> None:
        if e.get("rank", 0) == 0:
            self.early_stop = e.get("reason")

    def _on_eval_begin(self, e: Event) -> None:
        self.phase = "eval"

    def _on_eval_progress(self, e: Event) -> None:
        self.phase = "eval"
        self.eval_system = e.get("system")
        self.eval_done, self.eval_total = e.get("done", 0), e.get("total", 0)

    def _on_eval_end(self, e: Event) -> None:
        self.phase = "report"

    def _on_report(self, e: Event) -> None:
        self.report = e

    def _on_rehearsal(self, e: Event) -> None:
        self.rehearsal = e

    def _on_note(self, e: Event) -> None:
        self.supervisor_notes.append(e.get("message", ""))

    # --- derived figures -------------------------------------------------------------------------
    @property
    def step(self) -> int:
        return self.steps[-1].step if self.steps else self.start_step

    @property
    def last_loss(self) -> float | None:
        return self.steps[-1].loss if self.steps else None

    @property
    def tokens_per_s(self) -> float | None:
        recent = [s.tokens_per_s for s in self.steps[-20:] if s.tokens_per_s]
        return statistics.median(recent) if recent else None

    def median_step_time(self, window: int = 50) -> float | None:
        """Median seconds per step over the last `window` steps."""
        times = [s.step_time_s for s in self.steps[-window:] if s.step_time_s]
        return statistics.median(times) if times else None

    def eta_s(self) -> float | None:
        """Seconds to the last step at the recent median pace."""
        median = self.median_step_time()
        if median is None or not self.max_steps:
            return None
        return max(0, self.max_steps - self.step) * median

    def elapsed_s(self, now: float) -> float:
        return 0.0 if self.first_t is None else max(0.0, now - self.first_t)

    def loss_trend(self, fraction: float = 0.1) -> tuple[float, float] | None:
        """Mean loss over the first and the last `fraction` of steps."""
        losses = [s.loss for s in self.steps if s.loss is not None]
        if len(losses) < 2:
            return None
        k = max(1, int(len(losses) * fraction))
        return statistics.fmean(losses[:k]), statistics.fmean(losses[-k:])

    @property
    def warnings(self) -> list[str]:
        """The trainer's own audit warnings (settings it asked for and did not get)."""
        return list(self.audit.get("warnings", [])) if self.audit else []
