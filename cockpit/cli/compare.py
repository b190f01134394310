"""Several runs side by side (`cockpit compare`); a run's series for another tracker (`cockpit export`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cockpit.cli.arguments import Registrar
from cockpit.cli.common import UsageError, console, run_or_log, runs_dir_of
from cockpit.cli.follow import use_app
from cockpit.record import RunPaths, check_record
from cockpit.service.runs import TRAINING
from cockpit.units import MIB, size


def cmd_compare(args: argparse.Namespace) -> int:
    """Several runs (or imported logs) in one screen, or their table as Markdown or JSON."""
    from cockpit.compare import MAX_RUNS, compare_runs, render_markdown

    if not 2 <= len(args.runs) <= MAX_RUNS:
        raise UsageError(f"compare needs from 2 to {MAX_RUNS} runs (got {len(args.runs)})")
    run_dirs = [run_or_log(ref, runs_dir_of(args), latest=TRAINING) for ref in args.runs]  # latest: trained
    seen: dict[Path, str] = {}
    for ref, run_dir in zip(args.runs, run_dirs, strict=True):
        key = run_dir.resolve()
        if key in seen:
            raise UsageError(f"{ref!r} and {seen[key]!r} are the same run: give different runs")
        seen[key] = ref
        check_record(run_dir)
    if args.format is None:
        use_app("compare", refusal="without one, print the table with --format md or --format json")
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
    events = sum(p.stat().st_size for d in run_dirs for p in RunPaths(d).event_files())
    if events >= at_least_mib * MIB:
        console.print(f"reading {len(run_dirs)} record(s), {size(events)} of events...", markup=False)


def cmd_export(args: argparse.Namespace) -> int:
    """A run's series as trackio CSV or TensorBoard event files."""
    from cockpit.export import write_csv, write_tensorboard

    run_dir = run_or_log(args.run, runs_dir_of(args))
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


# --- the commands' flags ------------------------------------------------------------------------------
def add_compare(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register `cockpit compare` and its flags."""
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


def add_export(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register `cockpit export` and its flags."""
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


COMMANDS: dict[str, Registrar] = {"compare": add_compare, "export": add_export}
