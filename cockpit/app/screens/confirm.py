"""Asks before stopping a run: a stop ends a 26-hour job (with a checkpoint) and cannot be undone."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid
from textual.screen import ModalScreen
from textual.widgets import Button, Label


class ConfirmStop(ModalScreen[bool]):
    """Yes: the trainer saves a checkpoint at the next step and exits. No: nothing happens."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Stop the run"),
        Binding("n,escape", "answer(False)", "Keep it running"),
    ]

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id

    def compose(self) -> ComposeResult:
        with Grid(id="confirm"):
            yield Label(
                f"Stop run [b]{self.run_id}[/b]?\n\nThe trainer saves a checkpoint after the current step "
                "and exits; `cockpit resume` continues from it.",
                id="question",
            )
            yield Button("Stop (y)", variant="error", id="yes")
            yield Button("Keep running (n)", variant="primary", id="no")

    def on_screen_resume(self) -> None:  # each time it is shown (it is built once and kept)
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)
