"""The evaluation report: per-tenant metrics, the tuned model's deltas with their intervals, serving cost.

It gets the report as a `cockpit.report.Report` (read by the app's report worker) and reads nothing itself.
`r` or `escape` goes back to the run screen; `m` cycles the metric shown for each system; `c` goes to
the serving cost and back. In a short terminal (80x24) the table and the delta bars fit whole, the cost's
title under them.
"""

from __future__ import annotations

from typing import ClassVar

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from cockpit.app.widgets.report import (
    DeltaChart,
    has_metric_deltas,
    metric_table,
    production_text,
    serving_text,
)
from cockpit.report import METRIC_NAMES, METRICS, REPORT_JSON, Report, examples_text


def title_text(report: Report, run_id: str) -> Text:
    """Two lines, like the run header: which run and model; what was evaluated (how the intervals were
    found is said under the delta bars, where they are drawn)."""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(" cockpit ", "bold reverse")
    text.append(f" {run_id} ", "bold")
    if report.model:
        text.append("· model ")
        text.append(report.model, "bold")
    text.append("\n")
    text.append(" REPORT ", "bold reverse cyan")
    text.append(f" {len(report.tenants)} tenants · {examples_text(report)} · ")
    text.append(" · ".join(report.systems), "bold")
    if report.source != REPORT_JSON:
        text.append(f" · {report.source}", "italic yellow")
    return text


def interval_note(report: Report) -> str:
    """The delta bars' subtitle: what the bar and the whisker are, and how the interval was found."""
    how = f", paired bootstrap ×{report.bootstrap_samples:,}" if report.bootstrap_samples else ""
    return f"bar: Δ · whisker: 95% CI{how}"


class ReportScreen(Screen[None]):
    """The report of one run, over its run screen (which goes on following the record underneath)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r,escape", "back", "Back", key_display="r"),
        Binding("m", "metric", "Metric"),
        Binding("c", "cost", "Cost"),
    ]

    def __init__(self, report: Report, run_id: str) -> None:
        super().__init__()
        self.report = report
        self.run_id = run_id
        self.metric = "macro_f1"

    def compose(self) -> ComposeResult:
        yield Static(title_text(self.report, self.run_id), id="report-title")
        with VerticalScroll(id="report-body"):  # the table and the bars first: at 80x24 they fit
            yield Static(id="report-table", classes="report-panel")
            yield DeltaChart(self.report, id="report-deltas", classes="report-panel")
            yield Static(id="report-serving", classes="report-panel")
        yield Footer()

    def _show_serving(self) -> None:
        served = serving_text(self.report.serving, self.size.width - 4)
        production = production_text(self.report)
        self.query_one("#report-serving", Static).update(Group(served, production) if production else served)

    def on_mount(self) -> None:
        self._show_metric()
        self.query_one("#report-deltas", DeltaChart).border_subtitle = interval_note(self.report)
        self.query_one("#report-serving", Static).border_title = "serving cost (c)"
        self._show_serving()

    @property
    def compact(self) -> bool:
        """A short terminal: the table's mean and the bars' scale without their spacing lines."""
        return self.size.height < 32

    def on_resize(self) -> None:
        self._show_serving()
        self._show_metric()

    def action_cost(self) -> None:
        """To the serving cost, or back to the top when it is in view."""
        body = self.query_one("#report-body", VerticalScroll)
        serving = self.query_one("#report-serving")
        if body.scroll_y > 0 or serving.region.bottom <= body.region.bottom:
            body.scroll_home(animate=False)
        else:
            body.scroll_to_widget(serving, animate=False, top=True)

    def _show_metric(self) -> None:
        """The table, the deltas and the bars, all of `self.metric`."""
        name = METRIC_NAMES[self.metric]
        table = self.query_one("#report-table", Static)
        table.update(metric_table(self.report, self.metric, self.compact))
        table.border_title = f"{name} per tenant, points (m: next metric)"
        table.border_subtitle = "Δ green: 95% CI above 0 · red: below · yellow: includes 0"
        if not has_metric_deltas(self.report, self.metric) and self.report.reference:
            table.border_subtitle = f"no {name} deltas in this report: `cockpit report RUN` rebuilds it"
        chart = self.query_one("#report-deltas", DeltaChart)
        chart.set_compact(self.compact)
        chart.show(self.metric)
        reference, tuned = self.report.reference, self.report.tuned or "fine-tuned"
        chart.border_title = f"{tuned} − {reference}: {name} per tenant (points)" if reference else "deltas"

    def action_metric(self) -> None:
        self.metric = METRICS[(METRICS.index(self.metric) + 1) % len(METRICS)]
        self._show_metric()

    def action_back(self) -> None:
        self.dismiss()
