"""The `cockpit` command: parses arguments, calls the run's lifecycle (`cockpit.service.lifecycle`), prints.

Exit codes: 0 the run finished; 1 it failed; 2 bad input (profile, arguments, unknown run, a damaged
record); 3 it was stopped; 4 it stalled.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cockpit import __version__
from cockpit.export import ExportError
from cockpit.importers.model import ForeignLogError
from cockpit.profiles import (
    DEFAULT_PROFILE,
    MAX_GPU_MEM_GIB,
    MAX_GPUS,
    MAX_HOST_RAM_GIB,
    MAX_NODES,
    ProfileError,
    load_profile,
)
from cockpit.record import RecordError, RunPaths, check_record
from cockpit.service import lifecycle
from cockpit.service.diagnosis import describe_exit
from cockpit.service.lifecycle import LifecycleError, StopOutcome
from cockpit.service.runs import TRAINING, default_runs_dir, runs_dir_problem

EXIT_CODES = {"finished": 0, "failed": 1, "stopped": 3, "stalled": 4}
EXIT_BAD_INPUT = 2

console = Console(stderr=True, highlight=False, soft_wrap=True)


PROFILE_HELP = f"profile name (`cockpit profiles` lists them) or TOML path (default: {DEFAULT_PROFILE})"


class UsageError(Exception):
    """Bad input from the user: reported in one line, exit 2 (as are profile errors and refusals)."""


# --- numbers from flags ------------------------------------------------------------------------------
def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse `type=`: a whole number from `low` (to `high`); argparse names the flag."""
    span = f"from {low:,} to {high:,}" if high is not None else f"of at least {low:,}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number {span}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value}: expected a whole number {span}")
        return value

    return parse


def _num(x: float) -> str:
    return f"{x:,.0f}" if x == int(x) else f"{x:g}"


def amount(low: float, high: float, *, above: bool = False) -> Callable[[str], float]:
    """An argparse `type=`: a finite number in [low, high] (or (low, high] with `above`)."""
    span = f"above {_num(low)} and at most {_num(high)}" if above else f"from {_num(low)} to {_num(high)}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a number {span}") from None
        if not math.isfinite(value) or value < low or value > high or (above and value == low):
            raise argparse.ArgumentTypeError(f"{text}: expected a finite number {span}")
        return value

    return parse


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line errors (exit 2), the flag named, no usage block."""

    def error(self, message: str) -> Any:  # argparse's own signature says NoReturn
        raise UsageError(f"{self.prog}: {message} (see --help)")


def _runs_dir(args: argparse.Namespace) -> Path:
    if problem := runs_dir_problem(Path(args.runs_dir)):
        raise UsageError(f"--runs-dir {args.runs_dir}: {problem} for run records")
    return Path(args.runs_dir)


# --- run -----------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    from cockpit.record import load_manifest

    launch = lifecycle.start(_runs_dir(args), args.profile, args.overrides, list(sys.argv))
    run_dir = launch.run_dir
    profile_name = load_manifest(run_dir)["profile_name"]
    console.print(f"run [bold]{run_dir.name}[/] started (profile {profile_name}); record: {run_dir}")
    if args.detach:
        console.print(f"detached: follow with `cockpit ls`, stop with `cockpit stop {run_dir.name}`")
        print(run_dir)
        return 0
    return _follow_started("run", run_dir, launch.running, args.no_ui)


def _follow_started(command: str, run_dir: Path, running: Callable[[], bool], no_ui: bool) -> int:
    """Follow a run just started (`run`, `resume`): the app, or with `--no-ui` (or no terminal to draw
    on) the headless progress, whose Ctrl-C asks for a stop; its results then go to stdout."""
    if _use_app(command, no_ui=no_ui):
        return _open_app(run_dir, live=True)
    return _exit_code(_follow_headless(run_dir, running, results=True))


# --- rehearse ----------------------------------------------------------------------------------------
def _depths(text: str) -> list[int]:
    try:
        depths = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        depths = []
    if not depths or min(depths) < 1:
        raise UsageError(f"--layers {text!r}: expected depths of at least one layer, like 1,2,4")
    return depths


def cmd_rehearse(args: argparse.Namespace) -> int:
    """Start a rehearsal (or show one that ran: --show RUN), then print its prediction."""
    from cockpit.rehearse.run import RehearsalError, forecast_run, read_forecast

    if args.show:
        run_dir = _find(argparse.Namespace(runs_dir=args.runs_dir, run=args.show), latest=("rehearse",))
        status = load_manifest_status(run_dir)
    else:
        launch = lifecycle.start_rehearsal(
            _runs_dir(args), args.profile, args.overrides,
            None if args.layers is None else _depths(args.layers), args.steps, args.gpus, list(sys.argv),
        )  # fmt: skip
        run_dir = launch.run_dir
        console.print(f"rehearsal [bold]{run_dir.name}[/] started; record: {run_dir}")
        if _use_app("rehearse", no_ui=args.no_ui):
            _open_app(run_dir, live=True)
            status = load_manifest_status(run_dir)
        else:  # its result is the prediction printed below
            status = _follow_headless(run_dir, launch.running, results=False)
    if status in ("planned", "running") and not args.show:  # the app was left: the rehearsal goes on
        console.print(
            f"rehearsal {run_dir.name} goes on; `cockpit rehearse --show {run_dir.name}` for its prediction"
        )
        return 0
    data = None if args.show else read_forecast(run_dir)
    if data is None:  # --show, or an interrupted record: predict again from the depths it measured
        try:
            data = forecast_run(run_dir).to_dict()
        except RehearsalError as exc:
            raise UsageError(str(exc)) from None
    if args.format == "json":
        print(json.dumps(data, indent=2))
    else:
        from cockpit.rehearse.render import render

        _stdout_console().print(render(data))
    return 0 if status in ("planned", "running") else _exit_code(status)


def load_manifest_status(run_dir: Path) -> str:
    from cockpit.record import load_manifest

    return str(load_manifest(run_dir).get("status", "?"))


def _open_app(run_dir: Path, *, live: bool, speed: float = 1.0) -> int:
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


# --- attach, replay ---------------------------------------------------------------------------------
def _find_readable(args: argparse.Namespace) -> Path:
    """The run, once its manifest and event files have been read through (`RecordError` if damaged)."""
    run_dir = _find(args)
    check_record(run_dir)
    return run_dir


def _has_terminal() -> bool:
    """The app reads keys from stdin and draws on stderr; stdout is not to be filled with its codes."""
    return all(stream is not None and stream.isatty() for stream in (sys.stdin, sys.stdout, sys.stderr))


def _use_app(command: str, *, no_ui: bool = False, refusal: str | None = None) -> bool:
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


def cmd_attach(args: argparse.Namespace) -> int:
    if args.run is None:  # the latest running run, named
        from cockpit.service.runs import latest_running

        found = latest_running(_runs_dir(args))
        if found is None:
            raise UsageError(
                f"no running run in {_runs_dir(args)} to attach to: `cockpit ls` lists the runs, "
                "`cockpit replay RUN` plays an ended one back"
            )
        args.run = found.name
        console.print(f"attaching to {found.name}, the latest running run", markup=False)
    run_dir = _find_readable(args)
    instead = f"without one, follow it with `cockpit attach {args.run} --no-ui`, or runs: `cockpit ls`"
    if not _use_app("attach", no_ui=args.no_ui, refusal=instead):
        return _watch_headless(run_dir)
    return _open_app(run_dir, live=True)


def cmd_replay(args: argparse.Namespace) -> int:
    run_dir = _run_or_log(args.run, _runs_dir(args))
    check_record(run_dir)
    instead = f"without one, read the run with `cockpit report {args.run}` or list runs: `cockpit ls`"
    _use_app("replay", refusal=instead)
    return _open_app(run_dir, live=False, speed=args.speed)


def _watch_headless(run_dir: Path) -> int:
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
    viewer.print_report(_stdout_console())
    for line in viewer.summary():
        print(line)  # plain text: diagnoses quote logs ("[rank1]: ..." is not markup), never wrapped


def _follow_headless(run_dir: Path, running: Callable[[], bool], *, results: bool) -> str:
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


def _exit_code(status: str) -> int:
    """The exit code for a run's final status."""
    if status not in EXIT_CODES:
        console.print("[red]the supervisor ended without writing a final status (see supervisor.log)[/]")
        return 1
    return EXIT_CODES[status]


