"""How report figures are written, once for every renderer (Markdown, the terminal table, the app)."""

from __future__ import annotations

from cockpit.report.model import Delta, Report, Row
from cockpit.units import about

VERDICT_COLOUR = {"better": "green", "worse": "red", "unclear": "yellow"}  # by `Delta.verdict`
FEW = 10  # scored examples of a tenant under which its percentile-bootstrap interval is too narrow


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


def n_text(row: Row) -> str:
    """A tenant's examples: `8 of 40` when a sample of its held-out examples was scored, else `40`."""
    if row.n is None:
        return ""
    return f"{row.n} of {row.population}" if row.population not in (None, row.n) else str(row.n)


def examples_text(report: Report) -> str:
    """`40 of 200 held-out examples (a sample)`, or `200 held-out examples`."""
    population = (report.sample or {}).get("population")
    if report.sample and population:
        return f"{report.examples} of {population} held-out examples (a sample)"
    return f"{report.examples} held-out examples"


def sample_line(report: Report) -> str | None:
    """How the examples were chosen and what it does to the intervals; None when all were scored."""
    sample = report.sample
    if not sample:
        return None
    by = sample.get("by") or []
    how = [f"a stratified random sample (each tenant its share, at least one; seed {sample.get('seed')})"]
    if "examples" in by and sample.get("requested"):
        how.append(f"{sample['requested']} asked for")
    if "time budget" in by and sample.get("time_budget_s"):
        how.append(f"cut short by the time budget of {about(float(sample['time_budget_s']))}")
    line = (
        f"Scored {examples_text(report).removesuffix(' (a sample)')}: {', '.join(how)}; every system on the "
        "same examples. The 95% intervals are the bootstrap's over these examples: wider than the whole "
        "split's would be (no finite-population correction: they are about new examples, not this split)."
    )
    few = [t.name for t in report.tenants if t.n is not None and t.n < FEW]
    if few:
        line += (
            f" {', '.join(few)}: fewer than {FEW} examples scored, where a bootstrap interval understates "
            "the uncertainty."
        )
    return line


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
