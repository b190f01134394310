"""`cockpit rehearse`: the profile's architecture measured at a few depths, and the whole run predicted."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cockpit.cli.arguments import PROFILE_HELP, Registrar, add_overrides, whole
from cockpit.cli.common import UsageError, console, exit_code, find, runs_dir_of, stdout_console
from cockpit.cli.follow import follow_headless, open_app, use_app
from cockpit.profiles import DEFAULT_PROFILE, MAX_GPUS
from cockpit.service import lifecycle


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
        run_dir = find(argparse.Namespace(runs_dir=args.runs_dir, run=args.show), latest=("rehearse",))
        status = load_manifest_status(run_dir)
    else:
        if args.eval_only and args.no_eval:
            raise UsageError("--eval-only and --no-eval: choose one")
        launch = lifecycle.start_rehearsal(
            runs_dir_of(args), args.profile, args.overrides,
            None if args.layers is None else _depths(args.layers), 0 if args.eval_only else args.steps,
            args.gpus, list(sys.argv), eval_tokens=0 if args.no_eval else args.eval_tokens,
        )  # fmt: skip
        run_dir = launch.run_dir
        console.print(f"rehearsal [bold]{run_dir.name}[/] started; record: {run_dir}")
        if use_app("rehearse", no_ui=args.no_ui):
            open_app(run_dir, live=True)
            status = load_manifest_status(run_dir)
        else:  # its result is the prediction printed below
            status = follow_headless(run_dir, launch.running, results=False)
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

        stdout_console().print(render(data))
    return 0 if status in ("planned", "running") else exit_code(status)


def load_manifest_status(run_dir: Path) -> str:
    from cockpit.record import load_manifest

    return str(load_manifest(run_dir).get("status", "?"))


# --- the commands' flags ------------------------------------------------------------------------------
def add_rehearse(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register `cockpit rehearse` and its flags."""
    rehearse = sub.add_parser(
        "rehearse",
        parents=[common],
        help="measure the real architecture sliced to a few depths, predict the whole run",
        description="Build the profile's architecture from its config.json with random weights, sliced to "
        "each depth, and train a few steps at each with the profile's exact settings, on the GPUs at hand. "
        "Fits per-layer and fixed costs over the depths and predicts the whole run on the profile's own "
        "machine: GPU peak, host RAM, step time, tokens/s and the wall clock, beside the plan; evaluation is "
        "timed on each slice too (unless --no-eval) and counted, and serving priced. Nothing is "
        "downloaded; a slice that cannot fit here is refused before anything loads (exit 2). A stopped "
        "rehearsal keeps the depths it measured.",
    )
    rehearse.add_argument("--profile", default=DEFAULT_PROFILE, help=PROFILE_HELP)
    add_overrides(rehearse)
    from cockpit.contract import EVAL_FIRST_TOKENS
    from cockpit.rehearse.measure import DEFAULT_EVAL_TOKENS, DEFAULT_LAYERS, DEFAULT_STEPS, WARMUP_STEPS

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
        "--eval-tokens",
        type=whole(EVAL_FIRST_TOKENS + 1),
        default=DEFAULT_EVAL_TOKENS,
        help="after each depth's steps, evaluation is timed on the slice: a scoring forward, and thinking "
        f"batches of this many new tokens (default {DEFAULT_EVAL_TOKENS}: what matters is a decode step's "
        "time; the largest batch, its prefill long, four times the steps)",
    )
    rehearse.add_argument(
        "--no-eval", action="store_true", help="do not time evaluation (faster; the forecast models it)"
    )
    rehearse.add_argument(
        "--eval-only",
        action="store_true",
        help="time only evaluation at each depth, no training steps (its forecast of training is empty)",
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


COMMANDS: dict[str, Registrar] = {"rehearse": add_rehearse}
