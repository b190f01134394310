"""How an attempt ended, and how its evaluation did: what the supervisor writes into `run.json`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended: the status, diagnosis and exit code for `run.json`, and more fields."""

    status: str
    diagnosis: str
    exit_code: int | None
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Evaluation:
    """How an evaluation stage ended: `run.json`'s `evaluation`, read back by `cockpit eval RUN`."""

    status: str  # finished, failed, stopped, skipped
    summary: str  # the diagnosis's part about the evaluation
    exit_code: int | None = None  # trainer.evaluation.evaluate's

    def outcome(self, fields: dict[str, Any]) -> Outcome:
        """The attempt's outcome when evaluating was all it did (an evaluation-only run)."""
        return Outcome(self.status, self.summary, 0 if self.status == "finished" else 1, fields)
