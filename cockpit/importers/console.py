"""The console output of an HF Trainer or DeepSpeed run: what a user kept with `> train.log 2>&1`.

What is read:
- HF Trainer's log dicts, one a line, as its progress or printer callback prints them:
  `{'loss': '1.055', 'grad_norm': '2.1', 'learning_rate': '7.5e-05', 'epoch': '0.01'}` (transformers 5
  prints floats as strings rounded to 4 significant digits; earlier versions print the floats), the
  evaluation's `{'eval_loss': ...}` and the final `{'train_runtime': ..., 'train_loss': ...}`. With
  `include_num_input_tokens_seen` each has `num_input_tokens_seen` and `train_runtime` (seconds since
  training began): the clock.
- The dicts carry no step. The tqdm bar redraws itself right after each dict (`12%|█▎ | 1/8 [...]`): its
  count is the step. Where the bar is missing or out of order (stdout buffered apart from stderr), the
  step is counted from the log lines at the interval the bars show, or else one a line, and this is said.
- DeepSpeed's lines: `[<time>] [INFO] [...] [Rank 0] step=10, skipped=0, lr=[...], ...`, its throughput
  timer's `... global_step=10, RunningAvgSamplesPerSec=..., CurrSamplesPerSec=..., MemAllocated=..GB,
  MaxMemAllocated=..GB`, and `see_memory_usage`'s `MA .. GB  Max_MA .. GB  CA .. GB  Max_CA .. GB`.

Anything else is noise (warnings, other bars) and is passed over; a dict cut off mid-line or otherwise
unreadable is skipped and counted.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from cockpit.importers.model import (
    MIB_PER_GB,
    ForeignLogError,
    Imported,
    figure,
    hf_log_fields,
    number,
    rates_from_tokens,
    read_text,
)

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_DICT = re.compile(r"\{'[A-Za-z_][\w/.-]*':.*")
_BAR = re.compile(r"^\s*\d+%\|[^|]*\|\s*(\d+)/(\d+) \[")
_DS_TIME = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \[[A-Z]+\] \[[^\]]*\] (.*)")
_DS_STEP = re.compile(r"(?:\[Rank (\d+)\] )?step=(\d+), skipped=(\d+), lr=\[([^\],]*)")
_DS_SPEED = re.compile(
    r"global_step=(\d+), RunningAvgSamplesPerSec=([\d.eE+-]+), CurrSamplesPerSec=([\d.eE+-]+), "
    r"MemAllocated=([\d.]+)GB, MaxMemAllocated=([\d.]+)GB"
)
_NONFINITE = re.compile(r"(:\s*)(-?(?:nan|inf))(?=\s*[,}])")  # `'loss': nan,` as Python prints a float
_DS_MEMORY = re.compile(r"MA ([\d.]+) GB\s+Max_MA ([\d.]+) GB\s+CA ([\d.]+) GB\s+Max_CA ([\d.]+) GB")


@dataclass
class _Piece:
    """One fragment of the log between line breaks or carriage returns."""

    line: int  # 1-based line of the file
    text: str
    last_of_file: bool = False


def _pieces(text: str) -> Iterator[_Piece]:
    lines = text.split("\n")
    cut = not text.endswith("\n")  # the last line has no newline: it may be cut off
    for i, line in enumerate(lines):
        parts = _ANSI.sub("", line).split("\r")
        for j, part in enumerate(parts):
            if part.strip():
                yield _Piece(i + 1, part, last_of_file=cut and i == len(lines) - 1 and j == len(parts) - 1)


def looks_like_console(text: str) -> bool:
    """Whether any HF log dict or DeepSpeed step line is in `text`."""
    return any(
        _DICT.search(p.text) or _DS_STEP.search(p.text) or _DS_SPEED.search(p.text) for p in _pieces(text)
    )


def parse_dict(text: str) -> dict[str, Any] | None:
    """A printed log dict, or None when it is not one (cut off, or followed by other output). A float
    printed as `nan` or `inf` (a diverged run, before transformers 5 printed strings) is read as its text,
    which `figure` reads as the number."""
    text = _NONFINITE.sub(r"\1'\2'", text)
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        end = text.rfind("}")  # noise after the closing brace (a bar written on the same line)
        if end < 0:
            return None
        try:
            value = ast.literal_eval(text[: end + 1])
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
    return value if isinstance(value, dict) and all(isinstance(k, str) for k in value) else None


@dataclass
class _Entry:
    """One training log dict, and the bar counts around it."""

    fields: dict[str, Any]
    line: int
    after: int | None = None  # the training bar's count drawn right after the dict
    before: int | None = None


def read_console(path: Path) -> Imported:
    """Read a console log; `ForeignLogError` when it holds no log dict and no DeepSpeed step line."""
    imported = Imported(source=path, format="console")
    text = read_text(path)
    entries: list[_Entry] = []
    bar_total: int | None = None
    last_bar: int | None = None
    ds_steps: dict[int, dict[str, Any]] = {}
    pending_memory: dict[str, float] | None = None
    for piece in _pieces(text):
        s = piece.text
        bar = _BAR.match(s)
        if bar:
            count, total = int(bar.group(1)), int(bar.group(2))
            if bar_total is None:
                bar_total = total  # the training bar is drawn first (HF's on_train_begin)
            if total == bar_total:
                last_bar = count
                if entries and entries[-1].after is None:
                    entries[-1].after = count
            continue
        found = _DICT.search(s)
        if found:
            d = parse_dict(found.group(0))
            if d is None:
                reason = "cut-off log dict at the end" if piece.last_of_file else "unreadable log dicts"
                imported.cut_off = imported.cut_off or piece.last_of_file
                imported.skip(reason, piece.line)
                continue
            if "train_loss" in d:
                imported.finished = True
            elif any(k.startswith("eval_") for k in d):
                loss = figure(d.get("eval_loss"))  # NaN or infinity kept: a diverged run
                if loss is not None:
                    imported.evals.append({"after": len(entries), "loss": loss})
            elif "loss" in d:
                if entries and entries[-1].after is None:
                    entries[-1].after = -1  # another dict came first: no bar was drawn for the last one
                entries.append(_Entry(d, piece.line, before=last_bar))
            continue
        ds = _DS_TIME.search(s)
        message, when = (ds.group(2), _ds_time(ds.group(1))) if ds else (s, None)
        step = _DS_STEP.search(message)
        if step and int(step.group(2)) == 0:
            continue  # the engine's report at its start (`step=0`): no optimizer step has run
        if step and (step.group(1) in (None, "0")):
            fields = ds_steps.setdefault(int(step.group(2)), {})
            lr = number(step.group(4))
            if lr is not None:
                fields["learning_rate"] = lr
            if when is not None:
                fields["t"] = when
            continue
        speed = _DS_SPEED.search(message)
        if speed and int(speed.group(1)) == 0:
            continue
        if speed:
            fields = ds_steps.setdefault(int(speed.group(1)), {})
            fields["samples_per_s"] = number(speed.group(3))
            fields["cuda_alloc_mib"] = float(speed.group(4)) * MIB_PER_GB
            fields["cuda_peak_alloc_mib"] = float(speed.group(5)) * MIB_PER_GB
            if when is not None:
                fields.setdefault("t", when)
            continue
        memory = _DS_MEMORY.search(message)
        if memory and not entries and not ds_steps:  # before training: the load phase's memory
            ma, max_ma, ca, max_ca = (float(g) * MIB_PER_GB for g in memory.groups())
            pending_memory = {
                "cuda_alloc_mib": ma,
                "cuda_peak_alloc_mib": max_ma,
                "cuda_reserved_mib": ca,
                "cuda_peak_reserved_mib": max_ca,
            }
    if not entries and not ds_steps:
        what = "log dicts" if not imported.skipped else "readable log dicts"
        raise ForeignLogError(
            f"{path}: no HF Trainer {what} and no DeepSpeed step lines: not a training console log"
        )
    if entries and entries[-1].after == -1:
        entries[-1].after = None
    imported.max_steps = bar_total
    imported.load_memory = pending_memory
    numbers = _number_steps(imported, entries, bar_total)
    for entry, step in zip(entries, numbers, strict=True):
        fields = imported.step(step)
        fields.update(hf_log_fields(entry.fields, t="train_runtime"))
    for e in imported.evals:
        after = e.pop("after")
        e["step"] = numbers[after - 1] if after else 0
    _merge_deepspeed(imported, ds_steps, bool(entries))
    _set_clock(imported)
    rates_from_tokens(imported)
    if bar_total and imported.steps and max(imported.steps) >= bar_total:
        imported.finished = True
    return imported


def _ds_time(text: str) -> float | None:
    try:
        return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None


def _number_steps(imported: Imported, entries: list[_Entry], bar_total: int | None) -> list[int]:
    """Each training dict's step: the bar's count right after it, else counted at the bars' interval."""
    after = [e.after for e in entries]
    if entries and all(a is not None for a in after) and _increasing(after):
        return [int(a) for a in after if a is not None]
    known = [(i, a) for i, a in enumerate(after) if a is not None]
    if len(known) >= 2 and _increasing([a for _, a in known]):
        (i0, a0), (i1, a1) = known[0], known[1]
        interval = (a1 - a0) // (i1 - i0) if i1 > i0 else 0
        if interval > 0 and all(a == a0 + (i - i0) * interval for i, a in known):
            numbers = [a0 + (i - i0) * interval for i in range(len(entries))]
            if numbers[0] >= 1:
                imported.notes.append(
                    f"steps of {len(entries) - len(known)} log dicts without a progress bar after them "
                    f"counted at the bars' interval of {interval}"
                )
                return numbers
    if entries:
        why = "no progress bar" if not known else "the progress bar is out of order with the dicts"
        imported.notes.append(
            f"steps numbered by log dict ({why}): they are the logging steps only if logging_steps = 1"
        )
    return list(range(1, len(entries) + 1))


