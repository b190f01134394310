"""Commands on the run records: ls, replay, report, and import (a foreign log, or predictions)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, TextIO

from rich.markup import escape
from rich.table import Table

from cockpit.cli.arguments import Registrar, amount
from cockpit.cli.common import (
    UsageError,
    console,
    find,
    find_readable,
    parse_named,
    report_and_print,
    run_or_log,
    runs_dir_of,
    say_imported,
    stdout_console,
)
from cockpit.cli.follow import open_app, use_app
from cockpit.record import RecordError, RunPaths, check_record
from cockpit.service import lifecycle
from cockpit.units import about, size


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
    """The runs in --runs-dir: a table (or JSON) of status, step, age and diagnosis; or the NF4 caches."""
    from cockpit.service.runs import list_run_dirs

    if args.clear_cache:
        return clear_caches(args.clear_cache)
    if args.caches:
        return list_caches(args.format)
    run_dirs = list_run_dirs(runs_dir_of(args), every_folder=True)
    now = time.time()
    rows = [_ls_row(run_dir, now) for run_dir in run_dirs]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        console.print(f"no runs in {runs_dir_of(args)} (start one with `cockpit run`)", markup=False)
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
            "-" if age is None else about(age),
            escape(str(row["diagnosis"])),
        )
    stdout_console().print(table)
    return 0


def list_caches(fmt: str) -> int:
    """The NF4 model caches (`cockpit.model_cache`), one line each, and their total."""
    from cockpit import model_cache

    caches = model_cache.list_caches()
    if fmt == "json":
        print(json.dumps([c.to_dict() for c in caches], indent=2))
        return 0
    now = time.time()
    for info in caches:
        print(model_cache.describe(info, now))
    print(model_cache.summary(caches))
    return 0


def clear_caches(which: str, stream: TextIO | None = None) -> int:
    """Remove the NF4 caches `which` names (a key or its start, `stale` or `all`), one line each (on
    stdout, or `stream`)."""
    from cockpit import model_cache

    try:
        removed = model_cache.remove(which)
    except model_cache.CacheError as exc:
        raise UsageError(str(exc)) from None
    now = time.time()
    for info in removed:
        print(f"removed {model_cache.describe(info, now)}", file=stream)
    freed = sum(c.bytes for c in removed)
    print(f"removed {len(removed)} NF4 cache{'s' * (len(removed) != 1)}, {size(freed)} freed", file=stream)
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    """Play a run record (or a foreign log, imported into the cache once) back in the app."""
    run_dir = run_or_log(args.run, runs_dir_of(args))
    check_record(run_dir)
    instead = f"without one, read the run with `cockpit report {args.run}` or list runs: `cockpit ls`"
    use_app("replay", refusal=instead)
    return open_app(run_dir, live=False, speed=args.speed)


def cmd_report(args: argparse.Namespace) -> int:
    """Bring in any --predictions, write the run's report and print it."""
    run_dir = find_readable(args)
    _import_all(run_dir, args.predictions)
    return report_and_print(run_dir, args.format, Path(args.output) if args.output else None)


def _import_all(run_dir: Path, items: list[str]) -> None:
    from cockpit.predictions import PredictionsError, import_predictions

    for name, path in parse_named(items, "--predictions"):
        try:
            stored = import_predictions(run_dir, name, path)
        except PredictionsError as exc:
            raise UsageError(str(exc)) from None
        console.print(f"imported {path} as system {name!r} -> {stored}")


def cmd_import(args: argparse.Namespace) -> int:
    """`import RUN --predictions NAME=FILE`: predictions into a run; `import PATH`: a foreign log as a run."""
    if args.predictions:
        run_dir = find(args)
        _import_all(run_dir, args.predictions)
        return report_and_print(run_dir, "md", None) if args.show else 0
    if args.show:
        raise UsageError("--show goes with --predictions (it prints the run's updated report)")
    from cockpit.importers import import_log

    source = Path(args.run)
    if not args.run.strip() or not source.exists():  # '' would be the current folder
        raise UsageError(
            f"{source}: no such file or directory (to bring predictions into a run: "
            f"`cockpit import RUN --predictions NAME=FILE`)"
        )
    run_dir, imported = import_log(source, runs_dir_of(args))
    say_imported(source, imported, run_dir.name)
    console.print(f"replay it: cockpit replay {run_dir.name}", markup=False)
    print(run_dir)
    return 0


# --- the commands' flags ------------------------------------------------------------------------------
def add_ls(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register `cockpit ls` and its flags."""
    ls = sub.add_parser(
        "ls",
        parents=[common],
        help="list runs with status, step and age (or the NF4 model caches: --caches)",
        description="The runs in --runs-dir. --caches lists the NF4 model caches instead (one line each: "
        "key, model folder, settings, units on disk, bytes, last use, and why no load would use it where "
        "none would), --clear-cache removes them.",
    )
    ls.add_argument("--format", choices=("text", "json"), default="text", help="a table or JSON")
    ls.add_argument(
        "--caches", action="store_true", help="list the NF4 model caches ($COCKPIT_CACHE/nf4) instead of runs"
    )
    ls.add_argument(
        "--clear-cache",
        metavar="KEY|stale|all",
        help="remove an NF4 model cache (its key, or the key's first characters), the stale ones, or all",
    )
    ls.set_defaults(func=cmd_ls)


def add_import(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register `cockpit import` and its flags."""
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


def add_report(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register `cockpit report` and its flags."""
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


def add_replay(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register `cockpit replay` and its flags."""
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


COMMANDS: dict[str, Registrar] = {
    "ls": add_ls,
    "import": add_import,
    "report": add_report,
    "replay": add_replay,
}
