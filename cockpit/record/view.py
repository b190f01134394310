"""The state of a run, folded from its events: what every viewer (headless, TUI, replay) shows.

Feed it events in time order with `apply` (or rows of step and telemetry events as columns with
`apply_block`); read its fields. Live viewing is replay with the clock at now: the same fold, fed as
lines arrive. Checking the audit against the run's plan is the viewers' business, not the record's.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cockpit.record.bulk import Block
from cockpit.record.fold import Fold
from cockpit.record.reader import Event
from cockpit.record.schema import (
    EPOCH,
    GRAD_NORM,
    LEARNING_RATE,
    LOSS,
    MAX_STEPS,
    STEP,
    STEP_TIME_S,
    TOKENS_PER_S,
)
from cockpit.units import about

TOKENS_WINDOW = 20  # steps the tokens/s figure is the median of (the headless line, the app's header)


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
    # Every rank of the current attempt: its `rank_start` (host, node, local index, pid), its guard's
    # `rank_exit` and its own `error`, by rank; a new training launch starts them afresh.
    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)
    rank_exits: dict[int, dict[str, Any]] = field(default_factory=dict)
    rank_errors: dict[int, dict[str, Any]] = field(default_factory=dict)
    nodes_joined: dict[int, dict[str, Any]] = field(default_factory=dict)  # joined nodes' `node_start`
    nodes_ended: dict[int, dict[str, Any]] = field(default_factory=dict)  # and their `node_end`
    trainer_outcome: str | None = None
    supervisor_notes: list[str] = field(default_factory=list)
    eval_done: int = 0
    eval_total: int = 0
    eval_system: str | None = None
    eval_systems: list[str] = field(default_factory=list)  # from `eval_begin`, in the order they are scored
    report: dict[str, Any] | None = None  # the supervisor's `report` event: report.json is written
    rehearsal: dict[str, Any] | None = None  # the supervisor's `rehearsal` event: rehearsal.json is written
    val_loss: float | None = None  # the last validation loss (mean over tenants) and its step
    val_step: int | None = None
    early_stop: str | None = None  # why early stopping ended training (the trainer's `early_stop` event)
    # The best adapter so far (lowest validation loss at a trained step: `best_adapter` events), and the
    # run's adapter once saved (`adapter`: its `step`, `val_loss` and the `last_step` training ended at).
    best_step: int | None = None
    best_val_loss: float | None = None
    adapter: dict[str, Any] | None = None
    events_seen: int = 0
    attempt_from: int = (
        0  # index in `steps` of this attempt's first step: the figures of a resume are its own
    )
    load_layer: int = 0  # rank 0's `load_progress`: decoder layers loaded so far, of `load_layers`
    load_layers: int = 0
    load_t: float | None = None  # when rank 0 said its latest `load_progress`
    load_first: tuple[int, float] | None = None  # its first `load_progress` of this load: layer and time
    resumed: bool = False  # the supervisor of this attempt was started to resume from a checkpoint
    # The time between an attempt's end and the next supervisor's start (a resume, a later evaluation):
    # (end, start) each. Elapsed time and the charts' time axes leave it out.
    pauses: list[tuple[float, float]] = field(default_factory=list)
    _ended_t: float | None = None
    _tps_sum: float = 0.0  # tokens/s summed over `steps` (for the mean), and how many had one
    _tps_n: int = 0
    _eval_first: tuple[float, int] | None = None  # (t, done) of the current system's first progress event
    _eval_last_t: float | None = None
    _eval_per_example_s: float | None = None  # the last finished system's pace

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
        if block.kind == STEP:
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
        if MAX_STEPS in columns:
            self.max_steps = _int(columns[MAX_STEPS][last])

        def col(name: str) -> list[Any]:
            values = columns.get(name)
            if values is None:
                return [None] * (hi - lo)
            part = values[lo:hi]
            out = part.tolist()
            if part.dtype.kind == "f" and np.isnan(part).any():  # nulls back to None (rare: one pass)
                out = [None if v != v else v for v in out]
            return out

        def losses() -> list[Any]:
            """Every step has a loss: a NaN one (`"nan"`, or null in an older record) is the loss, not a
            missing reading, so a diverged run shows `nan`."""
            values = columns.get(LOSS)
            return [None] * (hi - lo) if values is None else values[lo:hi].tolist()

        steps = columns[STEP][lo:hi].astype(np.int64).tolist()
        self.step_events += len(steps)
        if TOKENS_PER_S in columns:
            tps = columns[TOKENS_PER_S][lo:hi]
            ok = tps[tps == tps]  # NaN (a null) is no reading
            self._tps_sum += float(ok.sum())
            self._tps_n += len(ok)
        self.steps.extend(
            map(
                StepPoint,
                t[lo:hi].tolist(),
                steps,
                losses(),
                col(TOKENS_PER_S),
                col(STEP_TIME_S),
                col(LEARNING_RATE),
                col(GRAD_NORM),
                col(EPOCH),
            )
        )

    def _on_phase(self, e: Event) -> None:
        if e.get("rank", 0) == 0:
            self.phase, self.phase_t, self.phase_message = e["phase"], e["t"], e.get("message")
            self.load_layer = self.load_layers = 0
            self.load_t = self.load_first = None

    def _on_load_progress(self, e: Event) -> None:
        if e.get("rank", 0) == 0:
            self.load_layer, self.load_layers = int(e.get("layer", 0)), int(e.get("layers", 0))
            self.load_t = e["t"]
            if self.load_first is None:
                self.load_first = (self.load_layer, self.load_t)

    def _on_launch(self, e: Event) -> None:
        """A new training attempt (a resume): the last attempt's phase, outcome and figures no longer hold."""
        if e.get("stage") == "train":
            self.phase, self.phase_t, self.trainer_outcome = "starting", e["t"], None
            self.phase_message = self.early_stop = None
            self.attempt_from = len(self.steps)
            self.ranks, self.rank_exits, self.rank_errors = {}, {}, {}
            self.nodes_joined, self.nodes_ended = {}, {}

    def _on_rank_start(self, e: Event) -> None:
        self.ranks[e.get("rank", 0)] = e

    def _on_rank_exit(self, e: Event) -> None:
        self.rank_exits[e.get("rank", 0)] = e

    def _on_error(self, e: Event) -> None:
        self.rank_errors.setdefault(e.get("rank", 0), e)  # the first: what came after is its consequence

    def _on_node_start(self, e: Event) -> None:
        self.nodes_joined[int(e.get("node_rank", 0))] = e

    def _on_node_end(self, e: Event) -> None:
        self.nodes_ended[int(e.get("node_rank", 0))] = e

    @property
    def nodes(self) -> int:
        """Nodes the current attempt's ranks said they run on (1 before they said)."""
        return max((int(r.get("nodes") or 1) for r in self.ranks.values()), default=1)

    def rank_label(self, rank: int) -> str:
        """A rank's line label: `r1` on one node; its host and local index (`gpu-b:0`) when the ranks span
        several nodes, with the node (`gpu-a/n1:0`) where nodes share a host (a simulated cluster)."""
        info = self.ranks.get(rank)
        if self.nodes <= 1 or info is None:
            return f"r{rank}"
        host, node, local = info.get("host") or "?", info.get("node_rank", "?"), info.get("local_rank", "?")
        shared = sum(1 for r in self.ranks.values() if r.get("host") == host and r.get("node_rank") != node)
        return f"{host}/n{node}:{local}" if shared else f"{host}:{local}"

    def _on_supervisor_start(self, e: Event) -> None:
        self.resumed = bool(e.get("resume"))
        if self._ended_t is not None and e["t"] > self._ended_t:
            self.pauses.append((self._ended_t, e["t"]))
        self._ended_t = None

    def _on_end(self, e: Event) -> None:
        self._ended_t = e["t"]

    def _on_train_begin(self, e: Event) -> None:
        if e.get("rank", 0) != 0:
            return
        self.max_steps = e.get("max_steps")
        self.start_step = e.get("start_step", 0)
        self.train_started_t = e["t"]
        if self.phase == "train":
            self.phase_message = None  # the engine is built: what the phase said of it is done
        # A resumed run repeats the steps after its checkpoint: the new ones replace the old.
        if self.steps and self.steps[-1].step > self.start_step:
            self.steps = [s for s in self.steps if s.step <= self.start_step]
            kept = [s.tokens_per_s for s in self.steps if s.tokens_per_s is not None]
            self._tps_sum, self._tps_n = float(sum(kept)), len(kept)
        self.attempt_from = min(self.attempt_from, len(self.steps))

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

    def _on_best_adapter(self, e: Event) -> None:
        if e.get("rank", 0) == 0:
            self.best_step, self.best_val_loss = e.get("step"), e.get("val_loss")

    def _on_adapter(self, e: Event) -> None:
        if e.get("rank", 0) == 0:
            self.adapter = e
            if e.get("val_loss") is not None:
                self.best_step, self.best_val_loss = e.get("step"), e.get("val_loss")

    def adapter_words(self) -> str | None:
        """Which adapter is the run's, once validation has picked one: `step 120's (validation loss
        0.3980, the lowest; training ended at step 160)`; while training, the best so far."""
        if self.best_step is None or self.best_val_loss is None:
            return None
        best = f"step {self.best_step}'s (validation loss {self.best_val_loss:.4f}, the lowest"
        if self.adapter is None:
            return f"best so far: {best})"
        last, where = self.adapter.get("last_step"), self.adapter.get("last_path")
        ended = f"; the last step's, {last}, is in {where}" if where and last != self.best_step else ""
        return f"{best}{ended})"

    def _on_eval_begin(self, e: Event) -> None:
        self.phase = "eval"
        self.eval_systems = list(e.get("systems") or [])
        self.eval_system, self.eval_done, self.eval_total = None, 0, 0
        self._eval_first = self._eval_last_t = self._eval_per_example_s = None

    def _on_eval_progress(self, e: Event) -> None:
        self.phase = "eval"
        system, done = e.get("system"), int(e.get("done", 0))
        if system != self.eval_system or self._eval_first is None:
            pace = self.eval_pace_s()
            if pace is not None:
                self._eval_per_example_s = pace  # the system before: its pace estimates the next one's
            self._eval_first = (e["t"], done)
        self.eval_system = system
        self.eval_done, self.eval_total = done, int(e.get("total", 0))
        self._eval_last_t = e["t"]

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

    def recent_steps(self, window: int) -> list[StepPoint]:
        """This attempt's last `window` steps (none yet while a resumed run reloads its model)."""
        return self.steps[max(self.attempt_from, len(self.steps) - window) :]

    @property
    def last_loss(self) -> float | None:
        """This attempt's last loss."""
        recent = self.recent_steps(1)
        return recent[-1].loss if recent else None

    @property
    def tokens_per_s(self) -> float | None:
        """Median tokens/s over this attempt's last `TOKENS_WINDOW` steps."""
        recent = [s.tokens_per_s for s in self.recent_steps(TOKENS_WINDOW) if s.tokens_per_s]
        return statistics.median(recent) if recent else None

    @property
    def mean_tokens_per_s(self) -> float | None:
        """Mean tokens/s over every step recorded (the whole curve, every attempt)."""
        return self._tps_sum / self._tps_n if self._tps_n else None

    def median_step_time(self, window: int = 50) -> float | None:
        """Median seconds per step over this attempt's last `window` steps."""
        times = [s.step_time_s for s in self.recent_steps(window) if s.step_time_s]
        return statistics.median(times) if times else None

    def train_eta_s(self) -> float | None:
        """Seconds to the last step at the recent median pace."""
        median = self.median_step_time()
        if median is None or not self.max_steps:
            return None
        return max(0, self.max_steps - self.step) * median

    def eval_pace_s(self) -> float | None:
        """Seconds per example of the system being scored, from its progress so far."""
        if self._eval_first is None or self._eval_last_t is None:
            return None
        t0, done0 = self._eval_first
        if self.eval_done <= done0 or self._eval_last_t <= t0:
            return None
        return (self._eval_last_t - t0) / (self.eval_done - done0)

    def eval_eta_s(self) -> float | None:
        """Seconds to the end of the evaluation: this system's examples left at its pace, and every system
        after it at the same pace (model loads not counted); None until a pace is known."""
        pace = self.eval_pace_s() or self._eval_per_example_s
        if pace is None or not self.eval_total:
            return None
        left = max(0, self.eval_total - self.eval_done) * pace
        if self.eval_system in self.eval_systems:
            later = len(self.eval_systems) - 1 - self.eval_systems.index(self.eval_system)
            left += later * self.eval_total * pace
        return left

    def eta_s(self) -> float | None:
        """Seconds to the end of the stage under way: training's last step, or the evaluation's end."""
        if self.phase == "eval":
            return self.eval_eta_s()
        if self.phase == "report":
            return 0.0
        return self.train_eta_s()

    def load_eta_s(self) -> float | None:
        """Seconds left of the layer-by-layer load, at the pace of the layers loaded so far: from the first
        layer said to the latest (from the load's start while only one is, which counts the setup before
        it too); None before the first layer or outside the load."""
        if self.phase != "load" or not self.load_layer or self.load_t is None or self.load_first is None:
            return None
        first_layer, first_t = self.load_first
        if self.load_layer > first_layer:
            per_layer = max(0.0, self.load_t - first_t) / (self.load_layer - first_layer)
        elif self.phase_t is not None:
            per_layer = max(0.0, self.load_t - self.phase_t) / self.load_layer
        else:
            return None
        return per_layer * max(0, self.load_layers - self.load_layer)

    def load_words(self) -> str | None:
        """'layer 12 of 94, about 4 min left' while the model loads layer by layer; else None."""
        if self.phase != "load" or not self.load_layers:
            return None
        words = f"layer {self.load_layer} of {self.load_layers}"
        left = self.load_eta_s()
        if left is not None and self.load_layer < self.load_layers:
            words += f", about {about(left)} left"
        return words

    def paused_s(self, t: float) -> float:
        """Seconds of `pauses` before record time `t`."""
        return sum(min(b, t) - a for a, b in self.pauses if t > a)

    def elapsed_s(self, now: float) -> float:
        """Seconds the run has run by `now`: from its first event, less its `pauses`."""
        return 0.0 if self.first_t is None else max(0.0, now - self.first_t - self.paused_s(now))

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
