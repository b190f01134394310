"""LLaMA-Factory's `trainer_log.jsonl`: one JSON object per logging step, written by its `LogCallback`.

A training line: `current_steps`, `total_steps`, `loss`, `lr`, `epoch`, `percentage`, `elapsed_time`
and `remaining_time` (`H:MM:SS`, whole seconds, or `N days, H:MM:SS`), and when tokens are counted
`throughput` (tokens since the start over the seconds since the start) and `total_tokens`; with
`RECORD_VRAM=1`, `vram_allocated` and `vram_reserved` (peak GiB). An evaluation line has `eval_loss`
instead of `loss`; a progress line (prediction only, or the end) has neither. The clock is the elapsed
time: exact to the rounding of `throughput` where tokens are counted (`total_tokens / throughput`), else
whole seconds. A resumed run appends its lines to the same file, its clock back at zero (`Resumes`). A
NaN or infinite loss (Python's `json` writes `NaN`, `Infinity`) is kept: the run diverged there.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from cockpit.importers.model import (
    MIB_PER_GB,
    ForeignLogError,
    Imported,
    figure,
    number,
    rates_from_tokens,
    read_text,
)

LOG_NAME = "trainer_log.jsonl"
REQUIRED = "current_steps"
_ELAPSED = re.compile(r"^(?:(\d+) days?, )?(\d+):(\d\d):(\d\d)(?:\.\d+)?$")


def elapsed_seconds(text: Any) -> float | None:
    """`timedelta`'s text (`0:01:23`, `1 day, 2:03:04`) in seconds, else None."""
    match = _ELAPSED.match(str(text).strip()) if text is not None else None
    if not match:
        return None
    days, h, m, s = (int(g) if g else 0 for g in match.groups())
    return float(((days * 24 + h) * 60 + m) * 60 + s)


def is_llamafactory_line(row: Any) -> bool:
    return isinstance(row, dict) and REQUIRED in row


def read_log(path: Path) -> Imported:
    """Read a trainer_log.jsonl; `ForeignLogError` when its first object is not a LLaMA-Factory line."""
    imported = Imported(source=path, format="llamafactory")
    lines = read_text(path).split("\n")
    first = True
    last_line = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    resumes = Resumes()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if first:
                raise ForeignLogError(f"{path}:{i + 1}: not a JSON line, not a trainer_log.jsonl") from None
            if i == last_line:
                imported.cut_off = True
            imported.skip("cut-off line" if i == last_line else "lines that are not JSON", i + 1)
            continue
        if not is_llamafactory_line(row):
            if first:
                raise ForeignLogError(
                    f"{path}:{i + 1}: no `{REQUIRED}` field: not a LLaMA-Factory trainer_log.jsonl line"
                )
            imported.skip(f"lines without `{REQUIRED}`", i + 1)
            continue
        first = False
        resumes.check(imported, row, i + 1)
        _fold(imported, row, i + 1)
    if first:
        raise ForeignLogError(f"{path}: no lines to import")
    timed = all("t" in f for f in imported.steps.values())
    imported.clock = "elapsed" if timed and not resumes.lines else "step"
    if resumes.lines:
        imported.notes.append(resumes.note())
    if imported.clock == "step":
        for fields in imported.steps.values():
            fields.pop("t", None)
    rates_from_tokens(imported)
    return imported


class Resumes:
    """Where a resumed run's lines begin: LLaMA-Factory appends them to the same file, its clock back at
    zero and its steps from the checkpoint's. The resumed run's steps replace the first run's from there,
    and with two clocks in one file the record's is the step count (as `hf_state` does with a restarted
    `train_runtime`)."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, int]] = []  # (line, step) where each resumed run begins
        self._last: tuple[int, float | None] | None = None

    def check(self, imported: Imported, row: dict[str, Any], line: int) -> None:
        """Note a line that goes back in steps or time as a resume, and drop what it replaces."""
        step = number(row.get("current_steps"))
        if step is None:
            return
        t = _clock(row)
        if self._last is not None:
            last_step, last_t = self._last
            if step < last_step or (t is not None and last_t is not None and t < last_t):
                self.lines.append((line, int(step)))
                for later in [s for s in imported.steps if s >= step]:
                    del imported.steps[later]
                imported.evals[:] = [e for e in imported.evals if e["step"] < step]
        self._last = (int(step), t)

    def note(self) -> str:
        where = ", ".join(f"line {line} (step {step})" for line, step in self.lines)
        return (
            f"a resumed run was appended at {where}: its clock restarts there, so the clock is the step "
            "count; its steps replace the first run's from there"
        )


def _fold(imported: Imported, row: dict[str, Any], line: int) -> None:
    step = number(row.get("current_steps"))
    if step is None:
        imported.skip("lines with no usable `current_steps`", line)
        return
    step_n = int(step)
    total = number(row.get("total_steps"))
    if total:
        imported.max_steps = int(total)
        imported.finished = imported.finished or step_n >= int(total)
    t = _clock(row)
    if figure(row.get("eval_loss")) is not None:
        event: dict[str, Any] = {"step": step_n, "loss": figure(row["eval_loss"])}
        if t is not None:
            event["t"] = t
        imported.evals.append(event)
    if figure(row.get("loss")) is None:
        return  # an evaluation or a progress line: no training step (a NaN loss is a step: diverged)
    fields = imported.step(step_n)
    fields.update(
        {
            k: v
            for k, v in {
                "loss": figure(row.get("loss")),
                "learning_rate": number(row.get("lr")),
                "epoch": number(row.get("epoch")),
                "tokens_seen": number(row.get("total_tokens")),
                "cuda_peak_alloc_mib": _mib(row.get("vram_allocated")),
                "cuda_peak_reserved_mib": _mib(row.get("vram_reserved")),
                "t": t,
            }.items()
            if v is not None
        }
    )


def _clock(row: dict[str, Any]) -> float | None:
    """Seconds since training began: from tokens and throughput when both are there, else elapsed_time."""
    tokens, rate = number(row.get("total_tokens")), number(row.get("throughput"))
    if tokens is not None and rate:
        return round(tokens / rate, 3)
    return elapsed_seconds(row.get("elapsed_time"))


def _mib(gib: Any) -> float | None:
    value = number(gib)
    return None if value is None else round(value * MIB_PER_GB, 1)


def read_output_dir(folder: Path) -> Imported:
    return read_log(folder / LOG_NAME)
