"""The compare screen: several runs overlaid in four charts, and what each reached in a table.

It gets a `cockpit.compare.Comparison` (read by the app's worker) and reads nothing itself. `x` switches
the charts between step and elapsed time; the legend tags runs A, B, C... as the table does.
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

from cockpit.app.charts import fmt_mib
from cockpit.app.compare_charts import AXES, COMPARE_CHARTS, TITLES, build_charts, run_color
from cockpit.app.widgets.compare_chart import CompareChart
from cockpit.compare import Comparison, f1_rows, summary_rows

COLUMNS = ("run", "steps", "loss", "val loss", "tok/s", "CUDA", "GPU", "RSS", "F1", "time")
TABLE_NOTE = "tok/s: median · CUDA: trainer's peak · GPU: NVML used · F1: mean, tuned · -: not recorded"


def title_text(comparison: Comparison | None, axis: str, error: str | None = None) -> Text:
    """Two lines: which runs (in their colours); the axis and how the lines are drawn."""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(" cockpit ", "bold reverse")
    if comparison is None:
        text.append(f" compare · {error or 'reading the runs...'}")
        return text
    text.append(f" compare · {len(comparison.runs)} runs · ")
    for i, s in enumerate(comparison.summaries):
        text.append(f"■ {s.tag}", f"bold {run_color(i)}")
        text.append(f" {s.run}  ")
    text.append("\n")
    text.append(" COMPARE ", "bold reverse cyan")
    text.append(f" x: {'step' if axis == 'step' else 'elapsed time'} (x switches) · lines: mean per column")
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
        memory = [fmt_mib(v) for v in (s.cuda_peak_mib, s.gpu_used_mib, s.rss_peak_mib)]
        run = Text.assemble((f"■ {s.tag} ", f"bold {run_color(i)}"), s.label or s.run)
        f1 = "-" if s.mean_f1 is None else f"{s.mean_f1 * 100:.1f}"
        table.add_row(run, *row[2:6], *memory, f1, row[9])
    return table


def f1_table(comparison: Comparison) -> Table | Text:
    rows = f1_rows(comparison)
    if not rows:
        return Text("no report.json in these runs: `cockpit eval RUN` scores a run", style="italic")
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("tenant", no_wrap=True, overflow="ellipsis", max_width=18)
    for i, s in enumerate(comparison.summaries):
        table.add_column(Text(s.tag, style=f"bold {run_color(i)}"), justify="right")
    for row in rows:
        table.add_row(*row, style="bold" if row[0] == "mean" else None)
    return table


class CompareScreen(Screen[None]):
    """Runs overlaid; everything it shows comes from one Comparison. Narrower than 110 columns, the
    per-tenant F1 panel gives way (the table keeps the mean)."""

    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]] | None] = [(0, "-narrow"), (110, "-wide")]

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("x", "switch_axis", "Step/time"),
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

    def show(self, comparison: Comparison | None, error: str | None = None) -> None:
        """Show what the worker read (or why it could not)."""
        self.comparison, self.error = comparison, error
        self.query_one("#compare-title", Static).update(title_text(comparison, self.axis, error))
        if comparison is None:
            return
        self.query_one("#compare-table", Static).update(summary_table(comparison))
        self.query_one("#compare-f1", Static).update(f1_table(comparison))
        self.query_one("#compare-table").border_subtitle = TABLE_NOTE
        self.call_after_refresh(self._draw)

    def on_resize(self) -> None:
        self.call_after_refresh(self._draw)

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
        self.query_one("#compare-title", Static).update(title_text(self.comparison, self.axis, self.error))
        self._draw()
