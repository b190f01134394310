"""What each phase of a run is doing, in the words every viewer says it: the app's header and the
headless lines alike (where rank 0 said nothing of its phase itself, `RunView.phase_message`)."""

from __future__ import annotations

PHASE_WORDS = {
    "starting": "starting the trainer (launcher, imports)",
    "setup": "setting up",
    "load": "loading the model",
    "build": "building DeepSpeed ops",
    "train": "training",
    "save": "saving the adapter",
    "done": "training over",
    "stopped": "the trainer stopped",
    "eval": "evaluating on the held-out split",
    "report": "writing the evaluation report",
}
