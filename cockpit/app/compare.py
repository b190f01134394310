"""`cockpit compare`'s app: one worker reads every run, the compare screen shows them.

The worker (`@work(thread=True)`) reads the records through `cockpit.compare` and posts one message; it
never touches a widget. While a run is still going (its record says running), the records are read again
every few seconds (less often when a read takes long), so its curves and figures follow it.
"""

from __future__ import annotations

import time
from pathlib import Path

from textual import work
from textual.app import App

from cockpit.app.messages import ComparisonLoaded
from cockpit.app.screens.compare import CompareScreen, going
from cockpit.compare import Comparison, compare_runs
from cockpit.record import RecordError

FOLLOW_S = 5.0  # between reads of the records while a run is going (at least 4 reads' time)


class CompareApp(App[None]):
    """Several runs in one screen."""

    CSS_PATH = "cockpit.tcss"
    TITLE = "cockpit compare"
    ENABLE_COMMAND_PALETTE = False  # its footer entry took the room of the compare screen's own keys

    def __init__(self, run_dirs: list[Path], *, axis: str = "step", follow_s: float = FOLLOW_S) -> None:
        super().__init__()
        self.run_dirs = [Path(d) for d in run_dirs]
        self.follow_s = follow_s
        self.screen_ = CompareScreen(axis)
        self.comparison: Comparison | None = None
        self.reads = 0  # the records read so far (once, or again while a run goes on)
        self._read_s = 0.0

    def on_mount(self) -> None:
        self.push_screen(self.screen_)
        self.load()

    @work(thread=True, exclusive=True, group="compare", name="read-runs")
    def load(self) -> None:
        """Read every run; never touches a widget."""
        t0 = time.perf_counter()
        try:
            comparison = compare_runs(self.run_dirs)
        except (OSError, RecordError) as exc:
            self.post_message(ComparisonLoaded(None, f"could not read the runs: {exc}"))
            return
        self._read_s = time.perf_counter() - t0
        self.post_message(ComparisonLoaded(comparison))

    def on_comparison_loaded(self, message: ComparisonLoaded) -> None:
        if message.comparison is None and self.comparison is not None:
            self.notify(message.error or "could not read the runs", severity="warning")
            return  # a record caught mid-write: keep what is shown, read again later
        self.reads += 1
        self.comparison = message.comparison
        self.screen_.show(message.comparison, message.error)
        if message.comparison is not None and going(message.comparison):
            self.set_timer(max(self.follow_s, 4 * self._read_s), self.load)


def make_compare_app(run_dirs: list[Path], *, axis: str = "step") -> CompareApp:
    """The app as the CLI builds it (tests and screenshots build it the same way)."""
    return CompareApp(run_dirs, axis=axis)


def run_compare_app(run_dirs: list[Path], *, axis: str = "step") -> None:
    make_compare_app(run_dirs, axis=axis).run()
