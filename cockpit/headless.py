"""The headless viewer: a live progress line over a run record, for `cockpit run --no-ui`.

It only reads the record (and asks for a stop through the control folder): the same reader and
fold as the TUI.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cockpit.plan.audit import plan_warnings
from cockpit.plan.store import load_plan
from cockpit.record import RunPaths, RunReader, load_manifest
from cockpit.record.format import TERMINAL_STATUSES
from cockpit.record.view import RunView
from cockpit.report import macro_f1_table, read_report_json

REFRESH_S = 0.5


def format_duration(seconds: float | None) -> str:
    """`1:02:03` style, or `--:--` when unknown."""
    if seconds is None:
        return "--:--"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


class HeadlessViewer:
    """Follows a run until its manifest reaches a terminal status."""

    def __init__(
        self,
        run_dir: Path,
        console: Console | None = None,
        alive: Callable[[], bool] | None = None,
    ) -> None:
        self.paths = RunPaths(Path(run_dir))
        self.console = console or Console(stderr=True)
        self.reader = RunReader(self.paths.root)
        self.view = RunView()
        self.plan = load_plan(self.paths.root)  # to check the trainer's audit against
        self.alive = alive or self._supervisor_alive
        self._warned: set[str] = set()
        self._notes_shown = 0

    def _supervisor_alive(self) -> bool:
        from cockpit.liveness import supervisor_alive

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
        """Show progress until the run ends; returns its final status."""
        progress = Progress(
            TextColumn("[bold]{task.fields[phase]:>7}"),
            BarColumn(bar_width=30),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[tps]} tok/s"),
            TimeElapsedColumn(),
            TextColumn("ETA {task.fields[eta]}"),
            console=self.console,
            transient=False,
            refresh_per_second=4,
        )
        status = self._status()
        with progress:
            task = progress.add_task("run", total=None, phase="start", loss="-", tps="-", eta="--:--")
            while True:
                self.view.apply(self.reader.poll())
                self._print_new_warnings()
                v = self.view
                evaluating = v.phase == "eval" and v.eval_total > 0
                progress.update(
                    task,
                    total=v.eval_total if evaluating else v.max_steps,
                    completed=v.eval_done if evaluating else v.step,
                    phase=f"eval {v.eval_system}" if evaluating else v.phase,
                    loss=_fmt(v.last_loss, ".4f"),
                    tps=_fmt(v.tokens_per_s, ",.0f"),
                    eta=format_duration(v.eta_s()),
                )
                status = self._status()
                if status in TERMINAL_STATUSES:
                    break
                if not self.alive():
                    time.sleep(REFRESH_S)  # the owner may have written its last words just now
                    status = self._status()
                    if status not in TERMINAL_STATUSES:
                        from cockpit.lifecycle import reconcile

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
        lines.append(f"record: {self.paths.root}")
        return lines

    def print_report(self) -> None:
        """The per-tenant comparison, if the run has a report."""
        report = read_report_json(self.paths.root)
        if report is not None:
            self.console.print(macro_f1_table(report))