def _stdout_console() -> Console:
    """Tables for stdout: the terminal's width, or a wide page when redirected (a file, a pipe)."""
    return Console(highlight=False, width=None if sys.stdout.isatty() else 160)


# --- ls, stop, resume ------------------------------------------------------------------------------
def _ls_row(run_dir: Path, now: float) -> dict[str, Any]:
    """One run for `ls`: status, step, age, diagnosis; a damaged record says why it cannot be read."""
    from cockpit.record import load_manifest, read_events

    if not RunPaths(run_dir).manifest.exists():  # a run folder whose manifest is lost: shown, not hidden
        missing = f"{RunPaths(run_dir).manifest}: missing: not a run record, or one that lost it"
        return {"run": run_dir.name, "status": "no run.json", "step": None, "max_steps": None,
                "age_s": None, "diagnosis": missing}  # fmt: skip
    try:
        running = load_manifest(run_dir).get("status") == "running"
        lost = lifecycle.reconcile(run_dir) if running else None
        manifest = load_manifest(run_dir)
        steps = [e for e in read_events(run_dir, "step") if e.get("rank", 0) == 0]
    except (RecordError, OSError) as exc:
        return {"run": run_dir.name, "status": "unreadable", "step": None, "max_steps": None,
                "age_s": None, "diagnosis": str(exc)}  # fmt: skip
    created = manifest.get("created_at")
    return {
        "run": run_dir.name,
        "status": str(manifest.get("status", "?")),
        "step": steps[-1]["step"] if steps else None,
        "max_steps": steps[-1].get("max_steps") if steps else None,
        "age_s": now - created if isinstance(created, int | float) else None,
        "diagnosis": lost or manifest.get("diagnosis") or manifest.get("warning") or "",
    }


def cmd_ls(args: argparse.Namespace) -> int:
    from cockpit.service.runs import list_run_dirs

    run_dirs = list_run_dirs(_runs_dir(args), every_folder=True)
    now = time.time()
    rows = [_ls_row(run_dir, now) for run_dir in run_dirs]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        console.print(f"no runs in {_runs_dir(args)} (start one with `cockpit run`)", markup=False)
        return 0
    table = Table(box=None, header_style="bold")
    for col in ("run", "status", "step", "age", "diagnosis"):
        table.add_column(col)
    for row in rows:
        age = row["age_s"]
        step = "-" if row["step"] is None else f"{row['step']}/{row['max_steps'] or '?'}"
        table.add_row(
            row["run"],
            row["status"],
            step,
            "-" if age is None else f"{age / 3600:.1f} h" if age >= 3600 else f"{age / 60:.0f} min",
            escape(str(row["diagnosis"])),
        )
    _stdout_console().print(table)
    return 0


