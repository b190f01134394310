"""The run screen's keys: what each does, when it acts (the footer shows it only then), and why not.

`KEYS` are the footer's entries; a key pressed when it cannot act answers through its hidden twin
(`why_not`) with `reason`. Whether a key acts depends only on a `KeyState`, what the app last showed.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding, BindingType

from cockpit.record.format import TERMINAL_STATUSES
from cockpit.record.playback import SPEEDS

# Each key: (keys, action, footer label, key shown).
KEYS: tuple[tuple[str, str, str, str | None], ...] = (
    ("s", "stop", "Stop", None),
    ("d", "detach", "Detach", None),
    ("q", "quit", "Quit", None),
    ("l", "toggle_log", "Log", None),
    ("r", "report", "Report", None),
    ("p", "prediction", "Prediction", None),
    ("g", "gpu_axis", "GPU axis", None),
    ("v", "toggle_val_tenants", "Val/tenant", None),
    ("space", "pause", "Pause", None),
    ("space", "play", "Play", None),
    ("plus,equals_sign,right_square_bracket", "faster", "Faster", "+"),
    ("minus,left_square_bracket", "slower", "Slower", "-"),
    ("e,end", "jump_end", "End", None),
)
EXPLAINED = (
    "stop",
    "detach",
    "toggle_log",
    "report",
    "prediction",
    "gpu_axis",
    "toggle_val_tenants",
    "faster",
    "slower",
    "jump_end",
)


def bindings() -> list[BindingType]:
    """The footer's bindings, then a hidden `why_not` twin for each key that can be refused."""
    shown = [Binding(keys, action, label, key_display=display) for keys, action, label, display in KEYS]
    explain = [
        Binding(keys, f"why_not('{action}')", show=False)
        for keys, action, _, _ in KEYS
        if action in EXPLAINED
    ]
    explain.append(Binding("space", "why_not('pause')", show=False))
    return [*shown, *explain]


@dataclass(frozen=True)
class KeyState:
    """What the keys depend on, as the app last showed it."""

    live: bool
    status: str  # the run's status as of the clock ("running" before the first snapshot)
    on_run: bool  # the run screen is on top
    following: bool
    paused: bool
    speed: float
    stop_requested: bool  # in the record, or sent from this app
    has_report: bool
    report_state: str | None  # None, "reading", "read", "failed"
    has_prediction: bool
    has_gpus: bool
    has_val_tenants: bool  # the record has each tenant's validation loss

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def active(self) -> bool:
        """A live view of a run that is still going: it can be stopped or detached from."""
        return self.live and not self.ended


def can(action: str, k: KeyState) -> bool:
    """Whether the key for `action` acts now."""
    match action:
        case "stop":
            return k.active and k.on_run and not k.stop_requested
        case "detach":  # an ended run has nothing to go on without the viewer: q quits
            return k.active
        case "toggle_log":
            return k.on_run
        case "report":
            return k.has_report and k.on_run
        case "prediction":
            return k.has_prediction and k.on_run
        case "gpu_axis":
            return k.on_run and k.has_gpus
        case "toggle_val_tenants":
            return k.on_run and k.has_val_tenants
        case "pause":  # a live view of an ended run has nothing moving to pause
            return k.on_run and not k.paused and not (k.live and k.following and k.ended)
        case "play":
            return k.on_run and k.paused
        case "faster":
            return k.on_run and not k.live and k.speed < SPEEDS[-1]
        case "slower":
            return k.on_run and not k.live and k.speed > SPEEDS[0]
        case "jump_end":
            return k.on_run and not k.following
    return True


def reason(action: str, k: KeyState) -> str:
    """Why the key for `action` does nothing now (said when it is pressed)."""
    if not k.on_run:
        return "back to the run screen first (escape)"
    match action:
        case "stop" if not k.live:
            return "a replay cannot stop a run: `cockpit stop RUN` does"
        case "stop" if k.ended:
            return f"the run has {'ended' if k.status == 'stalled' else k.status}: there is nothing to stop"
        case "stop":
            return "a stop is already requested: a checkpoint, then exit (`cockpit stop` again kills)"
        case "detach" if not k.live:
            return "a replay is not attached to a run: q quits"
        case "detach":
            return "the run has ended: there is nothing to detach from, q quits"
        case "pause":
            return "the run has ended: nothing moves (cockpit replay RUN plays it back)"
        case "report":
            if k.report_state == "reading":
                return "the report is being read"
            if k.report_state == "failed":
                return "the run's report could not be read (`cockpit report RUN` rebuilds it)"
            return "no evaluation report yet: it comes after the evaluation"
        case "prediction":
            return "no rehearsal prediction in this record (`cockpit rehearse` makes one)"
        case "gpu_axis":
            return "no GPU telemetry in this record: the chart shows each rank's RSS on its own range"
        case "toggle_val_tenants":
            return "no validation loss per tenant yet: it comes with a validation (validation.eval_steps)"
        case "faster" | "slower" if k.live:
            return "a live view runs at the run's own pace: + and - set a replay's speed"
        case "faster":
            return f"already at the fastest, {SPEEDS[-1]:g}×"
        case "slower":
            return f"already at the slowest, {SPEEDS[0]:g}×"
        case "jump_end":
            return "already live" if k.live else "already at the end"
    return "not available here"
