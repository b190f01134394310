"""Commands for before a run: plan (will it fit), data (is the data sound), doctor (is this environment
ready) and profiles (what `--profile` can name)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from cockpit.cli.arguments import PROFILE_HELP, Registrar, add_overrides, amount, whole
from cockpit.cli.common import UsageError, console, find, runs_dir_of, stdout_console
from cockpit.profiles import (
    DEFAULT_PROFILE,
    MAX_GPU_MEM_GIB,
    MAX_GPUS,
    MAX_HOST_RAM_GIB,
    MAX_NODES,
    ProfileError,
    load_profile,
)


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
        stdout_console().print(render(plan, measured))
    return 0


def _calibration(args: argparse.Namespace, plan: Any, profile: Any) -> dict[str, Any]:
    """The plan rows the `--rehearsal` records measured (none without them)."""
    if not args.rehearsal:
        return {}
    from cockpit.rehearse.calibrate import CalibrationError, calibrate

    runs = [
        find(argparse.Namespace(runs_dir=args.runs_dir, run=r), latest=("rehearse",)) for r in args.rehearsal
    ]
    try:
        return calibrate(plan, profile, runs)
    except CalibrationError as exc:
        raise UsageError(str(exc)) from None


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

        stdout_console().print(render(found))
    if found.blocking:
        more = f" (and {len(found.blocking) - 1:,} more)" if len(found.blocking) > 1 else ""
        raise UsageError(f"{found.blocking[0].message}{more}")
    return 0


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
    stdout_console().print(table)
    return 0


DOCTOR_MARKS = {"ok": "[green]ok  [/]", "warn": "[yellow]warn[/]", "fail": "[red]fail[/]"}


def cmd_doctor(args: argparse.Namespace) -> int:
    """Is this environment ready for the profile's run: one ok/warn/fail line a check; exit 1 on a fail."""
    from cockpit.service import doctor

    profile, path = load_profile(args.profile, args.overrides)
    if args.clear_cache:
        from cockpit.cli.records import clear_caches

        clear_caches(args.clear_cache, sys.stderr if args.format == "json" else None)
    checks = []
    if args.prebuild:
        say = (lambda line: console.print(escape(line))) if args.format == "text" else (lambda line: None)
        checks.append(doctor.prebuild(profile, say))
    exam = doctor.examine(profile, runs_dir_of(args), str(path))
    exam = doctor.Examination(exam.profile, checks + exam.checks)
    if args.format == "json":
        print(json.dumps(exam.to_dict(), indent=2))
    else:
        out = stdout_console()
        out.print(f"cockpit doctor: profile {escape(exam.profile)}")
        for check in exam.checks:
            out.print(f"{DOCTOR_MARKS[check.status]} {escape(check.name)}: {escape(check.reason)}")
            for line in check.facts.get("lines", []):
                out.print(f"     {escape(line)}")
    return 1 if exam.failed else 0


# --- the commands' flags ------------------------------------------------------------------------------
def add_plan(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register `cockpit plan` and its flags."""
    plan = sub.add_parser(
        "plan",
        parents=[common],
        help="predict memory (load and training), the verdict and faster options, before loading a weight",
        description="From the model's config.json alone: parameters and bytes by kind, per-GPU and host-RAM "
        "peaks at load and in training, whether the run fits and what binds, and the fastest configuration "
        "that fits. Hardware: flags, else the profile, else this machine (NVML, psutil).",
    )
    plan.add_argument("--profile", default=DEFAULT_PROFILE, help=PROFILE_HELP)
    add_overrides(plan)
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


def add_data(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register `cockpit data` and its flags."""
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
    add_overrides(data)
    data.add_argument(
        "--no-tokens", action="store_true", help="skip counting tokens (no tokenizer is loaded)"
    )
    data.add_argument("--format", choices=("text", "json"), default="text", help="tables or JSON")
    data.set_defaults(func=cmd_data)


def add_profiles(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register `cockpit profiles` and its flags."""
    profiles = sub.add_parser(
        "profiles", help="list the profiles --profile can name, with their descriptions"
    )
    profiles.set_defaults(func=cmd_profiles)


def add_doctor(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register `cockpit doctor` and its flags."""
    doc = sub.add_parser(
        "doctor",
        parents=[common],
        help="check the environment for a profile's run: libraries, compiler, DeepSpeed ops, GPUs, RAM, disk",
        description="Each check prints ok, warn or fail with a one-line reason. Exit 0 when nothing fails, "
        "1 when a check fails, 2 for bad input. --prebuild compiles the DeepSpeed ops the profile's run "
        "needs now (CPU Adam with optimizer offload, the shared-memory op on a CPU; a compile of minutes "
        "the first time in an environment) instead of at the first run. The NF4 cache line lists the "
        "quantized models kept on disk and their size; --clear-cache removes them.",
    )
    doc.add_argument("--profile", default=DEFAULT_PROFILE, help=PROFILE_HELP)
    doc.add_argument("--prebuild", action="store_true", help="build the DeepSpeed ops the run needs now")
    doc.add_argument("--format", choices=("text", "json"), default="text", help="lines or JSON")
    doc.add_argument(
        "--clear-cache",
        nargs="?",
        const="all",
        metavar="KEY|stale|all",
        help="remove NF4 model caches first (one by its key, those no load would use, or all: the default)",
    )
    add_overrides(doc)
    doc.set_defaults(func=cmd_doctor)


COMMANDS: dict[str, Registrar] = {
    "plan": add_plan,
    "data": add_data,
    "profiles": add_profiles,
    "doctor": add_doctor,
}
