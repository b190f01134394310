"""The report for the terminal (the headless viewer prints it when a run ends): a rich table, then the
sample and the serving section in plain lines."""

from __future__ import annotations

from rich.console import RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cockpit.report.format import VERDICT_COLOUR, ci_text, n_text, points, sample_line, signed
from cockpit.report.markdown import serving_lines
from cockpit.report.model import Delta, Report, Row
from cockpit.report.production import production_lines


def _delta_markup(d: Delta | None) -> str:
    """The delta in its verdict's colour, then its interval; `-` when there is none."""
    if d is None:
        return "-"
    return f"[{VERDICT_COLOUR[d.verdict]}]{signed(d.value)}[/] {ci_text(d)}"


def macro_f1_table(report: Report) -> Table:
    """Per tenant, then the mean: every system's macro F1 and the tuned model's deltas, in points."""
    table = Table(title="macro F1 on the held-out split (points)", header_style="bold")
    table.add_column("tenant")
    if report.sampled:
        table.add_column("n", justify="right")
    for s in report.systems:
        table.add_column(s, justify="right")
    for o in report.compared:
        table.add_column(f"Δ vs {o} [95% CI]", justify="right")

    def cells(row: Row) -> list[str]:
        out = [points(row.metric(s, "macro_f1")) for s in report.systems]
        return out + [_delta_markup(row.deltas.get(o)) for o in report.compared]

    counted = report.sampled
    for t in report.tenants:
        table.add_row(escape(t.name), *([n_text(t)] if counted else []), *cells(t))
    table.add_row("[bold]mean[/]", *([""] if counted else []), *cells(report.mean), end_section=True)
    return table


def report_parts(report: Report) -> list[RenderableType]:
    """The whole report for a terminal: the table, how the examples were chosen, the serving figures and
    the production path (plain text: nothing in them is markup; the command on one line, to copy whole)."""
    parts: list[RenderableType] = [macro_f1_table(report)]
    sampled = sample_line(report)
    if sampled:
        parts.append(Text(sampled))
    if report.serving or report.production:
        parts.append(Text("serving", style="bold"))
    if report.serving:
        parts += [Text(line) for line in serving_lines(report.serving)]
    if report.production:
        first, *rest = production_lines(report.production)
        command = Text(f"  {report.production.command}", no_wrap=True, overflow="ignore")
        parts += [Text(first), command, *(Text(line) for line in rest)]
    return parts
