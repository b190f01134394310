"""The headless viewer: a live progress line over a run record, for `cockpit run --no-ui`.

It only reads the record (and asks for a stop through the control folder): the same reader and
fold as the TUI.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from cockpit.plan.audit import plan_warnings
from cockpit.plan.store import load_plan
from cockpit.record import RunPaths, RunReader, load_manifest
from cockpit.record.format import TERMINAL_STATUSES
from cockpit.record.phases import PHASE_WORDS
from cockpit.record.schema import CUDA_PEAK_ALLOC_MIB, RSS_PEAK_MIB
from cockpit.record.view import RunView
from cockpit.report import read_report_json, report_parts
from cockpit.units import clock, memory

REFRESH_S = 0.5


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


PLAIN_EVERY_STEPS = 50
PLAIN_EVERY_S = 60.0


def peak_memory(view: RunView) -> str:
    """The highest peak any rank reported at its last step: GPU (allocated) and host RSS."""
    parts = []
    for key, label in ((CUDA_PEAK_ALLOC_MIB, "GPU"), (RSS_PEAK_MIB, "RSS")):
        values = [m[key] for m in view.memory.values() if m.get(key) is not None]
        if values:
            parts.append(f"{label} {memory(max(values))}")
    return ", ".join(parts) or "-"


def step_line(view: RunView) -> str:
    """`step 100/400  loss 2.3456  4,427 tok/s  ETA 2:05  peak GPU 76 MiB, RSS 754 MiB` (with
    `val 2.4567` after the loss once the run has a validation loss, and `(best 2.3012 at 60)` when the
    best adapter so far is an earlier validation's)."""
    val = f"  val {view.val_loss:.4f}" if view.val_loss is not None else ""
    if val and view.best_step is not None and view.best_step != view.val_step and view.best_val_loss:
        val += f" (best {view.best_val_loss:.4f} at {view.best_step})"
    return (
        f"step {view.step}/{view.max_steps or '?'}  loss {_fmt(view.last_loss, '.4f')}{val}  "
        f"{_fmt(view.tokens_per_s, ',.0f')} tok/s  ETA {clock(view.eta_s())}  "
        f"peak {peak_memory(view)}"
    )


def bar_fields(view: RunView, now: float) -> dict[str, object]:
    """The progress bar's figures for what the run is doing now: an evaluation's examples, or training's
    steps with its loss and tokens/s once it has steps (training's figures are not shown beside an
    evaluation's progress); durations by the app's clock (`0:24`, `1:02:03`)."""
    v = view
    evaluating = v.phase in ("eval", "report") and v.eval_total > 0
    if evaluating:
        phase, total, done, detail = f"eval {v.eval_system or ''}".rstrip(), v.eval_total, v.eval_done, ""
    else:  # training's figures once it has them (before its first step, the phase's message says)
        phase, total, done = v.phase, v.max_steps, v.step
        figures = f"loss {_fmt(v.last_loss, '.4f')}  {_fmt(v.tokens_per_s, ',.0f')} tok/s"
        detail = figures if v.steps else ""
    return {
        "phase": phase,
        "total": total,
        "completed": done,
        "detail": detail,
        "elapsed": clock(v.elapsed_s(now)),
        "eta": clock(v.eta_s()),
    }


def world(view: RunView) -> int:
    """Ranks of the current attempt, as its ranks said (0 before any did)."""
    return max((int(r.get("world_size") or 1) for r in view.ranks.values()), default=0)


@dataclass
class PlainLog:
    """Plain progress lines for a log with no terminal: one every `every_steps` steps or `every_s` seconds
    (whichever comes first), and one at each phase, the first step, each checkpoint and evaluation.

    `update` is a function of the folded state and the clock, remembering only what it has said.
    """

    every_steps: int = PLAIN_EVERY_STEPS
    every_s: float = PLAIN_EVERY_S
    _phase: str | None = None
    _train_t: float | None = None
    _step: int | None = None  # the step of the last step line; None before this attempt's first
    _step_t: float = 0.0
    _checkpoints: int = 0
    _adapter: dict | None = None  # the adapter event last said
    _eval: tuple[str | None, int] = (None, 0)
    _eval_t: float = 0.0
    _placed: dict[int, dict] | None = None  # the ranks last said to span several nodes
    _load: tuple[int, float] = (0, 0.0)  # the load's layer last said, and when

    def update(self, view: RunView, now: float) -> list[str]:
        """The lines that `view` at `now` calls for, beyond those already given."""
        stamp = f"[{clock(view.elapsed_s(now), padded=True)}] "
        lines: list[str] = []
        if view.train_started_t != self._train_t:  # a new attempt (a resume): its first step again
            self._train_t, self._step = view.train_started_t, None
        new_step = bool(view.steps) and view.step > view.start_step and view.step != self._step
        if new_step and self._step is not None and view.phase != "train":  # training is over: its last step
            lines.append(step_line(view))
            self._step, self._step_t, new_step = view.step, now, False
        if view.phase != self._phase and view.phase != "starting":
            self._phase = view.phase
            words = view.phase_message or PHASE_WORDS.get(view.phase)
            lines.append(f"phase {view.phase}" + (f": {words}" if words else ""))
        if view.nodes > 1 and view.ranks is not self._placed and len(view.ranks) == world(view):
            self._placed = view.ranks  # every rank of a job over several nodes has started: where
            where = ", ".join(f"rank {r} {view.rank_label(r)}" for r in sorted(view.ranks))
            lines.append(f"{len(view.ranks)} ranks on {view.nodes} nodes: {where}")
        if new_step and self._step is None:  # this attempt's first step line (mid-run when following late)
            first = view.step == view.start_step + 1
            lines.append(f"first {step_line(view)}" if first else step_line(view))
            self._step, self._step_t = view.step, now
        elif new_step and (
            view.step // self.every_steps > (self._step or 0) // self.every_steps
            or now - self._step_t >= self.every_s
        ):
            lines.append(step_line(view))
            self._step, self._step_t = view.step, now
        for step in view.checkpoints[self._checkpoints :]:
            lines.append(f"checkpoint at step {step}")
        self._checkpoints = len(view.checkpoints)
        if view.adapter is not None and view.adapter is not self._adapter:
            self._adapter = view.adapter
            words = view.adapter_words()
            if words:
                lines.append(f"adapter: {words}")
        load = view.load_words()
        if load and view.load_layer != self._load[0] and now - self._load[1] >= self.every_s:
            lines.append(f"loading the model: {load}")
            self._load = (view.load_layer, now)
        if view.phase == "eval" and view.eval_total:
            system, done = view.eval_system, view.eval_done
            due = done == view.eval_total or now - self._eval_t >= self.every_s
            if system != self._eval[0] or (done != self._eval[1] and due):
                lines.append(f"evaluation: {system} {done}/{view.eval_total}")
                self._eval, self._eval_t = (system, done), now
        return [stamp + line for line in lines]


class HeadlessViewer:
    """Follows a run until its manifest reaches a terminal status."""

    def __init__(
        self,
        run_dir: Path,
        console: Console | None = None,
        alive: Callable[[], bool] | None = None,
        every_steps: int = PLAIN_EVERY_STEPS,
        every_s: float = PLAIN_EVERY_S,
    ) -> None:
        self.paths = RunPaths(Path(run_dir))
        self.console = console or Console(stderr=True)
        self.reader = RunReader(self.paths.root)
        self.view = RunView()
        self.plan = load_plan(self.paths.root)  # to check the trainer's audit against
        self.alive = alive or self._supervisor_alive
        self._warned: set[str] = set()
        self._notes_shown = 0
        self.every_steps, self.every_s = every_steps, every_s  # plain lines' pace, with no terminal

    def _supervisor_alive(self) -> bool:
        from cockpit.service.liveness import supervisor_alive

        try:
            manifest = load_manifest(self.paths.root)
        except (OSError, ValueError):
            return True
        return manifest.get("status") == "planned" or supervisor_alive(manifest, self.paths.root)

    def _status(self) -> str:
        try:
            return load_manifest(self.paths.root).get("status", "planned")
        except (OSError, ValueError):
            return "planned"

    def _print_new_warnings(self) -> None:
        for warning in self.view.warnings + plan_warnings(self.view.audit, self.plan):
            if warning not in self._warned:
                self._warned.add(warning)
                self.console.print(f"[bold yellow]audit warning:[/] {escape(warning)}")
        for note in self.view.supervisor_notes[self._notes_shown :]:
            self.console.print(f"[cyan]supervisor:[/] {escape(note)}")
        self._notes_shown = len(self.view.supervisor_notes)

    def follow(self) -> str:
        """Show progress until the run ends; returns its final status. A terminal gets a live bar; a
        pipe or a file (nohup, a CI log) gets plain lines (`PlainLog`) as the run goes."""
        return self._follow_bar() if self.console.is_terminal else self._follow_plain()

    def _follow_plain(self) -> str:
        log = PlainLog(self.every_steps, self.every_s)

        def show() -> None:
            for line in log.update(self.view, time.time()):
                self.console.print(line, markup=False, highlight=False)

        status = self._loop(show)
        show()  # what the last events call for
        return status

    def _follow_bar(self) -> str:
        progress = Progress(
            TextColumn("[bold]{task.fields[phase]:>7}"),
            BarColumn(bar_width=30),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TextColumn("{task.fields[elapsed]}"),
            TextColumn("ETA {task.fields[eta]}"),
            console=self.console,
            transient=False,
            refresh_per_second=4,
        )
        with progress:
            task = progress.add_task("run", total=None, phase="start", detail="", elapsed="", eta="--:--")
            # the layer-by-layer load has its own bar, shown only while it counts layers
            load = progress.add_task(
                "load", total=None, visible=False, phase="load", detail="layers", elapsed="", eta=""
            )
            said: list[str | None] = [None]  # the phase message last printed above the bar

            def show() -> None:
                v = self.view
                if v.phase_message and v.phase_message != said[0]:
                    progress.console.print(f"[cyan]{escape(v.phase)}:[/] {escape(v.phase_message)}")
                said[0] = v.phase_message
                loading = v.phase == "load" and v.load_layers > 0
                fields = bar_fields(v, time.time())
                progress.update(
                    load,
                    visible=loading,
                    total=v.load_layers or None,
                    completed=v.load_layer,
                    elapsed=fields["elapsed"],
                    eta=clock(v.load_eta_s()),
                )
                progress.update(task, visible=not loading, **fields)

            return self._loop(show)

    def _loop(self, show: Callable[[], None]) -> str:
        """Fold new events and `show` them until the run ends (or its owner is gone); the final status."""
        while True:
            self.view.apply(self.reader.poll())
            self._print_new_warnings()
            show()
            status = self._status()
            if status in TERMINAL_STATUSES:
                break
            if not self.alive():
                time.sleep(REFRESH_S)  # the owner may have written its last words just now
                status = self._status()
                if status not in TERMINAL_STATUSES:
                    from cockpit.service.lifecycle import reconcile

                    lost = reconcile(self.paths.root) or "supervisor lost"
                    self.console.print(f"[bold red]{escape(lost)}[/]")
                    status = self._status()
                break
            time.sleep(REFRESH_S)
        self.view.apply(self.reader.poll())
        return status

    def summary(self) -> list[str]:
        """Closing lines: status, diagnosis, loss trend, where the record is."""
        manifest = load_manifest(self.paths.root)
        lines = [
            f"run {manifest.get('run_id')}: {manifest.get('status')} - {manifest.get('diagnosis') or ''}"
        ]
        trend = self.view.loss_trend()
        if trend:
            lines.append(f"loss: first 10% of steps {trend[0]:.4f} -> last 10% {trend[1]:.4f}")
        if self.view.val_loss is not None:
            lines.append(f"validation loss at step {self.view.val_step}: {self.view.val_loss:.4f}")
        words = self.view.adapter_words()
        if words:
            lines.append(f"adapter: {words}")
        if self.paths.adapter.is_dir():
            lines.append(f"adapter files: {self.paths.adapter}")
        lines.append(f"record: {self.paths.root}")
        root = self.paths.root
        report = f"cockpit report {root} · " if manifest.get("status") == "finished" else ""
        lines.append(f"next: {report}cockpit replay {root}")
        return lines

    def print_report(self, console: Console | None = None) -> None:
        """The per-tenant comparison, how its examples were chosen and the serving section, if the run has a
        report: on `console` (a result, for stdout), else on the progress's."""
        report = read_report_json(self.paths.root)
        if report is not None:
            for part in report_parts(report):
                (console or self.console).print(part)
