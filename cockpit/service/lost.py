"""How a run ended when its supervisor did not live to say: from the trainer's own last words.

`cockpit.service.lifecycle.reconcile` asks this once the supervisor and the training processes are both gone.
A trainer that stopped cleanly (a stop asked for after the supervisor was lost: `cockpit stop` writes
the request the trainer polls) or finished has said so in its `trainer_end` event, with the checkpoint
it saved: that run stopped or finished, it did not fail. Otherwise nothing is known of its end.
"""

from __future__ import annotations

from pathlib import Path

from cockpit.record import RunPaths, RunReader
from cockpit.record.view import RunView
from cockpit.service.diagnosis import EndFacts, diagnose

LOST = "supervisor lost: the supervisor and the training processes are gone"
NOT_EVALUATED = "the supervisor was lost before the evaluation"


def lost_verdict(run_dir: Path, checkpoint: str | None) -> tuple[str, str]:
    """(status, diagnosis) of a run whose supervisor and training processes are gone; `checkpoint` is
    its newest complete checkpoint on disk (`lifecycle.last_checkpoint`)."""
    view = RunView()
    view.apply(RunReader(run_dir, strict=False).poll())  # leniently: a lost run's last line may be torn
    outcome, step = view.trainer_outcome, view.step
    saved = bool(view.checkpoints) and view.checkpoints[-1] == step and checkpoint is not None
    if outcome == "stopped" and saved:
        stop = RunPaths(Path(run_dir)).stop_request.exists()
        facts = EndFacts(None, "", stop_requested=True, stop_reason="user" if stop else "a stop request",
                         trainer_outcome="stopped", last_step=step or None)  # fmt: skip
        status, diagnosis = diagnose(facts)
        return status, f"{diagnosis}; {NOT_EVALUATED}"
    if outcome == "finished":
        return "finished", f"finished at step {step}; {NOT_EVALUATED}: `cockpit eval {Path(run_dir).name}`"
    return "failed", LOST
