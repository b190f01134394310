"""The DeepSpeed ops a run uses, loaded before anything else starts, each compile said first."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from cockpit.profiles import Profile


def build_ops(profile: Profile, phase: Callable[..., None]) -> list[str]:
    """Load every DeepSpeed op `profile`'s run uses (`dsops.ensure_ops`), so that nothing compiles later
    inside another phase: each compile, a wait for another process's build or a stale lock removed is its
    own `build` phase, said before it happens. Returns the ops compiled. DeepSpeed then reuses the loaded
    ops."""
    from cockpit.ops import dsops

    def announce(state: dsops.OpState, words: str) -> None:
        phase("build", ops=[state.name], message=words, cache=state.where)

    def leave(signum: int, _frame: Any) -> None:  # a stop while building: unwind, so torch drops its lock
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, leave)
    except ValueError:  # not the main thread: DeepSpeed's own handling
        previous = None
    try:
        return [state.name for state in dsops.ensure_ops(profile, announce)]
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
