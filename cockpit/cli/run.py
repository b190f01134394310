"""Commands that start, steer and watch a run: run, resume, attach, stop, join and eval."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.markup import escape

from cockpit.cli.arguments import PROFILE_HELP, Registrar, add_overrides, duration, whole
from cockpit.cli.common import (
    EXIT_CODES,
    UsageError,
    console,
    exit_code,
    find,
    find_readable,
    parse_named,
    report_and_print,
    runs_dir_of,
)
from cockpit.cli.follow import follow_headless, follow_started, open_app, use_app, watch_headless
from cockpit.profiles import DEFAULT_PROFILE
from cockpit.record import RunPaths
from cockpit.service import lifecycle
from cockpit.service.diagnosis import describe_exit
from cockpit.service.lifecycle import StopOutcome


def cmd_run(args: argparse.Namespace) -> int:
    """Start a training run, then follow it (the app or headless) or, with --detach, print its folder."""
    from cockpit.record import load_manifest

    launch = lifecycle.start(runs_dir_of(args), args.profile, args.overrides, list(sys.argv))
    run_dir = launch.run_dir
    profile_name = load_manifest(run_dir)["profile_name"]
    console.print(f"run [bold]{run_dir.name}[/] started (profile {profile_name}); record: {run_dir}")
    if args.detach:
        console.print(f"detached: follow with `cockpit ls`, stop with `cockpit stop {run_dir.name}`")
        print(run_dir)
        return 0
    return follow_started("run", run_dir, launch.running, args.no_ui)


def cmd_resume(args: argparse.Namespace) -> int:
    """Continue an ended run from its last checkpoint, in its own record; followed like `run`."""
    launch = lifecycle.resume(find(args), args.overrides, from_scratch=args.from_scratch)
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
    return follow_started("resume", launch.run_dir, launch.running, args.no_ui)


def cmd_attach(args: argparse.Namespace) -> int:
    """Watch a running run (the latest running one without RUN): the app, or headless lines."""
    if args.run is None:  # the latest running run, named
        from cockpit.service.runs import latest_running

        found = latest_running(runs_dir_of(args))
        if found is None:
            raise UsageError(
                f"no running run in {runs_dir_of(args)} to attach to: `cockpit ls` lists the runs, "
                "`cockpit replay RUN` plays an ended one back"
            )
        args.run = found.name
        console.print(f"attaching to {found.name}, the latest running run", markup=False)
    run_dir = find_readable(args)
    instead = f"without one, follow it with `cockpit attach {args.run} --no-ui`, or runs: `cockpit ls`"
    if not use_app("attach", no_ui=args.no_ui, refusal=instead):
        return watch_headless(run_dir)
    return open_app(run_dir, live=True)


STOP_MESSAGES = {
    StopOutcome.STOP_REQUESTED: "stop requested (checkpoint, then exit); run stop again to kill",
    StopOutcome.KILL_REQUESTED: "kill requested",
    StopOutcome.TRAINER_STOP_REQUESTED: "supervisor lost; stop requested from the trainer itself",
    StopOutcome.TRAINER_KILLED: "supervisor lost; training process group killed",
}


def cmd_stop(args: argparse.Namespace) -> int:
    """Ask a run to checkpoint and stop (or, with --kill, kill it), and say what was asked."""
    run_dir = find(args)
    outcome = lifecycle.stop(run_dir, kill=args.kill)
    console.print(f"{run_dir.name}: {STOP_MESSAGES[outcome]}")
    return 0


def cmd_join(args: argparse.Namespace) -> int:
    """Start this node's ranks of a run launched without ssh; with --wait, until they end."""
    run_dir = find(args)
    launch = lifecycle.join(run_dir, args.node_rank)
    log = RunPaths(run_dir).node_supervisor_log(args.node_rank)
    console.print(f"node {args.node_rank} joins run [bold]{run_dir.name}[/]; its supervisor's log: {log}")
    if not args.wait or launch.process is None:
        return 0
    code = launch.process.wait()
    console.print(f"node {args.node_rank}: its ranks ended ({'ok' if code == 0 else 'failed'})")
    return 0 if code == 0 else 1


