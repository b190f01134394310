"""Every message the app's workers post, in one place (attributes down, messages up)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.message import Message

from cockpit.app.model import Snapshot
from cockpit.compare import Comparison
from cockpit.report import Report


@dataclass
class SnapshotReady(Message):
    """The follow worker has a new state to show. A newer one replaces one not yet handled."""

    snapshot: Snapshot

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SnapshotReady)


@dataclass
class StopSent(Message):
    """The stop request was written (or could not be)."""

    ok: bool
    detail: str


@dataclass
class PredictionLoaded(Message):
    """The prediction worker read the rehearsal's rehearsal.json (None, with `error`, when it could not)."""

    data: dict[str, Any] | None
    error: str | None = None


@dataclass
class ReportLoaded(Message):
    """The report worker read the run's report (None, with `error`, when it could not)."""

    report: Report | None
    error: str | None = None


@dataclass
class ComparisonLoaded(Message):
    """The compare worker read every run (None, with `error`, when one could not be read)."""

    comparison: Comparison | None
    error: str | None = None
