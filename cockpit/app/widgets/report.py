"""The report screen's parts: the per-tenant table, the delta bars with their intervals, serving cost.

They render a `cockpit.report.Report`; the figures' wording comes from `cockpit.report.format`."""

from __future__ import annotations

from rich import box
from rich.console import RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.geometry import Size
from textual.widget import Widget

from cockpit.report import (
    METRIC_NAMES,
    VERDICT_COLOUR,
    Delta,
    Report,
    Row,
    Scale,
    Serving,
    bar_cells,
    ci_text,
    delta_scale,
    engine_line,
    n_text,
    points,
    production_lines,
    signed,
    usd,
)
from cockpit.report.production import Production

MUTED = "#8a8a8a"
VERDICT_BAR = {"better": "#2f7d3a", "worse": "#a3312f", "unclear": "#8c7414"}
WHISKER = "#f0f0f0"
LABEL_WIDTH = 12
VALUE_WIDTH = 24  # "+58.1 [+40.0, +71.2]"


def delta_text(d: Delta | None) -> Text:
    """`+58.1 [+40.0, +71.2]` in the verdict's colour (green: interval above 0, red: below, yellow: both)."""
    if d is None:
        return Text("-", MUTED)
    colour = VERDICT_COLOUR[d.verdict]
    text = Text()
    text.append(signed(d.value), f"bold {colour}")
    text.append(f" {ci_text(d)}", colour)
    return text


def metric_table(report: Report, metric: str = "macro_f1", compact: bool = False) -> Table:
    """Per tenant: every system's `metric` (points), the tuned model's delta of that metric against each
    other system with its 95% interval; then the mean over tenants (`compact`: right under them)."""
    table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False, expand=True, show_edge=False)
    table.add_column("tenant", min_width=10)
    table.add_column("n", justify="right", style=MUTED)
    for s in report.systems:
        style = "bold" if s == report.tuned else ""
        table.add_column(f"{s}\n{METRIC_NAMES[metric]}", justify="right", style=style, min_width=9)
    deltas = report.compared
    for o in deltas:
        table.add_column(f"Δ {METRIC_NAMES[metric]} vs {o}\n[95% CI]", justify="right", min_width=VALUE_WIDTH)

    def cells(row: Row) -> list[RenderableType]:
        out: list[RenderableType] = [points(row.metric(s, metric)) for s in report.systems]
        out += [delta_text(row.delta(o, metric)) for o in deltas]
        return out

    for i, t in enumerate(report.tenants):
        last = i == len(report.tenants) - 1 and not compact
        table.add_row(Text(t.name), n_text(t), *cells(t), end_section=last)
    table.add_row(Text("mean", "bold"), "", *cells(report.mean), style="bold")
    return table


def has_metric_deltas(report: Report, metric: str) -> bool:
    """Whether the report holds the tuned model's deltas of `metric` (before version 3: macro F1's only)."""
    other = report.reference
    return other is not None and any(t.delta(other, metric) is not None for t in report.tenants)


def delta_rows(report: Report, metric: str) -> list[tuple[str, Delta]]:
    """(tenant, delta of `metric` against the reference system) for every tenant that has one."""
    other = report.reference
    if other is None:
        return []
    return [(t.name, d) for t in report.tenants if (d := t.delta(other, metric)) is not None]


