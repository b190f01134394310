"""Following a run from the CLI: the full-screen app where there is a terminal, plain progress lines
where there is none (or with `--no-ui`), and the run's results and exit code when it ends."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cockpit.cli.common import EXIT_CODES, UsageError, console, exit_code, stdout_console
from cockpit.service import lifecycle


def _has_terminal() -> bool:
    """The app reads keys from stdin and draws on stderr; stdout is not to be filled with its codes."""
    return all(stream is not None and stream.isatty() for stream in (sys.stdin, sys.stdout, sys.stderr))


def use_app(command: str, *, no_ui: bool = False, refusal: str | None = None) -> bool:
    """Whether to open the full-screen app: the one rule of every command that can (run, resume,
    rehearse, attach, replay, compare), asked before it opens.

    Not with `--no-ui`; not without a terminal on stdin, stdout and stderr (nohup, a pipe, a CI job),
    where the app would write its codes into the pipe and never end. There a command that can follow
    the run headless says so in one line and does; one that cannot (`refusal`: what to do instead) is
    refused in one line, exit 2.
    """
    if no_ui:
        return False
    if _has_terminal():
        return True
    if refusal is not None:
        raise UsageError(f"`cockpit {command}` needs a terminal (stdin, stdout and stderr); {refusal}")
    console.print("no terminal: plain progress lines instead of the app", markup=False)
    return False


def follow_started(command: str, run_dir: Path, running: Callable[[], bool], no_ui: bool) -> int:
    """Follow a run just started (`run`, `resume`): the app, or with `--no-ui` (or no terminal to draw
    on) the headless progress, whose Ctrl-C asks for a stop; its results then go to stdout."""
    if use_app(command, no_ui=no_ui):
        return open_app(run_dir, live=True)
    return exit_code(follow_headless(run_dir, running, results=True))


def open_app(run_dir: Path, *, live: bool, speed: float = 1.0) -> int:
    """The full-screen app on a run; leaving it never stops the run."""
    from cockpit.app.app import run_app
    from cockpit.record import load_manifest

    how = run_app(run_dir, live=live, speed=speed)
    manifest = load_manifest(run_dir)
    status = manifest.get("status", "?")
    if live and status in ("running", "planned"):
        console.print(f"{how}: run {run_dir.name} goes on; `cockpit attach {run_dir.name}` to watch it again")
        return 0
    console.print(f"run {run_dir.name}: {status}", markup=False)
    hint = _resume_hint(run_dir, manifest)
    if hint:
        console.print(hint, markup=False)
    return EXIT_CODES.get(status, 0) if live else 0


def _resume_hint(run_dir: Path, manifest: dict[str, Any]) -> str | None:
    """For a run that ended before its schedule did, and that has a checkpoint: how to go on."""
    if (
        manifest.get("status") not in ("stopped", "failed", "stalled")
        or manifest.get("mode", "train") != "train"
    ):
        return None
    checkpoint = lifecycle.last_checkpoint(run_dir)
    if checkpoint is None:
        return None
    return f"continue it with `cockpit resume {run_dir.name}` (from {Path(checkpoint).name})"


def watch_headless(run_dir: Path) -> int:
    """Follow a run without the app until it ends; Ctrl-C leaves, and the run goes on."""
    from cockpit.headless import HeadlessViewer

    viewer = HeadlessViewer(run_dir, console=console)
    try:
        status = viewer.follow()
    except KeyboardInterrupt:
        console.print(f"\nleft: run {run_dir.name} goes on", markup=False)
        return 0
    _print_results(viewer)
    return EXIT_CODES.get(status, 0)


def _print_results(viewer: Any) -> None:
    """A followed run's results on stdout, where `cockpit run --no-ui > log` keeps them (its progress and
    diagnostics went to stderr): the per-tenant F1 table, then the closing lines."""
    viewer.print_report(stdout_console())
    for line in viewer.summary():
        print(line)  # plain text: diagnoses quote logs ("[rank1]: ..." is not markup), never wrapped


def follow_headless(run_dir: Path, running: Callable[[], bool], *, results: bool) -> str:
    """Follow in the foreground until the run ends, and return its status; Ctrl-C (or SIGTERM) asks
    for a stop, a second one kills. With `results`, the run's results go to stdout (`_print_results`);
    without (a command that prints its own result after: a rehearsal's prediction, an evaluation's
    report), the closing lines go to stderr with the progress."""
    from cockpit.headless import HeadlessViewer

    interrupts = 0

    def on_interrupt(signum: int, _frame: Any) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1:
            lifecycle.request_stop(run_dir)
            console.print(
                "\n[yellow]stopping: the trainer saves a checkpoint and exits (Ctrl-C again to kill)[/]"
            )
        else:
            lifecycle.request_kill(run_dir)
            console.print("\n[red]killing the training processes[/]")

    previous = {s: signal.signal(s, on_interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        viewer = HeadlessViewer(run_dir, console=console, alive=running)
        status = viewer.follow()
        if results:
            _print_results(viewer)
        else:
            for line in viewer.summary():
                console.print(line, markup=False)  # diagnoses quote logs: "[rank1]: ..." is not markup
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return status
