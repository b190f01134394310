"""What rehearsals measured of a plan's rows: the plan's figures replaced where a record measured them.

`cockpit plan --rehearsal RUN` matches each rehearsal to the plan row with its settings (the
configuration as written, or an option) and hands its whole-run figures here
(`cockpit.rehearse.calibrate` makes them: the plan knows nothing of records). The plan's table then
says, row by row, which figures are measured and which modelled, and the fastest that fits is chosen
from measured rows only; a faster modelled row is named as a guess to rehearse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CONFIGURED = "as configured"
GIB = 1024**3


@dataclass(frozen=True)
class Measured:
    """One plan row as a rehearsal measured it and scaled it to the plan's hardware (a GPU's peak, the
    host's whole RAM, an optimizer step, the whole run's tokens/s)."""

    source: str  # the record, e.g. "rehearsal 20261202-0503-story"
    step_s: float
    tokens_per_s: float
    gpu_train_gib: float | None = None
    gpu_load_gib: float | None = None
    host_gib: float | None = None
    step_measured: bool = True  # False: the depths only bound the step (see the rehearsal's notes)
    gpu_measured: bool = True  # False: the GPU peak past its knee is the plan's term
    step_range: tuple[float, float] | None = None
    eval_s: float | None = None  # the evaluation after training, where the rehearsal timed it on its slices
    eval_range: tuple[float, float] | None = None
    validation_s: float | None = None  # the validation passes, where the rehearsal timed their forwards

    def fits(self, gpu_limit: float, host_limit: float) -> bool:
        """Whether the measured peaks fit the plan's usable GPU memory and host RAM (bytes)."""
        gpu = max(v or 0.0 for v in (self.gpu_train_gib, self.gpu_load_gib)) * GIB
        host = (self.host_gib or 0.0) * GIB
        return (not gpu_limit or gpu <= gpu_limit) and (not host_limit or host <= host_limit)


def limits(estimate: Any) -> tuple[float, float]:
    """The usable GPU memory and host RAM (bytes) of an estimate's checks."""
    gpu = next((c.limit for c in estimate.checks if c.resource == "GPU memory"), 0)
    host = next((c.limit for c in estimate.checks if c.resource == "host RAM"), 0)
    return gpu, host


def fastest_measured(plan: Any, measured: dict[str, Measured]) -> tuple[str, Measured] | None:
    """The measured row that fits and trains fastest, by label (`CONFIGURED` for the configuration)."""
    gpu, host = limits(plan.configured)
    fitting = [(label, m) for label, m in measured.items() if m.fits(gpu, host)]
    return max(fitting, key=lambda lm: lm[1].tokens_per_s, default=None)


def to_dict(measured: dict[str, Measured]) -> dict[str, dict[str, Any]]:
    return {label: dict(m.__dict__) for label, m in measured.items()}
