"""What every importer returns: the steps, validation losses and facts a foreign log holds, nothing more.

An importer fills an `Imported` from its format; `cockpit.importers.write` turns it into a run record.
A field the log does not hold stays out of the steps (and is listed in `absent`): nothing is invented.
Lines an importer could not use are counted in `skipped`, each reason once with its count and first line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cockpit.limits import foreign_file_problem
from cockpit.record.schema import (
    CUDA_PEAK_ALLOC_MIB,
    EPOCH,
    GRAD_NORM,
    LEARNING_RATE,
    LOSS,
    STEP_FIGURES,
    STEP_TIME_S,
    TOKENS,
    TOKENS_PER_S,
)

# Step fields a record can hold (the step event's figures and its GPU peak, `record.schema`); `absent`
# names those an import lacks.
STEP_FIELDS = (*STEP_FIGURES, CUDA_PEAK_ALLOC_MIB)
CLOCKS = ("wall", "elapsed", "step")  # Unix time; seconds since training began; none (one second a step)
SNIFF_BYTES = 8192
MIB_PER_GB = 1024.0  # DeepSpeed and LLaMA-Factory divide bytes by 1024**3 and call it GB


class ForeignLogError(ValueError):
    """A file or folder that cannot be imported; the message is one line naming the file (and line, field)."""


@dataclass
class Skipped:
    """Lines left out for one reason: how many, and where the first was."""

    reason: str
    count: int = 0
    first_line: int | None = None

    def __str__(self) -> str:
        where = f" (first at line {self.first_line})" if self.first_line is not None else ""
        return f"{self.count} {self.reason}{where}"


@dataclass
class Imported:
    """A foreign run as read: steps keyed by step number, validation losses, and what could not be read."""

    source: Path
    format: str  # "hf-trainer-state", "llamafactory", "console"
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)  # step -> fields (and "t" when known)
    evals: list[dict[str, Any]] = field(default_factory=list)  # {"step", "loss", "t"?}
    clock: str = "step"
    max_steps: int | None = None
    finished: bool = False
    cut_off: bool = False  # the log's last line was cut off mid-write: the run was still going
    load_memory: dict[str, float] | None = None  # memory before the first step (DeepSpeed's report)
    notes: list[str] = field(default_factory=list)  # what a reader should know (how steps were numbered)
    skipped: dict[str, Skipped] = field(default_factory=dict)

    def skip(self, reason: str, line: int | None = None) -> None:
        """Count one line left out for `reason`."""
        entry = self.skipped.setdefault(reason, Skipped(reason))
        entry.count += 1
        if entry.first_line is None:
            entry.first_line = line

    def step(self, number: int) -> dict[str, Any]:
        """The fields of step `number` (created empty)."""
        return self.steps.setdefault(number, {})

    @property
    def absent(self) -> list[str]:
        """Step fields no step has, and `wall time` when the clock is the step count."""
        present = {k for fields in self.steps.values() for k, v in fields.items() if v is not None}
        missing = [f for f in STEP_FIELDS if f not in present]
        if self.clock == "step":
            missing.append("wall time")
        return missing

    def skipped_lines(self) -> list[str]:
        return [str(s) for s in self.skipped.values()]


def figure(value: Any) -> float | None:
    """A float from a log value (transformers 5 prints them as strings), NaN and infinity kept: a
    diverged loss is what the log says, not a missing one. None for anything that is not a number."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def number(value: Any) -> float | None:
    """A finite float from a log value (a step, a time, a count), else None."""
    f = figure(value)
    return f if f is not None and math.isfinite(f) else None


# The figures that diverge: NaN or infinity in them is kept (`figure`), in every other field left out.
DIVERGING = (LOSS, GRAD_NORM)


def diverged_note(imported: Imported) -> str | None:
    """`the loss is nan or inf at N steps, from step S: the run diverged`, when it is."""
    bad = sorted(s for s, f in imported.steps.items() if not math.isfinite(f.get(LOSS, 0.0)))
    if not bad:
        return None
    return f"the loss is nan or inf at {len(bad)} step(s), from step {bad[0]}: the run diverged"


def hf_log_fields(entry: dict[str, Any], **extra: str) -> dict[str, Any]:
    """The step figures of one HF Trainer log dict (what it prints and what `trainer_state.json`'s
    `log_history` keeps), under the record's names; `extra` maps further record names to log keys.
    Absent or non-finite values are left out."""
    keys = {
        LOSS: "loss",
        LEARNING_RATE: "learning_rate",
        GRAD_NORM: "grad_norm",
        EPOCH: "epoch",
        "tokens_seen": "num_input_tokens_seen",
        **extra,
    }
    fields = {name: (figure if name in DIVERGING else number)(entry.get(key)) for name, key in keys.items()}
    return {k: v for k, v in fields.items() if v is not None}


def read_text(path: Path) -> str:
    """A log file's text; `ForeignLogError` for an empty, unreadable or binary file, for what is not a
    regular file (a device reads without end) and for one over `$COCKPIT_MAX_LOG_MIB` (`cockpit.limits`)."""
    try:
        problem = foreign_file_problem(path)
        data = b"" if problem else path.read_bytes()
    except OSError as exc:
        raise ForeignLogError(f"{path}: cannot read ({exc.strerror})") from None
    if problem:
        raise ForeignLogError(f"{path}: {problem}")
    if not data.strip():
        raise ForeignLogError(f"{path}: empty file, nothing to import")
    head = data[:SNIFF_BYTES]
    if b"\x00" in head:
        raise ForeignLogError(f"{path}: a binary file, not a training log")
    text = data.decode("utf-8", errors="replace")
    bad = text[:SNIFF_BYTES].count("\ufffd")
    if bad > max(8, len(head) // 100):
        raise ForeignLogError(f"{path}: not text (undecodable bytes), not a training log")
    return text


def rates_from_tokens(imported: Imported) -> None:
    """Tokens/s (and seconds a step) between consecutive steps whose clock and token count are both known.

    Uses the `tokens_seen` each step carries (a running total) and `t`: real figures, averaged over the
    interval between two log lines. The running total is then dropped (the record counts a step's own).
    """
    last: tuple[int, float, float | None] | None = None
    for step in sorted(imported.steps):
        fields = imported.steps[step]
        seen, t = fields.pop("tokens_seen", None), fields.get("t")
        if t is None:
            continue
        if last is not None:
            prev_step, prev_t, prev_seen = last
            dt = t - prev_t
            if dt > 0 and imported.clock != "step":
                fields.setdefault(STEP_TIME_S, round(dt / (step - prev_step), 4))
                if seen is not None and prev_seen is not None:
                    fields[TOKENS] = int(seen - prev_seen)
                    fields.setdefault(TOKENS_PER_S, round((seen - prev_seen) / dt, 2))
        last = (step, t, seen)
