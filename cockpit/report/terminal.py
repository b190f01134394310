"""The report as a rich table for the terminal (the headless viewer prints it when a run ends)."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from cockpit.report.format import VERDICT_COLOUR, ci_text, points, signed
from cockpit.report.model import Delta, Report, Row


def _delta_markup(d: Delta | None) -> str:
    """The delta in its verdict's colour, then its interval; `-` when there is none."""
    if d is None:
        return "-"
    return f"[{VERDICT_COLOUR[d.verdict]}]{signed(d.value)}[/] {ci_text(d)}"


def macro_f1_table(report: Report) -> Table:
    """Per tenant, then the mean: every system's macro F1 and the tuned model's deltas, in points."""
    table = Table(title="macro F1 on the held-out split (points)", header_style="bold")
    table.add_column("tenant")
    for s in report.systems:
        table.add_column(s, justify="right")
    for o in report.compared:
        table.add_column(f"Δ vs {o} [95% CI]", justify="right")

    def cells(row: Row) -> list[str]:
        out = [points(row.metric(s, "macro_f1")) for s in report.systems]
        return out + [_delta_markup(row.deltas.get(o)) for o in report.compared]

    for t in report.tenants:
        table.add_row(escape(t.name), *cells(t))
    table.add_row("[bold]mean[/]", *cells(report.mean), end_section=True)
    return table
