"""How report figures are written, once for every renderer (Markdown, the terminal table, the app)."""

from __future__ import annotations

from cockpit.report.model import Delta, Report

VERDICT_COLOUR = {"better": "green", "worse": "red", "unclear": "yellow"}  # by `Delta.verdict`


def points(x: float | None) -> str:
    """A 0..1 figure in points with one decimal (`77.8`); `-` when there is none."""
    return "-" if x is None else f"{100 * x:.1f}"


def signed(x: float) -> str:
    """A 0..1 difference in signed points (`+5.2`)."""
    return f"{100 * x:+.1f}"


def ci_text(d: Delta) -> str:
    """The 95% interval of a delta: `[+1.0, +9.3]`."""
    return f"[{signed(d.low)}, {signed(d.high)}]"


def delta_cell(d: Delta | None, bold: bool = False) -> str:
    """`+5.2 [+1.0, +9.3]` for a delta and its interval (`bold`: the value in Markdown bold); `-` when
    there is none."""
    if d is None:
        return "-"
    value = signed(d.value)
    return f"{'**' + value + '**' if bold else value} {ci_text(d)}"


def usd(x: float) -> str:
    """Dollars, with four decimals below a cent."""
    return f"${x:,.2f}" if x >= 0.01 else f"${x:.4f}"


def summary_line(report: Report) -> str:
    """One line: mean macro F1 of every system, and the tuned model's mean delta against the base."""
    parts = [f"{s} {points(m.macro_f1)}" for s, m in report.mean.metrics.items()]
    line = "mean macro F1 " + ", ".join(parts)
    delta = report.mean.deltas.get("base")
    if delta:
        line += f" (finetuned vs base {signed(delta.value)} points)"
    return line