def _find(args: argparse.Namespace, latest: tuple[str, ...] | None = None) -> Path:
    """`args.run` among the runs; `latest` the modes `latest` names, if not
    `cockpit.service.runs.LATEST_MODES`."""
    from cockpit.service.runs import LATEST_MODES, find_run

    try:
        return find_run(_runs_dir(args), args.run, latest or LATEST_MODES)
    except LookupError as exc:
        raise UsageError(str(exc)) from None


STOP_MESSAGES = {
    StopOutcome.STOP_REQUESTED: "stop requested (checkpoint, then exit); run stop again to kill",
    StopOutcome.KILL_REQUESTED: "kill requested",
    StopOutcome.TRAINER_STOP_REQUESTED: "supervisor lost; stop requested from the trainer itself",
    StopOutcome.TRAINER_KILLED: "supervisor lost; training process group killed",
}


def cmd_stop(args: argparse.Namespace) -> int:
    run_dir = _find(args)
    outcome = lifecycle.stop(run_dir, kill=args.kill)
    console.print(f"{run_dir.name}: {STOP_MESSAGES[outcome]}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    launch = lifecycle.resume(_find(args), args.overrides, from_scratch=args.from_scratch)
    name = launch.run_dir.name
    if launch.checkpoint is None:
        console.print(f"run [bold]{name}[/] started over from step 0 (--from-scratch: no checkpoint)")
    else:
        console.print(f"run [bold]{name}[/] resumed from {escape(Path(launch.checkpoint).name)}")
    for change in launch.changes:
        console.print(f"  changed {change}", markup=False)
    if args.detach:
        console.print(f"detached: watch it with `cockpit attach {name}`, stop it with `cockpit stop {name}`")
        print(launch.run_dir)  # the result, on stdout, as `run --detach` gives it
        return 0
    return _follow_started("resume", launch.run_dir, launch.running, args.no_ui)


# --- eval, import, report -------------------------------------------------------------------------
def cmd_join(args: argparse.Namespace) -> int:
    run_dir = _find(args)
    launch = lifecycle.join(run_dir, args.node_rank)
    log = RunPaths(run_dir).node_supervisor_log(args.node_rank)
    console.print(f"node {args.node_rank} joins run [bold]{run_dir.name}[/]; its supervisor's log: {log}")
    if not args.wait or launch.process is None:
        return 0
    code = launch.process.wait()
    console.print(f"node {args.node_rank}: its ranks ended ({'ok' if code == 0 else 'failed'})")
    return 0 if code == 0 else 1


def _parse_named(items: list[str], what: str) -> list[tuple[str, Path]]:
    pairs = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"{what} {item!r}: expected NAME=PATH")
        pairs.append((name, Path(path)))
    return pairs


def cmd_eval(args: argparse.Namespace) -> int:
    models = _parse_named(args.model, "--model")
    if args.run:
        if args.profile:
            raise UsageError("give a RUN or --profile, not both")
        run_dir = _find_readable(args)
        launch = lifecycle.evaluate(run_dir, models)
        console.print(f"evaluating {run_dir.name} (output also in {RunPaths(run_dir).output_log})")
        status = _follow_headless(run_dir, launch.running, results=False)  # the report is printed below
        evaluation = lifecycle.last_evaluation(run_dir)
        if evaluation is None:
            return _exit_code(status)
        if evaluation.status == "stopped":
            return EXIT_CODES["stopped"]
        if evaluation.exit_code != 0:
            why = "" if evaluation.exit_code is None else f" ({describe_exit(evaluation.exit_code)})"
            console.print(f"[red]evaluation failed{why}; see {RunPaths(run_dir).output_log}[/]")
            return 1
        return _report_and_print(run_dir, "md", None)  # also where a failed report is tried again
    if not args.profile:
        raise UsageError("give a RUN to evaluate, or --profile P with --model NAME=PATH")
    for name, path in models:
        if not (path / "config.json").is_file():
            raise UsageError(f"--model {name}={path}: no config.json there")
    launch = lifecycle.start_eval(_runs_dir(args), args.profile, models, list(sys.argv))
    console.print(f"evaluation run [bold]{launch.run_dir.name}[/]: base model and {len(models)} other(s)")
    code = _exit_code(_follow_headless(launch.run_dir, launch.running, results=False))
    if code == 0:
        _report_and_print(launch.run_dir, "md", None)
    return code


def _import_all(run_dir: Path, items: list[str]) -> None:
    from cockpit.predictions import PredictionsError, import_predictions

    for name, path in _parse_named(items, "--predictions"):
        try:
            stored = import_predictions(run_dir, name, path)
        except PredictionsError as exc:
            raise UsageError(str(exc)) from None
        console.print(f"imported {path} as system {name!r} -> {stored}")


