"""HF Trainer output: `trainer_state.json` in the output directory and in each `checkpoint-N/`.

Each state holds the log history up to its step (`loss`, `learning_rate`, `grad_norm`, `epoch`, and
with `include_num_input_tokens_seen` also `num_input_tokens_seen` and `train_runtime`, the seconds since
training began), evaluations (`eval_loss`) and the final summary (`train_loss`). The states are merged,
newest first: a later checkpoint's history already holds the earlier ones', and an older one adds
only the steps a newer history lacks (a history cut by a resume). There are no Unix times in a state:
with `train_runtime` the clock is elapsed training time, else the step count.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

from cockpit.importers.model import (
    ForeignLogError,
    Imported,
    figure,
    hf_log_fields,
    number,
    rates_from_tokens,
    read_text,
)

STATE = "trainer_state.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def state_files(folder: Path) -> list[Path]:
    """The output directory's own state (if saved) and each checkpoint's, newest step first."""
    found: list[tuple[int, Path]] = []
    for child in folder.iterdir() if folder.is_dir() else []:
        match = _CHECKPOINT.match(child.name)
        if match and (child / STATE).is_file():
            found.append((int(match.group(1)), child / STATE))
    found.sort(reverse=True)
    top = [folder / STATE] if (folder / STATE).is_file() else []
    return top + [path for _, path in found]


def load_state(path: Path) -> dict[str, Any]:
    """One `trainer_state.json`; `ForeignLogError` when it is not JSON or not a trainer state."""
    text = read_text(path)
    try:
        state = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ForeignLogError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    return check_state(path, state)


def check_state(path: Path, state: Any) -> dict[str, Any]:
    """`state` if it has the shape of a trainer state, else `ForeignLogError` naming the field."""
    if not isinstance(state, dict):
        raise ForeignLogError(
            f"{path}: a JSON {type(state).__name__}, not an HF trainer_state.json (an object with "
            "log_history)"
        )
    history = state.get("log_history")
    if not isinstance(history, list):
        raise ForeignLogError(f"{path}: no `log_history` list: not an HF trainer_state.json")
    return state


def read_states(source: Path, paths: list[Path]) -> Imported:
    """Merge the states at `paths` (newest first) into one import."""
    imported = Imported(source=source, format="hf-trainer-state")
    states = [(path, load_state(path)) for path in paths]
    newest = states[0][1]
    imported.max_steps = _int(newest.get("max_steps"))
    global_step = _int(newest.get("global_step"))
    seen: set[tuple[str, int]] = set()
    runtimes: list[tuple[int, float]] = []
    for path, state in states:
        for i, entry in enumerate(state["log_history"]):
            if not isinstance(entry, dict) or _int(entry.get("step")) is None:
                imported.skip(f"log_history entries without a step in {path.name}", i + 1)
                continue
            step = int(entry["step"])
            kind = "eval" if "eval_loss" in entry else "end" if "train_loss" in entry else "train"
            if (kind, step) in seen:
                continue  # a newer state already had it
            seen.add((kind, step))
            if kind == "end":
                imported.finished = True
            elif kind == "eval":
                loss = figure(entry.get("eval_loss"))  # NaN or infinity kept: a diverged run
                if loss is not None:
                    imported.evals.append({"step": step, "loss": loss})
            elif "loss" in entry:
                fields = imported.step(step)
                fields.update(hf_log_fields(entry))
                runtime = number(entry.get("train_runtime"))
                if runtime is not None:
                    runtimes.append((step, runtime))
    if global_step is not None and imported.max_steps and global_step >= imported.max_steps:
        imported.finished = True
    _set_clock(imported, runtimes)
    rates_from_tokens(imported)
    imported.evals.sort(key=lambda e: e["step"])
    if len(paths) > 1:
        imported.notes.append(
            f"merged {len(paths)} trainer states ({', '.join(p.parent.name for p in paths)})"
        )
    return imported


def _set_clock(imported: Imported, runtimes: list[tuple[int, float]]) -> None:
    """Elapsed training time when every step has a `train_runtime` that only grows, else the step count."""
    ordered = sorted(runtimes)
    times = [t for _, t in ordered]
    if len(ordered) == len(imported.steps) and ordered and all(b >= a for a, b in itertools.pairwise(times)):
        imported.clock = "elapsed"
        for step, t in ordered:
            imported.steps[step]["t"] = t
        by_step = dict(ordered)
        for e in imported.evals:
            if e["step"] in by_step:
                e["t"] = by_step[e["step"]]
    elif runtimes:
        imported.notes.append(
            "train_runtime restarts (a resumed run) or is missing: the clock is the step count"
        )


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def read_output_dir(folder: Path) -> Imported:
    """An HF Trainer output directory (`ForeignLogError` when it holds no trainer state)."""
    paths = state_files(folder)
    if not paths:
        raise ForeignLogError(f"{folder}: no {STATE} in it or in a checkpoint-N/ folder")
    return read_states(folder, paths)
