"""What every command shares: the console and the exit codes, bad input, finding a run (or a log to
import), and a run's report written and printed."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from cockpit.record import check_record
from cockpit.service.runs import runs_dir_problem

EXIT_CODES = {"finished": 0, "failed": 1, "stopped": 3, "stalled": 4}
EXIT_BAD_INPUT = 2

# Progress, diagnostics and errors: stderr. Results (tables, JSON, paths) go to stdout.
console = Console(stderr=True, highlight=False, soft_wrap=True)


class UsageError(Exception):
    """Bad input from the user: reported in one line, exit 2 (as are profile errors and refusals)."""


def stdout_console() -> Console:
    """Tables for stdout: the terminal's width, or a wide page when redirected (a file, a pipe)."""
    return Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def exit_code(status: str) -> int:
    """The exit code for a run's final status."""
    if status not in EXIT_CODES:
        console.print("[red]the supervisor ended without writing a final status (see supervisor.log)[/]")
        return 1
    return EXIT_CODES[status]


def runs_dir_of(args: argparse.Namespace) -> Path:
    """`--runs-dir`, refused in one line where it cannot hold run records."""
    if problem := runs_dir_problem(Path(args.runs_dir)):
        raise UsageError(f"--runs-dir {args.runs_dir}: {problem} for run records")
    return Path(args.runs_dir)


def find(args: argparse.Namespace, latest: tuple[str, ...] | None = None) -> Path:
    """`args.run` among the runs; `latest` the modes `latest` names, if not
    `cockpit.service.runs.LATEST_MODES`."""
    from cockpit.service.runs import LATEST_MODES, find_run

    try:
        return find_run(runs_dir_of(args), args.run, latest or LATEST_MODES)
    except LookupError as exc:
        raise UsageError(str(exc)) from None


def find_readable(args: argparse.Namespace) -> Path:
    """The run, once its manifest and event files have been read through (`RecordError` if damaged)."""
    run_dir = find(args)
    check_record(run_dir)
    return run_dir


def run_or_log(ref: str, runs_dir: Path, latest: tuple[str, ...] | None = None) -> Path:
    """A run by id, prefix, path or `latest` (of the modes `latest` names: `cockpit.service.runs.find_run`);
    else a foreign log at the path `ref`, imported into the cache once (`cockpit.importers.cached_import`)."""
    from cockpit.service.runs import LATEST_MODES, find_run

    try:
        return find_run(runs_dir, ref, latest or LATEST_MODES)
    except LookupError as exc:
        if not ref.strip() or not Path(ref).exists():  # '' is the current folder: never a log to import
            raise UsageError(str(exc)) from None
    from cockpit.importers import cached_import

    run_dir, imported = cached_import(Path(ref))
    if imported is not None:
        say_imported(Path(ref), imported, run_dir.name)
    return run_dir


def say_imported(source: Path, imported: Any, run_id: str) -> None:
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


def parse_named(items: list[str], what: str) -> list[tuple[str, Path]]:
    """`NAME=PATH` flags (`--model`, `--predictions`) as pairs; `what` names the flag in a refusal."""
    pairs = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"{what} {item!r}: expected NAME=PATH")
        pairs.append((name, Path(path)))
    return pairs


def report_and_print(run_dir: Path, fmt: str, output: Path | None) -> int:
    """Write the run's report (report.json, report.md) and print it as `fmt`, or to `output`."""
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