def cmd_eval(args: argparse.Namespace) -> int:
    """Score a run's base model and adapter (or, with --profile, base models), then print the report."""
    models = parse_named(args.model, "--model")
    request = lifecycle.eval_request(args.examples, args.time_budget)
    if args.run:
        if args.profile:
            raise UsageError("give a RUN or --profile, not both")
        run_dir = find_readable(args)
        launch = lifecycle.evaluate(run_dir, models, request)
        console.print(f"evaluating {run_dir.name} (output also in {RunPaths(run_dir).output_log})")
        status = follow_headless(run_dir, launch.running, results=False)  # the report is printed below
        evaluation = lifecycle.last_evaluation(run_dir)
        if evaluation is None:
            return exit_code(status)
        if evaluation.status == "stopped":
            return EXIT_CODES["stopped"]
        if evaluation.exit_code != 0:
            why = "" if evaluation.exit_code is None else f" ({describe_exit(evaluation.exit_code)})"
            console.print(f"[red]evaluation failed{why}; see {RunPaths(run_dir).output_log}[/]")
            return 1
        return report_and_print(run_dir, "md", None)  # also where a failed report is tried again
    if not args.profile:
        raise UsageError("give a RUN to evaluate, or --profile P with --model NAME=PATH")
    for name, path in models:
        if not (path / "config.json").is_file():
            raise UsageError(f"--model {name}={path}: no config.json there")
    launch = lifecycle.start_eval(runs_dir_of(args), args.profile, models, list(sys.argv), request)
    console.print(f"evaluation run [bold]{launch.run_dir.name}[/]: base model and {len(models)} other(s)")
    code = exit_code(follow_headless(launch.run_dir, launch.running, results=False))
    if code == 0:
        report_and_print(launch.run_dir, "md", None)
    return code


# --- the commands' flags ------------------------------------------------------------------------------
def add_run(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register `cockpit run` and its flags."""
    run = sub.add_parser(
        "run",
        parents=[common],
        help="start a training run",
        description="Validate the profile, create a run record and start a detached supervisor that "
        "launches the trainer. Closing the terminal never stops the run; Ctrl-C asks it to save a "
        "checkpoint and stop (a second Ctrl-C kills).",
    )
    run.add_argument("--profile", default=DEFAULT_PROFILE, help=PROFILE_HELP)
    add_overrides(run)
    run.add_argument(
        "--no-ui", action="store_true", help="headless: a progress line instead of the full-screen app"
    )
    run.add_argument(
        "--detach", action="store_true", help="start the run and return at once (prints the run dir)"
    )
    run.set_defaults(func=cmd_run)


def add_stop(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register `cockpit stop` and its flags."""
    stop = sub.add_parser(
        "stop", parents=[common], help="ask a run to checkpoint and stop; a second stop kills"
    )
    stop.add_argument("run", help="run id, unique id prefix, path, or 'latest'")
    stop.add_argument("--kill", action="store_true", help="kill the training processes at once")
    stop.set_defaults(func=cmd_stop)


def add_join(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register `cockpit join` and its flags."""
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


def add_resume(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register `cockpit resume` and its flags."""
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


def add_eval(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register `cockpit eval` and its flags."""
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
        "--examples",
        type=whole(1),
        metavar="N",
        help="score a stratified sample of N held-out examples (each tenant its share, at least one), the "
        "same for every system; overrides the profile's eval.examples",
    )
    ev.add_argument(
        "--time-budget",
        type=duration,
        metavar="DURATION",
        help="stop scoring when the budget is spent (90s, 20m, 1.5h): the first system gets its share and "
        "stops after a batch, the others score the same examples; overrides eval.time_budget_s",
    )
    ev.add_argument(
        "--no-ui", action="store_true", help="accepted for symmetry; evaluation is always headless"
    )
    ev.set_defaults(func=cmd_eval)


def add_attach(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register `cockpit attach` and its flags."""
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


COMMANDS: dict[str, Registrar] = {
    "run": add_run,
    "stop": add_stop,
    "join": add_join,
    "resume": add_resume,
    "eval": add_eval,
    "attach": add_attach,
}
