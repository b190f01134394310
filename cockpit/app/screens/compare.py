"""The compare screen: several runs overlaid in four charts, and what each reached in a table.

It gets a `cockpit.compare.Comparison` (read by the app's worker) and reads nothing itself. `x` switches
the charts between step and elapsed time; the legend tags runs A, B, C... as the table does, and the
title gives each tag's whole run id (a run still going is marked, and followed). Narrower than 110
columns, `f` switches the table with the tuned model's macro F1 per tenant (a row a run).
"""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid, Horizontal
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Static

from cockpit.app.compare_charts import AXES, COMPARE_CHARTS, TITLES, build_charts, run_color
from cockpit.app.widgets.compare_chart import CompareChart
from cockpit.compare import Comparison, f1_rows, summary_rows
from cockpit.units import memory

COLUMNS = ("run", "steps", "loss", "val loss", "tok/s", "CUDA", "GPU", "RSS", "F1", "time")
TABLE_NOTE = "tok/s: median · CUDA: trainer's peak · GPU: NVML used · F1: mean, tuned · -: not recorded"
NARROW_NOTE = "f: F1 per tenant · tok/s: median · CUDA: trainer's peak · GPU: NVML used"


RUNNING = "running"


def going(comparison: Comparison) -> list[str]:
    """The tags of the runs still going (their record says running: the screen reads them again)."""
    return [s.tag for s in comparison.summaries if s.status == RUNNING]


def title_text(
    comparison: Comparison | None, axis: str, error: str | None = None, width: int = 10_000
) -> Text:
    """What is compared and how (the axis, how lines are drawn, the runs followed); then each run's tag and
    whole id, in its colour, as many a line as fit `width` (an id is never cut)."""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(" COMPARE ", "bold reverse cyan")
    if comparison is None:
        text.append(f" {error or 'reading the runs...'}")
        return text
    text.append(
        f" {len(comparison.runs)} runs · x: {'step' if axis == 'step' else 'elapsed time'} (x switches)"
    )
    live = going(comparison)
    if live:
        text.append(f" · following {', '.join(live)}: still running", "bold yellow")
    how = " · lines: mean per column"
    if text.cell_len + len(how) <= width:
        text.append(how)
    used = width
    for i, s in enumerate(comparison.summaries):
        entry = Text.assemble((f"■ {s.tag}", f"bold {run_color(i)}"), f" {s.run}")
        if s.status == RUNNING:
            entry.append(" ● running", "italic yellow")
        if used + 2 + entry.cell_len > width:
            text.append("\n")
            used = 0
        text.append("  " if used else " ")
        text.append_text(entry)
        used += (2 if used else 1) + entry.cell_len
    return text


def summary_table(comparison: Comparison) -> Table:
    """One row a run: its tag and label, then `cockpit.compare.summary_rows`' figures (memory in short)."""
    table = Table(box=None, header_style="bold", pad_edge=False, expand=True)
    for i, name in enumerate(COLUMNS):
        table.add_column(
            name,
            justify="left" if i == 0 else "right",
            no_wrap=True,
            overflow="ellipsis",
            ratio=1 if i == 0 else None,
        )
    for i, (s, row) in enumerate(zip(comparison.summaries, summary_rows(comparison), strict=True)):
        peaks = [memory(v, short=True) for v in (s.cuda_peak_mib, s.gpu_used_mib, s.rss_peak_mib)]
        run = Text.assemble((f"■ {s.tag} ", f"bold {run_color(i)}"), s.label or s.run)
        if s.status == RUNNING:
            run = Text.assemble(run, (" ●", "yellow"))
        f1 = "-" if s.mean_f1 is None else f"{s.mean_f1 * 100:.1f}"
        table.add_row(run, *row[2:6], *peaks, f1, row[9])
    return table


NO_F1 = "no report.json in these runs: `cockpit eval RUN` scores a run"


def f1_table(comparison: Comparison) -> Table | Text:
    """The tuned model's macro F1, a row a tenant and a column a run (beside the table, 110 columns on)."""
    rows = f1_rows(comparison)
    if not rows:
        return Text(NO_F1, style="italic")
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("tenant", no_wrap=True, overflow="ellipsis", max_width=18)
    for i, s in enumerate(comparison.summaries):
        table.add_column(Text(s.tag, style=f"bold {run_color(i)}"), justify="right")
    for row in rows:
        table.add_row(*row, style="bold" if row[0] == "mean" else None)
    return table


