"""`cockpit compare`'s app: one worker reads every run, the compare screen shows them.

The worker (`@work(thread=True)`) reads the records through `cockpit.compare` and posts one message; it
never touches a widget. The records are read once: compare looks at ended runs (a running one is shown
as it stood when the app opened).
"""

from __future__ import annotations

from pathlib import Path

from textual import work
from textual.app import App

from cockpit.app.messages import ComparisonLoaded
from cockpit.app.screens.compare import CompareScreen
from cockpit.compare import Comparison, compare_runs
from cockpit.record import RecordError


class CompareApp(App[None]):
    """Several runs in one screen."""

    CSS_PATH = "cockpit.tcss"
    TITLE = "cockpit compare"

    def __init__(self, run_dirs: list[Path], *, axis: str = "step") -> None:
        super().__init__()
        self.run_dirs = [Path(d) for d in run_dirs]
        self.screen_ = CompareScreen(axis)
        self.comparison: Comparison | None = None

    def on_mount(self) -> None:
        self.push_screen(self.screen_)
        self.load()

    @work(thread=True, exclusive=True, group="compare", name="read-runs")
    def load(self) -> None:
        """Read every run; never touches a widget."""
        try:
            comparison = compare_runs(self.run_dirs)
        except (OSError, RecordError) as exc:
            self.post_message(ComparisonLoaded(None, f"could not read the runs: {exc}"))
            return
        self.post_message(ComparisonLoaded(comparison))

    def on_comparison_loaded(self, message: ComparisonLoaded) -> None:
        self.comparison = message.comparison
        self.screen_.show(message.comparison, message.error)


def make_compare_app(run_dirs: list[Path], *, axis: str = "step") -> CompareApp:
    """The app as the CLI builds it (tests and screenshots build it the same way)."""
    return CompareApp(run_dirs, axis=axis)


def run_compare_app(run_dirs: list[Path], *, axis: str = "step") -> None:
    make_compare_app(run_dirs, axis=axis).run()
