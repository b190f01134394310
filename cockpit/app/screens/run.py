"""The run screen: header, four charts, the audit and the tail of the output log."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.containers import Grid, Horizontal
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer

from cockpit.app.charts import CHARTS
from cockpit.app.model import Snapshot
from cockpit.app.widgets.chart import BrailleChart
from cockpit.app.widgets.header import RunHeader
from cockpit.app.widgets.panels import AuditPanel, LogPane

TITLES = {"loss": "loss", "throughput": "tokens/s", "gpu": "GPU memory", "host": "host RAM"}


class RunScreen(Screen[None]):
    """One run, live or replayed: the same screen, fed the same snapshots."""

    VERTICAL_BREAKPOINTS: ClassVar[list[tuple[int, str]] | None] = [(0, "-short"), (32, "-tall")]
    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]] | None] = [(0, "-narrow"), (110, "-wide")]

    def compose(self) -> ComposeResult:
        yield RunHeader(id="header")
        with Grid(id="charts"):
            for name in CHARTS:
                yield BrailleChart(TITLES[name], id=f"chart-{name}", classes="chart")
        with Horizontal(id="bottom"):
            yield AuditPanel(id="audit-box")
            yield LogPane(id="log")
        yield Footer()

    ready = False  # composed and mounted: snapshots can be shown

    def on_mount(self) -> None:
        self.query_one("#audit-box").border_title = "audit: applied against asked"
        self.call_after_refresh(self._ready)  # after the first refresh every child is in place

    def _ready(self) -> None:
        self.ready = True
        snapshot = getattr(self.app, "last_snapshot", None)
        if snapshot is not None:
            self.show(snapshot)

    def on_screen_resume(self) -> None:
        """Back from the report or the prediction: the newest snapshot, which was not drawn meanwhile."""
        if self.ready:
            self._ready()

    def on_unmount(self) -> None:
        self.ready = False

    def dot_columns(self) -> dict[str, int]:
        """How many buckets each chart can show (read by the follow worker)."""
        try:
            return {name: self.query_one(f"#chart-{name}", BrailleChart).dot_columns for name in CHARTS}
        except NoMatches:  # the app is closing: its children are going
            return {}

    def show(self, snapshot: Snapshot) -> None:
        try:
            self.query_one(RunHeader).show(snapshot.header)
            for name, chart in snapshot.charts.items():
                self.query_one(f"#chart-{name}", BrailleChart).set_data(chart)
            self.query_one(AuditPanel).show(snapshot.audit)
            self.query_one(LogPane).show(snapshot.log_lines)
        except NoMatches:  # the app is closing: a last snapshot can arrive as the children go
            return
