"""A rehearsal's prediction: the depths it measured, the whole run predicted beside the plan, the assumptions.

It gets `rehearsal.json` as read by the app's worker and reads nothing itself; `p` or `escape` goes back.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from cockpit.rehearse.render import render


def title_text(data: dict[str, Any], run_id: str) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(" cockpit ", "bold reverse")
    text.append(f" {run_id} ", "bold")
    text.append("· rehearsal: the real architecture, sliced, random weights\n")
    text.append(" PREDICTION ", "bold reverse cyan")
    text.append(f" {data.get('summary', '')}")
    return text


class PredictionScreen(Screen[None]):
    """The rehearsal's prediction, over its run screen."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("p,escape", "back", "Back to the run", key_display="p"),
    ]

    def __init__(self, data: dict[str, Any], run_id: str) -> None:
        super().__init__()
        self.data = data
        self.run_id = run_id

    def compose(self) -> ComposeResult:
        yield Static(title_text(self.data, self.run_id), id="report-title")
        with VerticalScroll(id="report-body"):
            yield Static(render(self.data), classes="report-panel")
        yield Footer()

    def action_back(self) -> None:
        self.app.pop_screen()