def _report_and_print(run_dir: Path, fmt: str, output: Path | None) -> int:
    from cockpit.record import load_manifest
    from cockpit.report import render_markdown, run_report, write_report

    report = run_report(run_dir)
    if not report.tenants and load_manifest(run_dir).get("mode") == "import":
        raise UsageError(f"{run_dir.name} is an imported log (its curves only): no predictions to report")
    if not report.tenants:
        raise UsageError(f"{run_dir.name} has no predictions yet: run `cockpit eval {run_dir.name}`")
    write_report(run_dir, report)
    text = json.dumps(report.to_dict(), indent=2) if fmt == "json" else render_markdown(report)
    if output:
        try:
            output.write_text(text + ("\n" if not text.endswith("\n") else ""), encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--output {output}: cannot write it ({exc.strerror})") from None
        console.print(f"report written to {output}")
    else:
        print(text)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """`import RUN --predictions NAME=FILE`: predictions into a run; `import PATH`: a foreign log as a run."""
    if args.predictions:
        run_dir = _find(args)
        _import_all(run_dir, args.predictions)
        return _report_and_print(run_dir, "md", None) if args.show else 0
    if args.show:
        raise UsageError("--show goes with --predictions (it prints the run's updated report)")
    from cockpit.importers import import_log

    source = Path(args.run)
    if not args.run.strip() or not source.exists():  # '' would be the current folder
        raise UsageError(
            f"{source}: no such file or directory (to bring predictions into a run: "
            f"`cockpit import RUN --predictions NAME=FILE`)"
        )
    run_dir, imported = import_log(source, _runs_dir(args))
    _say_imported(source, imported, run_dir.name)
    console.print(f"replay it: cockpit replay {run_dir.name}", markup=False)
    print(run_dir)
    return 0


def _say_imported(source: Path, imported: Any, run_id: str) -> None:
    """What an import read, what it lacks and what it skipped: a few plain lines on stderr."""
    from cockpit.importers import summary

    facts = summary(imported)
    clock = {"wall": "wall time", "elapsed": "elapsed time", "step": "no clock (one second a step)"}
    console.print(
        f"imported {source} ({facts['format']}) as run {run_id}: {facts['steps']} steps, "
        f"{facts['val_losses']} validation losses, {clock[facts['clock']]}"
        f"{', cut off before its end' if facts['cut'] else ''}",
        markup=False,
    )
    if facts["absent"]:
        console.print(f"  absent (not in the log): {', '.join(facts['absent'])}", markup=False)
    for line in facts["skipped"]:
        console.print(f"  skipped: {line}", markup=False)
    for line in facts["notes"]:
        console.print(f"  note: {line}", markup=False)


def _run_or_log(ref: str, runs_dir: Path, latest: tuple[str, ...] | None = None) -> Path:
    """A run by id, prefix, path or `latest` (of the modes `latest` names:
    `cockpit.service.runs.find_run`); else
    a foreign log at the path `ref`, imported into the cache once (`cockpit.importers.cached_import`)."""
    from cockpit.service.runs import LATEST_MODES, find_run

    try:
        return find_run(runs_dir, ref, latest or LATEST_MODES)
    except LookupError as exc:
        if not ref.strip() or not Path(ref).exists():  # '' is the current folder: never a log to import
            raise UsageError(str(exc)) from None
    from cockpit.importers import cached_import

    run_dir, imported = cached_import(Path(ref))
    if imported is not None:
        _say_imported(Path(ref), imported, run_dir.name)
    return run_dir


def cmd_report(args: argparse.Namespace) -> int:
    run_dir = _find_readable(args)
    _import_all(run_dir, args.predictions)
    return _report_and_print(run_dir, args.format, Path(args.output) if args.output else None)


# --- compare, export ------------------------------------------------------------------------------
def cmd_compare(args: argparse.Namespace) -> int:
    """Several runs (or imported logs) in one screen, or their table as Markdown or JSON."""
    from cockpit.compare import MAX_RUNS, compare_runs, render_markdown

    if not 2 <= len(args.runs) <= MAX_RUNS:
        raise UsageError(f"compare needs from 2 to {MAX_RUNS} runs (got {len(args.runs)})")
    run_dirs = [_run_or_log(ref, _runs_dir(args), latest=TRAINING) for ref in args.runs]  # latest: trained
    seen: dict[Path, str] = {}
    for ref, run_dir in zip(args.runs, run_dirs, strict=True):
        key = run_dir.resolve()
        if key in seen:
            raise UsageError(f"{ref!r} and {seen[key]!r} are the same run: give different runs")
        seen[key] = ref
        check_record(run_dir)
    if args.format is None:
        _use_app("compare", refusal="without one, print the table with --format md or --format json")
        from cockpit.app.compare import run_compare_app

        run_compare_app(run_dirs, axis=args.x)
        return 0
    _say_reading(run_dirs)
    comparison = compare_runs(run_dirs)
    if args.format == "json":
        print(json.dumps(comparison.to_dict(), indent=2))
    else:
        print(render_markdown(comparison), end="")
    return 0


def _say_reading(run_dirs: list[Path], at_least_mib: float = 8.0) -> None:
    """Before reading long records whole (a 26-hour one takes seconds), say so."""
    size = sum(p.stat().st_size for d in run_dirs for p in RunPaths(d).event_files()) / 2**20
    if size >= at_least_mib:
        console.print(f"reading {len(run_dirs)} record(s), {size:,.0f} MiB of events...", markup=False)


def cmd_export(args: argparse.Namespace) -> int:
    """A run's series as trackio CSV or TensorBoard event files."""
    from cockpit.export import write_csv, write_tensorboard

    run_dir = _run_or_log(args.run, _runs_dir(args))
    check_record(run_dir)
    _say_reading([run_dir])
    if args.format == "csv":
        output = Path(args.output) if args.output else Path(f"{run_dir.name}.csv")
        if output.is_dir():
            raise UsageError(f"--output {output}: a directory; --format csv writes one file")
        count = write_csv(run_dir, output)
        console.print(f"wrote {count} rows to {output} (trackio: trackio.import_csv)", markup=False)
    else:
        output = Path(args.output) if args.output else Path("tensorboard") / run_dir.name
        if output.is_file():
            raise UsageError(f"--output {output}: a file; --format tensorboard writes a log directory")
        count = write_tensorboard(run_dir, output)
        console.print(
            f"wrote {count} scalars to {output} (tensorboard --logdir {output.parent})", markup=False
        )
    print(output)
    return 0


# --- plan ----------------------------------------------------------------------------------------
def cmd_plan(args: argparse.Namespace) -> int:
    """Will the profile's run fit, where, and how fast: from the model's config.json alone."""
    from cockpit.plan import PlanError, build_plan, resolve_hardware
    from cockpit.plan.geometry import GeometryError, check_packable
    from cockpit.plan.render import render

    try:
        profile, _path = load_profile(args.profile, args.overrides)
        hardware = resolve_hardware(profile, args.gpus, args.gpu_mem_gib, args.host_ram_gib, nodes=args.nodes)
        plan = build_plan(profile, hardware)
        check_packable(plan.geometry, profile)  # what the loader would refuse
    except (ProfileError, PlanError, GeometryError) as exc:
        raise UsageError(str(exc)) from None
    measured = _calibration(args, plan, profile)
    if args.format == "json":
        from cockpit.plan.measured import to_dict

        print(json.dumps({**plan.to_dict(), "measured": to_dict(measured)}, indent=2))
    else:
        _stdout_console().print(render(plan, measured))
    return 0


def _calibration(args: argparse.Namespace, plan: Any, profile: Any) -> dict[str, Any]:
    """The plan rows the `--rehearsal` records measured (none without them)."""
    if not args.rehearsal:
        return {}
    from cockpit.rehearse.calibrate import CalibrationError, calibrate

    runs = [
        _find(argparse.Namespace(runs_dir=args.runs_dir, run=r), latest=("rehearse",)) for r in args.rehearsal
    ]
    try:
        return calibrate(plan, profile, runs)
    except CalibrationError as exc:
        raise UsageError(str(exc)) from None


# --- data --------------------------------------------------------------------------------------------
def cmd_data(args: argparse.Namespace) -> int:
    """Inspect a data set before any GPU is touched; exit 2 when a run would refuse it."""
    from cockpit.cache import cache_root
    from cockpit.data import DataError, load_examples
    from cockpit.data.inspection import count_tokens, inspect, source_path

    profile, source = load_profile(args.profile, args.overrides)
    path = source_path(profile, args.path)
    if not args.path and not path.exists():
        raise UsageError(
            f"{source}: data.source: no such file or folder {str(path)!r} (a relative path in a profile is "
            "read from the profile's folder, one given with --set from the working directory)"
        )
    try:
        data = load_examples(path, profile.data, strict=False, cache_dir=cache_root() / "datasets")
    except DataError as exc:
        raise UsageError(str(exc)) from None
    if args.no_tokens:
        lengths, how = None, "(not counted: --no-tokens)"
    else:
        lengths, how = count_tokens(data.examples, profile.model.path)
    found = inspect(data, lengths, how, profile.training.seq_len)
    if args.format == "json":
        print(json.dumps(found.to_dict(), indent=2))
    else:
        from cockpit.data.render import render

        _stdout_console().print(render(found))
    if found.blocking:
        more = f" (and {len(found.blocking) - 1:,} more)" if len(found.blocking) > 1 else ""
        raise UsageError(f"{found.blocking[0].message}{more}")
    return 0


# --- profiles ------------------------------------------------------------------------------------
def cmd_profiles(args: argparse.Namespace) -> int:
    """The profiles `--profile NAME` finds, with their descriptions."""
    from cockpit.profiles import profile_names

    table = Table(box=None, header_style="bold")
    for col in ("profile", "description", "file"):
        table.add_column(col, overflow="fold" if col == "file" else "ellipsis")  # a path to copy, whole
    for name, description, path in profile_names():
        default = " (default)" if name == DEFAULT_PROFILE else ""
        shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
        table.add_row(escape(name + default), escape(description), escape(str(shown)))
    _stdout_console().print(table)
    return 0


# --- doctor --------------------------------------------------------------------------------------
DOCTOR_MARKS = {"ok": "[green]ok  [/]", "warn": "[yellow]warn[/]", "fail": "[red]fail[/]"}


def cmd_doctor(args: argparse.Namespace) -> int:
    """Is this environment ready for the profile's run: one ok/warn/fail line a check; exit 1 on a fail."""
    from cockpit.service import doctor

    profile, path = load_profile(args.profile, args.overrides)
    checks = []
    if args.prebuild:
        say = (lambda line: console.print(escape(line))) if args.format == "text" else (lambda line: None)
        checks.append(doctor.prebuild(profile, say))
    exam = doctor.examine(profile, _runs_dir(args), str(path))
    exam = doctor.Examination(exam.profile, checks + exam.checks)
    if args.format == "json":
        print(json.dumps(exam.to_dict(), indent=2))
    else:
        out = _stdout_console()
        out.print(f"cockpit doctor: profile {escape(exam.profile)}")
        for check in exam.checks:
            out.print(f"{DOCTOR_MARKS[check.status]} {escape(check.name)}: {escape(check.reason)}")
    return 1 if exam.failed else 0


# --- parser ----------------------------------------------------------------------------------------
def _add_overrides(parser: argparse.ArgumentParser) -> None:
    """`--set section.key=value`, validated with the profile (`cockpit.profiles.apply_overrides`)."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one profile field, e.g. --set training.max_steps=20 (repeatable)",
    )


FIRST_STEPS = """first steps:
  cockpit run                  train the built-in tiny profile here (CPU, a few minutes), then compare
                               base and fine-tuned F1 per tenant; --no-ui without the app
  cockpit profiles             the profiles --profile can name: TOML files of model, data, LoRA,
                               DeepSpeed and training settings (copy one to make your own)
  cockpit data --profile P     check P's data before training: tenants, labels, lengths, problems
  cockpit plan --profile P     whether P fits this machine (or its own), before loading a weight
  cockpit report latest        the last run's per-tenant F1 again; `cockpit replay latest` its charts

exit codes: 0 finished, 1 failed, 2 bad input, 3 stopped, 4 stalled."""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="cockpit",
        description=(
            "Plan, launch, watch and report QLoRA fine-tuning of large Mixture-of-Experts models "
            "under DeepSpeed ZeRO-3 with CPU offload. Every run writes a record under --runs-dir."
        ),
        epilog=FIRST_STEPS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"cockpit {__version__}")
    common = Parser(add_help=False)
    common.add_argument(
        "--runs-dir",
        default=default_runs_dir(),
        help="where run records live (default: $COCKPIT_RUNS_DIR, else ./runs where that folder exists, "
        "else ~/.local/share/cockpit/runs)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser(
        "run",
        parents=[common],
        help="start a training run",
        description="Validate the profile, create a run record and start a detached supervisor that "
        "launches the trainer. Closing the terminal never stops the run; Ctrl-C asks it to save a "
        "checkpoint and stop (a second Ctrl-C kills).",
    )
    run.add_argument("--profile", default=DEFAULT_PROFILE, help=PROFILE_HELP)
    _add_overrides(run)
    run.add_argument(
        "--no-ui", action="store_true", help="headless: a progress line instead of the full-screen app"
    )
    run.add_argument(
        "--detach", action="store_true", help="start the run and return at once (prints the run dir)"
    )
    run.set_defaults(func=cmd_run)

    rehearse = sub.add_parser(
        "rehearse",
        parents=[common],
        help="measure the real architecture sliced to a few depths, predict the whole run",
        description="Build the profile's architecture from its config.json with random weights, sliced to "
        "each depth, and train a few steps at each with the profile's exact settings, on the GPUs at hand. "
        "Fits per-layer and fixed costs over the depths and predicts the whole run on the profile's own "
        "machine: GPU peak, host RAM, step time, tokens/s and the wall clock, beside the plan. Nothing is "
        "downloaded; a slice that cannot fit here is refused before anything loads (exit 2). A stopped "
        "rehearsal keeps the depths it measured.",
    )
    rehearse.add_argument("--profile", default=DEFAULT_PROFILE, help=PROFILE_HELP)
    _add_overrides(rehearse)
    from cockpit.rehearse.measure import DEFAULT_LAYERS, DEFAULT_STEPS, WARMUP_STEPS

    depths = ",".join(map(str, DEFAULT_LAYERS))
    rehearse.add_argument(
        "--layers",
        help=f"depths to measure (default {depths}; with parameter offload also the prefetch window and "
        "twice it, where they fit: 1,2,4,8 for 3 layers prefetched)",
    )
    rehearse.add_argument(
        "--steps",
        type=whole(WARMUP_STEPS + 1),
        default=DEFAULT_STEPS,
        help=f"optimizer steps a depth (default {DEFAULT_STEPS}; {WARMUP_STEPS} warm up)",
    )
    rehearse.add_argument(
        "--gpus", type=whole(0, MAX_GPUS), help="GPUs to rehearse on (default: every GPU here, 0 on a CPU)"
    )
    rehearse.add_argument(
        "--no-ui", action="store_true", help="headless: a progress line, then the prediction"
    )
    rehearse.add_argument(
        "--format", choices=("text", "json"), default="text", help="the prediction's format"
    )
    rehearse.add_argument(
        "--show", metavar="RUN", help="predict again from the depths a rehearsal measured, and print it"
    )
    rehearse.set_defaults(func=cmd_rehearse)

    ls = sub.add_parser("ls", parents=[common], help="list runs with status, step and age")
    ls.add_argument("--format", choices=("text", "json"), default="text", help="a table or JSON")
    ls.set_defaults(func=cmd_ls)

    stop = sub.add_parser(
        "stop", parents=[common], help="ask a run to checkpoint and stop; a second stop kills"
    )
    stop.add_argument("run", help="run id, unique id prefix, path, or 'latest'")
    stop.add_argument("--kill", action="store_true", help="kill the training processes at once")
    stop.set_defaults(func=cmd_stop)

    join = sub.add_parser(
        "join",
        parents=[common],
        help="start this node's ranks of a run launched without ssh over several nodes",
        description="For a profile with launcher.no_ssh = true and hardware.nodes > 1: `cockpit run` on "
        "node 0 (the hostfile's first host) starts the run; on every other node, `cockpit join RUN "
        "--node-rank N` starts a supervisor there that waits for node 0's launch and starts this node's "
        "ranks with the same arguments. The run directory must be on a file system every node sees.",
    )
    join.add_argument("run", help="run id, unique id prefix, path, or 'latest'")
    join.add_argument(
        "--node-rank", type=whole(1), required=True, help="this node's index in the hostfile (1, 2, ...)"
    )
    join.add_argument("--wait", action="store_true", help="wait until this node's ranks have ended")
    join.set_defaults(func=cmd_join)

    resume = sub.add_parser(
        "resume",
        parents=[common],
        help="continue an ended run from its last checkpoint, in the same record",
        description="Start a new attempt of an ended run from its last complete checkpoint, appending to "
        "its record, and follow it like `run`: the full-screen app (leaving it never stops the run), "
        "`--no-ui` for a progress line, `--detach` for neither.",
    )
    resume.add_argument("run", help="run id, unique id prefix, path, or 'latest'")
    resume.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
        help="change one profile field before continuing, e.g. --set training.max_steps=800 (repeatable)",
    )  # fmt: skip
    resume.add_argument(
        "--from-scratch", action="store_true", help="a run with no checkpoint: start it over from step 0"
    )
    resume.add_argument(
        "--no-ui",
        action="store_true",
        help="headless: a progress line instead of the full-screen app (Ctrl-C there stops the run)",
    )
    resume.add_argument(
        "--detach", action="store_true", help="resume and return at once: neither app nor line"
    )
    resume.set_defaults(func=cmd_resume)

    ev = sub.add_parser(
        "eval",
        parents=[common],
        help="score models on the held-out split: a run's base and adapter, or base models side by side",
        description="With RUN: score the run's base model and its fine-tuned adapter (and any --model) on "
        "its held-out split, then write the report. With --profile: a new evaluation-only run scoring the "
        "profile's base model and every --model, to compare open models before deciding to fine-tune.",
    )
    ev.add_argument("run", nargs="?", help="run id, unique prefix, path, or 'latest'")
    ev.add_argument(
        "--profile",
        help="profile whose data and quantization to use (evaluation-only run); names: `cockpit profiles`",
    )
    ev.add_argument(
        "--model", action="append", default=[], metavar="NAME=PATH", help="another model dir to score"
    )
    ev.add_argument(
        "--no-ui", action="store_true", help="accepted for symmetry; evaluation is always headless"
    )
    ev.set_defaults(func=cmd_eval)

    imp = sub.add_parser(
        "import",
        parents=[common],
        help="a foreign training log as a run record; or another system's predictions into a run",
        description="`cockpit import PATH`: read a training log the cockpit did not make and write it as a "
        "new run record (replay, compare and export read it like any other): an HF Trainer output directory "
        "(trainer_state.json, its own and each checkpoint-N/'s) or one trainer_state.json; LLaMA-Factory's "
        "trainer_log.jsonl (or its output directory); or the console output of an HF Trainer or DeepSpeed "
        "run (the log dicts HF prints, DeepSpeed's step, throughput and memory lines). What the log does "
        "not hold is listed as absent, never made up; lines it cannot use (cut off, noise) are counted. "
        "`cockpit import RUN --predictions NAME=FILE`: each line of FILE is a JSON object with tenant, id "
        "and pred (gold optional, checked); unknown tenants or labels, missing or duplicate ids are "
        "refused with the line number (exit 2).",
    )
    imp.add_argument(
        "run", metavar="PATH|RUN", help="a foreign log to import; with --predictions, the run to add them to"
    )
    imp.add_argument(
        "--predictions",
        action="append",
        default=[],
        metavar="NAME=FILE",
        help="import a predictions file into RUN as system NAME (repeatable)",
    )
    imp.add_argument("--show", action="store_true", help="print the updated report")
    imp.set_defaults(func=cmd_import)

    rep = sub.add_parser(
        "report",
        parents=[common],
        help="per-tenant precision, recall, micro/macro F1, deltas with 95%% CIs, serving cost",
        description="Writes report.json and report.md into the run directory and prints the chosen format.",
    )
    rep.add_argument("run", help="run id, unique prefix, path, or 'latest'")
    rep.add_argument("--format", choices=("md", "json"), default="md")
    rep.add_argument("--output", help="write to this file instead of standard output")
    rep.add_argument("--predictions", action="append", default=[], metavar="NAME=FILE", help="import first")
    rep.set_defaults(func=cmd_report)
    plan = sub.add_parser(
        "plan",
        parents=[common],
        help="predict memory (load and training), the verdict and faster options, before loading a weight",
        description="From the model's config.json alone: parameters and bytes by kind, per-GPU and host-RAM "
        "peaks at load and in training, whether the run fits and what binds, and the fastest configuration "
        "that fits. Hardware: flags, else the profile, else this machine (NVML, psutil).",
    )
    plan.add_argument("--profile", default=DEFAULT_PROFILE, help=PROFILE_HELP)
    _add_overrides(plan)
    plan.add_argument("--gpus", type=whole(0, MAX_GPUS), help="number of GPUs a node (0: CPU only)")
    plan.add_argument("--nodes", type=whole(1, MAX_NODES), help="number of nodes (hosts), each with --gpus")
    plan.add_argument(
        "--gpu-mem-gib", type=amount(0, MAX_GPU_MEM_GIB), help="memory of each GPU in GiB (0: unknown)"
    )
    plan.add_argument("--host-ram-gib", type=amount(0, MAX_HOST_RAM_GIB), help="host RAM in GiB (0: unknown)")
    plan.add_argument("--format", choices=("text", "json"), default="text", help="text tables or JSON")
    plan.add_argument(
        "--rehearsal",
        action="append",
        default=[],
        metavar="RUN",
        help="a rehearsal of this profile (or of one of its options) that calibrates the plan: its measured "
        "figures replace the modelled ones on its row, and the fastest that fits is chosen from measured "
        "rows (repeatable; `latest` for the newest rehearsal)",
    )
    plan.set_defaults(func=cmd_plan)

    data = sub.add_parser(
        "data",
        help="inspect a data set before training: tenants, labels, token lengths, problems",
        description="Read PATH (default: the profile's data.source) as the trainer would, through "
        "`datasets`: JSON Lines, JSON, Parquet, CSV or a save_to_disk folder, columns mapped by the "
        "profile's data.columns. Prints tenants with examples per split, labels per tenant with their "
        "counts, token lengths of prompt, reasoning and answer (histograms, the share over "
        "training.seq_len, what truncation would cut), repeated ids, gold labels outside their tenant's "
        "set and empty reasoning. Exit 2, with the first one-line error, when a run would refuse the data.",
    )
    data.add_argument("path", nargs="?", help="a data file or save_to_disk folder (default: the profile's)")
    data.add_argument("--profile", default=DEFAULT_PROFILE, help=PROFILE_HELP)
    _add_overrides(data)
    data.add_argument(
        "--no-tokens", action="store_true", help="skip counting tokens (no tokenizer is loaded)"
    )
    data.add_argument("--format", choices=("text", "json"), default="text", help="tables or JSON")
    data.set_defaults(func=cmd_data)

    profiles = sub.add_parser(
        "profiles", help="list the profiles --profile can name, with their descriptions"
    )
    profiles.set_defaults(func=cmd_profiles)
    doc = sub.add_parser(
        "doctor",
        parents=[common],
        help="check the environment for a profile's run: libraries, compiler, DeepSpeed ops, GPUs, RAM, disk",
        description="Each check prints ok, warn or fail with a one-line reason. Exit 0 when nothing fails, "
        "1 when a check fails, 2 for bad input. --prebuild compiles the DeepSpeed ops the profile's run "
        "needs now (CPU Adam with optimizer offload, the shared-memory op on a CPU; a compile of minutes "
        "the first time in an environment) instead of at the first run.",
    )
    doc.add_argument("--profile", default=DEFAULT_PROFILE, help=PROFILE_HELP)
    doc.add_argument("--prebuild", action="store_true", help="build the DeepSpeed ops the run needs now")
    doc.add_argument("--format", choices=("text", "json"), default="text", help="lines or JSON")
    _add_overrides(doc)
    doc.set_defaults(func=cmd_doctor)

    attach = sub.add_parser(
        "attach", parents=[common], help="open the app on a running run, with its whole history"
    )
    attach.add_argument(
        "run", nargs="?", help="run id, unique id prefix, path, or 'latest' (default: the latest running run)"
    )
    attach.add_argument(
        "--no-ui", action="store_true", help="follow it headless (progress lines) instead of the app"
    )
    attach.set_defaults(func=cmd_attach)

    from cockpit.record.playback import SPEEDS

    replay = sub.add_parser(
        "replay",
        parents=[common],
        help="play a saved run record (or any log `import` reads) back in the app",
        description="RUN is a run id, prefix, path or 'latest', or anything `cockpit import` reads (an HF "
        "Trainer output directory, a trainer_state.json, a LLaMA-Factory trainer_log.jsonl, a console "
        "log): that is imported once into the cache ($COCKPIT_CACHE/imports) and replayed.",
    )
    replay.add_argument("run", metavar="RUN|PATH", help="run id, unique id prefix, path, 'latest', or a log")
    replay.add_argument(
        "--speed",
        type=amount(0, SPEEDS[-1], above=True),
        default=1.0,
        help="times real time (default 1; + and - in the app)",
    )
    replay.set_defaults(func=cmd_replay)

    cmp = sub.add_parser(
        "compare",
        parents=[common],
        help="overlay several runs' loss, validation loss, tokens/s and memory; a table of what each reached",
        description="Runs are tagged A, B, C... in the order given and labelled by the profile fields in "
        "which they differ. In a terminal the app shows four charts (x: step or elapsed time, the key x "
        "switches) and a table of final loss, final validation loss, median tokens/s, peak memories and "
        "the tuned model's macro F1 per tenant where a run has a report. --format prints the table instead. "
        "A RUN may also be anything `cockpit import` reads (imported once into the cache).",
    )
    cmp.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="two runs or more: id, prefix, path, 'latest' (the newest training run) or a log",
    )
    cmp.add_argument(
        "--format",
        choices=("md", "json"),
        help="print the table as Markdown or JSON instead of opening the app",
    )
    cmp.add_argument(
        "--x", choices=("step", "time"), default="step", help="the charts' x axis at first (default step)"
    )
    cmp.set_defaults(func=cmd_compare)

    exp = sub.add_parser(
        "export",
        parents=[common],
        help="write a run's series for another tracker: trackio CSV or TensorBoard event files",
        description="Every step's loss, learning rate, grad norm, epoch, tokens/s, samples/s, step time and "
        "memory peaks, the validation losses and the telemetry's memory, each with its step and time. csv: "
        "trackio's import format (a `step` and a `timestamp` column, one column a metric; "
        "trackio.import_csv reads it), to RUN.csv by default. tensorboard: event files in a log directory, "
        "tensorboard/RUN/ by default (needs the `tensorboard` package: pip install 'cockpit[tensorboard]').",
    )
    exp.add_argument(
        "run", metavar="RUN", help="run id, unique prefix, path, 'latest', or a log `import` reads"
    )
    exp.add_argument("--format", choices=("csv", "tensorboard"), required=True)
    exp.add_argument("--output", help="the CSV file, or the TensorBoard log directory")
    exp.set_defaults(func=cmd_export)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return int(args.func(args))
    except (UsageError, ProfileError, LifecycleError, RecordError, ForeignLogError, ExportError) as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
