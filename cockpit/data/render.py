"""`cockpit data`'s tables: an `Inspection` drawn with rich."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cockpit.data.examples import SPLITS
from cockpit.data.inspection import PARTS, Histogram, Inspection

SPARKS = " ▁▂▃▄▅▆▇█"
BAR_WIDTH = 30
SHOWN_PROBLEMS = 10


def sparkline(h: Histogram) -> str:
    """One character a bin, its height the bin's share of the tallest."""
    top = max(h.counts) or 1
    return "".join(SPARKS[max(1, round(c / top * (len(SPARKS) - 1)))] if c else "·" for c in h.counts)


def _split_names(insp: Inspection) -> list[str]:
    seen = {s for counts in insp.splits.values() for s in counts}
    return [s for s in dict.fromkeys(SPLITS.values()) if s in seen]


def _tenants(insp: Inspection) -> Table:
    table = Table(title="tenants: examples per split", title_justify="left", box=None, header_style="bold")
    names = _split_names(insp)
    table.add_column("tenant")
    for name in names:
        table.add_column(name, justify="right")
    table.add_column("labels", justify="right")
    for tenant, counts in insp.splits.items():
        table.add_row(
            escape(tenant), *(f"{counts.get(n, 0):,}" for n in names), str(len(insp.labels[tenant]))
        )
    return table


def _labels(insp: Inspection) -> Table:
    table = Table(
        title="labels per tenant: gold count (every split)",
        title_justify="left",
        box=None,
        header_style="bold",
    )
    table.add_column("tenant")
    table.add_column("label: count")
    for tenant, counts in insp.labels.items():
        cells = [
            f"{escape(label)} {n:,}" if n else f"[yellow]{escape(label)} 0[/]" for label, n in counts.items()
        ]
        table.add_row(escape(tenant), "  ".join(cells))
    return table


def _lengths(insp: Inspection) -> Table:
    table = Table(title="tokens an example", title_justify="left", box=None, header_style="bold")
    for col, justify in (("part", "left"), ("min", "right"), ("median", "right"), ("p95", "right"),
                         ("max", "right"), ("histogram", "left"), ("range", "right")):  # fmt: skip
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for part in PARTS:
        values = sorted(insp.lengths.get(part, []))
        if not values:
            continue
        h = insp.histogram(part)
        p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
        table.add_row(
            part,
            f"{values[0]:,}",
            f"{values[len(values) // 2]:,}",
            f"{p95:,}",
            f"{values[-1]:,}",
            sparkline(h),
            f"{h.lo:,}–{h.hi:,}",
        )
    return table


def _total_histogram(insp: Inspection) -> Table:
    h = insp.histogram("total")
    table = Table(
        title=f"whole examples against training.seq_len {insp.seq_len}",
        title_justify="left",
        box=None,
        header_style="bold",
    )
    table.add_column("tokens", justify="right")
    table.add_column("examples", justify="right")
    table.add_column("")
    top = max(h.counts) or 1
    edges = h.edges()
    for i, count in enumerate(h.counts):
        over = edges[i + 1] > insp.seq_len
        bar = "█" * max(1 if count else 0, round(count / top * BAR_WIDTH))
        style = "red" if edges[i] >= insp.seq_len else "yellow" if over else "green"
        table.add_row(f"{edges[i]:,}–{edges[i + 1]:,}", f"{count:,}", Text(bar, style=style))
    return table


def _truncation(insp: Inspection) -> Text:
    t = insp.truncation
    if t is None:
        return Text("")
    if not t.over:
        return Text(f"every example fits training.seq_len {t.seq_len}: nothing is cut", style="green")
    mean_cut = t.prompt_tokens_cut / t.over
    words = (
        f"{t.over:,} examples ({insp.over_share():.1%}) are longer than training.seq_len {t.seq_len}: "
        f"truncation cuts {t.prompt_tokens_cut:,} prompt tokens from their start ({mean_cut:.0f} an example)"
    )
    if t.answer_cut:
        words += f"; {t.answer_cut:,} lose answer tokens too, their label among them"
    return Text(words, style="yellow")


def _problems(insp: Inspection) -> RenderableType:
    if not insp.problems:
        return Text("no problems: no repeated ids, every gold label in its tenant's set, no empty reasoning",
                    style="green")  # fmt: skip
    lines = Text()
    by_kind: dict[str, list[str]] = {}
    for p in insp.problems:
        by_kind.setdefault(p.kind, []).append(p.message)
    for kind, messages in by_kind.items():
        blocking = next(p.blocking for p in insp.problems if p.kind == kind)
        mark, style = ("✗", "red") if blocking else ("!", "yellow")
        lines.append(f"{mark} {kind}: {len(messages):,}\n", style=f"bold {style}")
        for message in messages[:SHOWN_PROBLEMS]:
            lines.append(f"    {message}\n", style=style)
        if len(messages) > SHOWN_PROBLEMS:
            lines.append(f"    ... and {len(messages) - SHOWN_PROBLEMS:,} more (--format json lists all)\n")
    return lines


def render(insp: Inspection) -> Group:
    """The whole inspection, table by table."""
    head = Text.assemble(
        ("data ", "bold"),
        insp.path,
        f" ({insp.format}) · {insp.examples:,} examples"
        + (f" (of {insp.rows:,} rows; the others below, under problems)" if insp.rows > insp.examples else "")
        + f" · {len(insp.splits)} tenants",
        f" · splits from {insp.split_from}",
    )
    parts: list[RenderableType] = [head, Text(""), _tenants(insp), Text(""), _labels(insp), Text("")]
    if insp.lengths:
        counted = Text(f"counted with {insp.counted_with}", style="dim")
        parts += [_lengths(insp), counted, Text(""), _total_histogram(insp), _truncation(insp), Text("")]
    parts += [Text("problems", style="bold"), _problems(insp)]
    return Group(*parts)
