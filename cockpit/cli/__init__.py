"""The `cockpit` command: parses arguments, calls the run's lifecycle (`cockpit.service.lifecycle`), prints.

One module a group of commands, each adding its own subcommands (`COMMANDS`): `run` (run, resume, attach,
stop, join, eval), `rehearse`, `prepare` (plan, data, doctor, profiles), `records` (ls, replay, report,
import) and `compare` (compare, export). `follow` opens the app or follows headless; `common` and
`arguments` hold what they share. The CLI parses and prints: the work is done below it.

Exit codes: 0 the run finished; 1 it failed; 2 bad input (profile, arguments, unknown run, a damaged
record); 3 it was stopped; 4 it stalled.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.markup import escape

from cockpit import __version__
from cockpit.cli import compare, prepare, records, rehearse, run
from cockpit.cli.arguments import Parser, runs_dir_flag
from cockpit.cli.common import EXIT_BAD_INPUT, UsageError, console
from cockpit.export import ExportError
from cockpit.importers.model import ForeignLogError
from cockpit.profiles import ProfileError
from cockpit.record import RecordError
from cockpit.service.lifecycle import LifecycleError

GROUPS = (run, rehearse, records, prepare, compare)
# The order `cockpit --help` lists the commands in (every group's commands, each once).
ORDER = (
    "run", "rehearse", "ls", "stop", "join", "resume", "eval", "import", "report",
    "plan", "data", "profiles", "doctor", "attach", "replay", "compare", "export",
)  # fmt: skip
BAD_INPUT = (UsageError, ProfileError, LifecycleError, RecordError, ForeignLogError, ExportError)

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
    """The top parser, with every group's commands added in `ORDER`."""
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
    common = runs_dir_flag()
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = {name: add for group in GROUPS for name, add in group.COMMANDS.items()}
    for name in sorted(commands, key=ORDER.index):  # a command missing from ORDER fails here, loudly
        commands[name](sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv`, run its command and return the exit code; bad input is one red line, exit 2."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return int(args.func(args))
    except BAD_INPUT as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