def f1_by_run(comparison: Comparison) -> Table | Text:
    """The same, a row a run and a column a tenant: as tall as the table it stands in for (`f`)."""
    rows = f1_rows(comparison)
    if not rows:
        return Text(NO_F1, style="italic")
    table = Table(box=None, header_style="bold", pad_edge=False, expand=True)
    table.add_column("run", no_wrap=True)
    for row in rows:
        table.add_column(
            row[0],
            justify="right",
            no_wrap=True,
            overflow="ellipsis",
            style="bold" if row[0] == "mean" else "",
        )
    for i, s in enumerate(comparison.summaries):
        table.add_row(Text(f"■ {s.tag}", f"bold {run_color(i)}"), *(row[i + 1] for row in rows))
    return table


class CompareScreen(Screen[None]):
    """Runs overlaid; everything it shows comes from one Comparison. Narrower than 110 columns, the
    per-tenant F1 panel takes the table's place when `f` is pressed."""

    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]] | None] = [(0, "-narrow"), (110, "-wide")]

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("x", "switch_axis", "Step/time"),
        Binding("f", "switch_table", "F1/tenant"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self, axis: str = "step") -> None:
        super().__init__()
        self.axis = axis if axis in AXES else "step"
        self.comparison: Comparison | None = None
        self.error: str | None = None

    def compose(self) -> ComposeResult:
        yield Static(title_text(None, self.axis), id="compare-title")
        with Grid(id="compare-charts"):
            for name in COMPARE_CHARTS:
                yield CompareChart(TITLES[name], id=f"compare-{name}", classes="chart")
        with Horizontal(id="compare-bottom"):
            yield Static(id="compare-table", classes="compare-panel")
            yield Static(id="compare-f1", classes="compare-panel")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#compare-table").border_title = "what each run reached"
        self.query_one("#compare-f1").border_title = "macro F1, tuned"

    @property
    def narrow(self) -> bool:
        return self.has_class("-narrow")

    def _title(self) -> None:
        title = title_text(self.comparison, self.axis, self.error, self.size.width or 10_000)
        self.query_one("#compare-title", Static).update(title)

    def show(self, comparison: Comparison | None, error: str | None = None) -> None:
        """Show what the worker read (or why it could not)."""
        self.comparison, self.error = comparison, error
        self._title()
        if comparison is None:
            return
        self.query_one("#compare-table", Static).update(summary_table(comparison))
        self._show_f1()
        self.call_after_refresh(self._draw)

    def _show_f1(self) -> None:
        if self.comparison is None:
            return
        f1 = self.query_one("#compare-f1", Static)
        f1.update(f1_by_run(self.comparison) if self.narrow else f1_table(self.comparison))
        f1.border_subtitle = "f: what each run reached" if self.narrow else None
        self.query_one("#compare-table").border_subtitle = NARROW_NOTE if self.narrow else TABLE_NOTE

    def on_resize(self) -> None:
        self._title()
        self._show_f1()
        self.refresh_bindings()
        self.call_after_refresh(self._draw)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "switch_table":  # wide, both tables are shown side by side
            return self.narrow
        return True

    def action_switch_table(self) -> None:
        """Narrow: the table of what each run reached, or the tuned model's F1 per tenant, in its place."""
        self.toggle_class("-f1")

    def _draw(self) -> None:
        if self.comparison is None:
            return
        try:
            widgets = {name: self.query_one(f"#compare-{name}", CompareChart) for name in COMPARE_CHARTS}
        except NoMatches:  # closing
            return
        dots = {name: w.dot_columns for name, w in widgets.items()}
        for name, chart in build_charts(self.comparison, self.axis, dots).items():
            widgets[name].x_unit = self.axis
            widgets[name].set_data(chart)

    def action_switch_axis(self) -> None:
        self.axis = "time" if self.axis == "step" else "step"
        self._title()
        self._draw()
