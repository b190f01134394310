"""Figures in the README (and docs/) come from the committed benchmark results, and fail here when they part.

A measured figure is a link to the result it comes from, its title naming the value:

    [6 min 30 s](benchmarks/results/fresh_clone.json "rows[step=cockpit run --no-ui (whole)].s")

The pages are README.md, docs/*.md and benchmarks/README.md. The path is read from the Markdown file's
folder (`../benchmarks/results/...` from docs/); the title is a path into the JSON: keys joined by dots,
`[3]` an index, `[key=value]` the list item whose `key` is `value` (spaces around it ignored), and
optionally a unit the JSON's value is shown in: ` in %` (a fraction shown as a percentage), ` in GiB` or
` in MiB` (bytes). The link's text is read back as a number (a duration in h/min/s is seconds) and must
be the JSON's value rounded as the text shows it. A command's output quoted in a code block, marked
`<!-- output of: cockpit ... -->` just above it, is compared with what the command prints now, line by
line (`...` leaves out the rest of a line).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from cockpit import cli

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md"]
FIGURE = re.compile(r"\[([^\]]+)\]\(([^)\s]+\.json) \"([^\"]+)\"\)")
OUTPUT = re.compile(r"<!-- output of: (cockpit [^>]*?) -->\s*\n```[^\n]*\n(.*?)\n```", re.DOTALL)
DURATION = re.compile(r"(?:(\d+(?:\.\d+)?) h)?\s*(?:(\d+(?:\.\d+)?) min)?\s*(?:(\d+(?:\.\d+)?) s)?")
NUMBER = re.compile(r"(-?[\d,]*\.?\d+)")
UNIT_S = {1: 3600.0, 2: 60.0, 3: 1.0}
SHOWN_IN = {"%": 100.0, "GiB": 1 / 1024**3, "MiB": 1 / 1024**2, "ms": 1000.0}  # the JSON value times this


def _prose(page: Path) -> str:
    """The page without its code (blocks and inline), where a link is only an example."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    return re.sub(r"`[^`]*`", "", text)


def _figures() -> list[tuple[Path, str, str, str]]:
    return [(page, *m.groups()) for page in PAGES for m in FIGURE.finditer(_prose(page))]


def select(data: Any, path: str) -> Any:
    """The value at `path` (`rows[step=clone to report].s`, `a.b[0]`) in `data`; KeyError if none."""
    for key, index, field, value in re.findall(r"([^.\[\]]+)|\[(\d+)\]|\[([^=\]]+)=([^\]]*)\]", path):
        if key:
            data = data[key]
        elif index:
            data = data[int(index)]
        else:
            found = [item for item in data if str(item.get(field, "")).strip() == value.strip()]
            if len(found) != 1:
                raise KeyError(f"{len(found)} items with {field} = {value!r}")
            data = found[0]
    return data


def shown(text: str) -> tuple[float, float]:
    """A figure as written: its value and half its last place (`6 min 30 s` -> 390 s, 0.5 s)."""
    duration = DURATION.fullmatch(text.strip())
    if duration and any(duration.groups()):
        last = max(i for i, part in enumerate(duration.groups(), 1) if part)
        places = len(duration.group(last).partition(".")[2])
        value = sum(float(part) * UNIT_S[i] for i, part in enumerate(duration.groups(), 1) if part)
        return value, UNIT_S[last] * 10.0**-places / 2
    number = NUMBER.search(text)
    if number is None:
        raise ValueError(f"{text!r}: no number to compare")
    digits = number.group(1).replace(",", "")
    return float(digits), 10.0 ** -len(digits.partition(".")[2]) / 2


@pytest.mark.parametrize(("page", "text", "target", "where"), _figures(), ids=lambda v: str(v)[:40])
def test_a_linked_figure_is_its_benchmark_result(page: Path, text: str, target: str, where: str) -> None:
    source = (page.parent / target).resolve()
    assert source.is_relative_to(REPO / "benchmarks" / "results"), f"{target}: not a committed result"
    path, _, unit = where.partition(" in ")
    assert not unit or unit in SHOWN_IN, f"{where}: units are {', '.join(SHOWN_IN)}"
    value = float(select(json.loads(source.read_text(encoding="utf-8")), path)) * SHOWN_IN.get(unit, 1.0)
    figure, half = shown(text)
    assert abs(figure - value) <= half + 1e-9, (
        f"{page.relative_to(REPO)}: {text!r} against {target} {where} = {value}: update the text or result"
    )


def test_the_pages_link_their_figures() -> None:
    """The mechanism is in use: the quick start's times come from the fresh-clone benchmark."""
    quick_start = [f for f in _figures() if "fresh_clone.json" in f[2]]
    assert len(quick_start) >= 4


def _readme_install_and_development() -> str:
    pages = [REPO / "README.md", REPO / "docs" / "install.md", REPO / "docs" / "development.md"]
    return "\n".join(_prose(page) for page in pages)  # example output and commands are not claims


def test_no_unlinked_time_or_test_count_where_figures_went_stale() -> None:
    """Before: the quick start's run times and the test counts were from runs long gone. The README, the
    install page and the development page hold none that is not linked."""
    prose = FIGURE.sub("", _readme_install_and_development())
    stale = re.findall(r"\d+(?:\.\d+)? (?:min|s|minutes|seconds)\b|\d+ tests\b|\d+ passed", prose)
    assert stale == [], "figures with no benchmark behind them: link them to a result, or drop them"


def _outputs() -> list[tuple[str, str]]:
    return [m.groups() for page in PAGES for m in OUTPUT.finditer(page.read_text(encoding="utf-8"))]


@pytest.mark.parametrize(("command", "block"), _outputs(), ids=lambda v: str(v)[:50])
def test_a_quoted_output_is_what_the_command_prints(
    command: str, block: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(shlex.split(command)[1:]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    for line in block.splitlines():
        for piece in line.split("..."):
            piece = " ".join(piece.split()).strip(" ;,")
            assert not piece or piece in printed, f"`{command}` no longer prints: {piece}"


def test_the_plan_examples_are_checked() -> None:
    assert any(command.startswith("cockpit plan") for command, _ in _outputs())