def delta_chart(report: Report, width: int, metric: str = "macro_f1", compact: bool = False) -> Text:
    """One row per tenant and the mean: a bar from 0 to the tuned model's delta of `metric` against the
    reference system, its 95% interval drawn over it as a whisker, the value beside it; a scale underneath
    (`compact`: the mean right under the tenants, the scale's values on its line)."""
    other = report.reference
    text = Text(no_wrap=True, overflow="crop")
    if other is None:
        text.append("no fine-tuned model to compare (the report has no deltas)", f"italic {MUTED}")
        return text
    rows = delta_rows(report, metric)
    if not rows:
        text.append(
            f"this report has no {METRIC_NAMES[metric]} deltas (written before version 3): "
            "`cockpit report RUN` rebuilds it",
            f"italic {MUTED}",
        )
        return text
    mean = report.mean.delta(other, metric)
    field = max(10, width - LABEL_WIDTH - VALUE_WIDTH - 2)
    scale = delta_scale([d for _, d in rows] + ([mean] if mean else []), field)

    def bar(label: str, d: Delta, label_style: str = "") -> None:
        text.append(f"{label[: LABEL_WIDTH - 1]:<{LABEL_WIDTH}}", label_style)
        bar_style = Style(bgcolor=VERDICT_BAR[d.verdict])
        for cell in bar_cells(d, scale):
            color = WHISKER if cell.whisker else MUTED
            style = Style(color=color, bold=cell.whisker) + (bar_style if cell.bar else Style())
            text.append(cell.glyph, style)
        text.append("  ")
        text.append_text(delta_text(d))
        text.append("\n")

    for name, d in rows:
        bar(name, d)
    if mean is not None:
        if rows and not compact:
            text.append("\n")
        bar("mean", mean, "bold")
    text.append(" " * LABEL_WIDTH)
    if compact:
        text.append(scale_line(scale), MUTED)
        return text
    # The scale: tick marks on a line, their values (points) under them.
    axis = [" "] * field
    labels = [" "] * (field + 6)
    for tick in scale.ticks():
        c = scale.col(tick)
        axis[c] = "┼" if abs(tick) < 1e-9 else "┬"
        label = "0" if abs(tick) < 1e-9 else f"{100 * tick:+g}"
        start = min(max(0, c - len(label) // 2), field - len(label))
        if all(ch == " " for ch in labels[max(0, start - 1) : start + len(label) + 1]):
            labels[start : start + len(label)] = label
    text.append("".join(axis).replace(" ", "─"), MUTED)
    text.append("\n" + " " * LABEL_WIDTH)
    text.append("".join(labels).rstrip(), MUTED)
    return text


def scale_line(scale: Scale) -> str:
    """The scale in one line: the zero mark and each tick's value (points) on the rule, where they fit."""
    line = ["─"] * scale.width
    line[scale.col(0.0)] = "┼"
    for tick in scale.ticks():
        if abs(tick) < 1e-9:
            continue
        label = f"{100 * tick:+g}"
        c = scale.col(tick)
        start = min(max(0, c - len(label) // 2), scale.width - len(label))
        if all(ch == "─" for ch in line[max(0, start - 1) : start + len(label) + 1]):
            line[start : start + len(label)] = label
    return "".join(line)


def serving_text(s: Serving | None, width: int = 100) -> Text:
    """Measured latency and throughput, and the cost per million generated tokens against the API's."""
    text = Text(no_wrap=True, overflow="ellipsis")
    if s is None:
        text.append("no serving measurement in this run", f"italic {MUTED}")
        return text
    text.append("measured on ", MUTED)
    text.append(s.measured_on, "bold")
    text.append(" · the model as evaluated: 4-bit base + LoRA adapter", MUTED)
    if s.on_cpu:
        text.append("\n⚠ CPU: ", "bold yellow")
        text.append("real measurements of the tiny CPU model, not of a production model", "yellow")
    text.append("\n")

    def figure(label: str, value: str, unit: str) -> None:
        text.append(f"{label} ", MUTED)
        text.append(value, "bold")
        text.append(f" {unit}   ", MUTED)

    figures = []
    if s.ttft_ms is not None:
        figures.append(("first token", f"{s.ttft_ms:,.1f}", "ms"))
    if s.per_token_ms is not None:
        figures.append(("per token", f"{s.per_token_ms:,.2f}", "ms"))
    if s.stream_tokens_per_s is not None:
        figures.append(("one stream", f"{s.stream_tokens_per_s:,.1f}", "tok/s"))
    if s.batch_tokens_per_s is not None:
        figures.append((f"batch of {s.batch_size or '?'}", f"{s.batch_tokens_per_s:,.1f}", "tok/s"))
    used = 0
    for label, value, unit in figures:  # as many a line as fit: a figure never breaks
        size = len(f"{label} {value} {unit}   ")
        if used and used + size - 3 > width:
            text.append("\n")
            used = 0
        figure(label, value, unit)
        used += size
    text.append("\n")
    ours, api = s.usd_per_mtok, s.api_usd_per_mtok
    bar_width = max(10, width - 52)
    top = max([x for x in (ours, api) if x] or [1.0])
    name_width = max(len("self-hosted"), len(s.api_name)) + 1

    def cost(name: str, value: float | None, color: str, note: str) -> None:
        text.append(f"{name:<{name_width}}", "bold")
        if value is None:
            text.append(note, f"italic {MUTED}")
            text.append("\n")
            return
        text.append(f"{usd(value):>9} / Mtok  ", "bold")
        eighths = round(value / top * bar_width * 8)
        full, part = divmod(max(1, eighths), 8)
        text.append("█" * full + ("▏▎▍▌▋▊▉"[part - 1] if part else ""), color)
        text.append(f"  {note}", MUTED)
        text.append("\n")

    price = f"at ${s.hour_usd:,.2f} per machine-hour" if s.hour_usd else ""
    cost("self-hosted", ours, "#4e9be6", price if ours is not None else "no hourly price in the profile")
    cost(s.api_name, api, "#f28e2b", "" if api is not None else "no API price in the profile")
    if ours and api:
        ratio = api / ours
        verdict = (
            f"self-hosted is {ratio:,.0f}× cheaper" if ratio >= 1 else f"the API is {1 / ratio:,.1f}× cheaper"
        )
        text.append(verdict, "bold green" if ratio >= 1 else "bold yellow")
        text.append(" per generated token, at the measured batch speed", MUTED)
    text.rstrip()
    return text


def production_text(report: Report) -> Text:
    """What the measured figures are (the cockpit's engine: an upper bound on cost) and the production
    path, the `vllm serve` command of the tuned adapter, in few lines (a long path folds)."""
    text = Text(overflow="fold")
    if report.serving is not None:
        text.append(engine_line(report.serving.batch_size, short=True), MUTED)
    p: Production | None = report.production
    if p is not None:
        first, *rest = production_lines(p, short=True)
        text.append(("\n" if text else "") + first + "\n")
        text.append(p.command, "bold")
        for line in rest:
            text.append("\n" + line, MUTED)
    return text


class DeltaChart(Widget):
    """The delta bars of the metric shown: drawn to the widget's width, one line per tenant, the mean,
    and a scale."""

    def __init__(self, report: Report, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.report = report
        self.metric = "macro_f1"
        self.compact = False  # a short terminal: the mean under the tenants, the scale on one line
        self._drawn: dict[tuple[str, int, bool], Text] = {}  # the bars drawn: `m` cycles back at once

    def show(self, metric: str) -> None:
        """Draw `metric`'s bars; the layout is redone only when the number of rows changes."""
        rows = len(delta_rows(self.report, self.metric))
        self.metric = metric
        self.refresh(layout=len(delta_rows(self.report, metric)) != rows)

    def set_compact(self, compact: bool) -> None:
        if compact != self.compact:
            self.compact = compact
            self.refresh(layout=True)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        other = self.report.reference
        rows = len(delta_rows(self.report, self.metric))
        if other is None or not rows:
            return 1
        mean = self.report.mean.delta(other, self.metric) is not None
        return rows + (mean + 1 if self.compact else 2 * mean + 2)

    def render(self) -> Text:
        key = (self.metric, self.size.width, self.compact)
        if key not in self._drawn:
            self._drawn[key] = delta_chart(self.report, self.size.width, self.metric, self.compact)
        return self._drawn[key]
