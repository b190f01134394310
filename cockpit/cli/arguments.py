"""Parsing the command line: one-line errors that name the flag, numbers checked on the way in, and the
flags several commands share (`--runs-dir`, `--profile`, `--set`)."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import Any

from cockpit.cli.common import UsageError
from cockpit.profiles import DEFAULT_PROFILE
from cockpit.service.runs import default_runs_dir

# What a command module gives for each of its commands: a function that adds the command to the
# top parser's subcommands, with the parent parser that holds `--runs-dir`.
Registrar = Callable[[argparse._SubParsersAction, argparse.ArgumentParser], None]


PROFILE_HELP = f"profile name (`cockpit profiles` lists them) or TOML path (default: {DEFAULT_PROFILE})"


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line errors (exit 2), the flag named, no usage block."""

    def error(self, message: str) -> Any:  # argparse's own signature says NoReturn
        raise UsageError(f"{self.prog}: {message} (see --help)")


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


DURATION_UNITS = {"h": 3600, "min": 60, "m": 60, "sec": 1, "s": 1}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_PART = re.compile(rf"({_NUMBER})(h|min|m|sec|s)")


def duration(text: str) -> float:
    """An argparse `type=`: a duration above 0, in seconds: `90`, `90s`, `20m`, `20 min`, `1.5h`, `1h30m`."""
    compact = re.sub(r"\s+", "", text.lower())
    if re.fullmatch(_NUMBER, compact):
        seconds = float(compact)
    elif re.fullmatch(rf"(?:{_PART.pattern})+", compact):
        seconds = sum(float(n) * DURATION_UNITS[unit] for n, unit in _PART.findall(compact))
    else:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a duration such as 90s, 20m, 1.5h or 1h30m")
    if not math.isfinite(seconds) or seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite duration above 0")
    return seconds


def add_overrides(parser: argparse.ArgumentParser) -> None:
    """`--set section.key=value`, validated with the profile (`cockpit.profiles.apply_overrides`)."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one profile field, e.g. --set training.max_steps=20 (repeatable)",
    )


def runs_dir_flag() -> Parser:
    """The parent parser of every command that reads or writes run records: `--runs-dir`."""
    common = Parser(add_help=False)
    common.add_argument(
        "--runs-dir",
        default=default_runs_dir(),
        help="where run records live (default: $COCKPIT_RUNS_DIR, else ./runs where that folder exists, "
        "else ~/.local/share/cockpit/runs)",
    )
    return common