def _increasing(values: list[int | None]) -> bool:
    nums = [v for v in values if v is not None]
    return all(b > a for a, b in itertools.pairwise(nums)) and all(v >= 1 for v in nums)


def _merge_deepspeed(imported: Imported, ds_steps: dict[int, dict[str, Any]], have_dicts: bool) -> None:
    """DeepSpeed's figures join the dict of the same step; with no dicts at all, they are the steps."""
    unmatched = 0
    for step, fields in sorted(ds_steps.items()):
        if have_dicts and step not in imported.steps:
            unmatched += 1
            continue
        target = imported.step(step)
        for key, value in fields.items():
            if key == "t":
                target["ds_t"] = value
            elif value is not None:
                target.setdefault(key, value)
    if unmatched:
        imported.notes.append(f"DeepSpeed figures of {unmatched} steps with no HF log dict were left out")


def _set_clock(imported: Imported) -> None:
    """Elapsed (HF's train_runtime) or wall (DeepSpeed's timestamps) when every step has one, else steps."""
    steps = imported.steps.values()
    runtimes = [f.get("t") for _, f in sorted(imported.steps.items())]
    walls = [f.get("ds_t") for _, f in sorted(imported.steps.items())]
    for fields in steps:
        fields.pop("t", None)
    if runtimes and all(t is not None for t in runtimes) and _non_decreasing(runtimes):
        imported.clock = "elapsed"
        chosen = runtimes
    elif walls and all(t is not None for t in walls) and _non_decreasing(walls):
        imported.clock = "wall"
        chosen = walls
    else:
        imported.clock = "step"
        chosen = []
    for (_, fields), t in zip(sorted(imported.steps.items()), chosen, strict=False):
        fields["t"] = t
    for fields in steps:
        fields.pop("ds_t", None)
    if imported.clock == "step" and any(t is not None for t in walls):  # some steps have one, not all
        imported.notes.append("DeepSpeed's times cover only some steps: the clock is the step count")


def _non_decreasing(values: list[Any]) -> bool:
    return all(b >= a for a, b in itertools.pairwise(values))
