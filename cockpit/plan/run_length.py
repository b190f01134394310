"""How long a run is: its training tokens and its optimizer steps, and where the token count came from.

The count comes, in order, from what a trainer measured (a run's `data` event), from the profile's data
(examples of its train split, in any format `cockpit.data` reads, counted as `cockpit data` counts them:
`cockpit.data.chat.token_count`, the model's tokenizer and chat template when they are at `model.path`,
else about four characters a token), or from the profile's `data.examples` and `data.mean_tokens`. Every
answer says which.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cockpit.contract import packed_fill

ASSUMED_LABELS = 4  # labels an example where the data is not here (the story's tenants have 3 to 5)


@dataclass(frozen=True)
class EvalSplit:
    """The held-out split: its examples, the labels an example, and where they came from."""

    examples: float
    labels: float  # mean labels an example (each is a scored row)
    how: str
    least: float | None = None  # fewer examples, where the count is an assumption read two ways


def held_out_split(examples: list[dict[str, Any]], where: str) -> EvalSplit:
    """The eval split of examples read from a data file."""
    labels = [len(e.get("labels") or []) or 1 for e in examples]
    mean = sum(labels) / len(labels) if labels else float(ASSUMED_LABELS)
    return EvalSplit(float(len(examples)), mean, f"{len(examples)} held-out examples of {where}")


@dataclass(frozen=True)
class DataSize:
    """Training examples and tokens, the packing fill when known, and how they were found."""

    examples: float
    tokens: float
    how: str
    fill: float | None = None  # measured packing fill (a trainer's data event)
    validation: DataSize | None = None  # the validation sample, counted the same way (a data file's)
    held_out: EvalSplit | None = None  # the eval split (what evaluation scores), a data file's


def from_data_event(data: dict[str, Any]) -> DataSize | None:
    """What a trainer measured: its `data` event (None for a rehearsal's random tokens)."""
    source = str(data.get("source") or "")
    if not data.get("tokens") or source.startswith("random tokens"):
        return None
    fill = data.get("fill")
    return DataSize(
        float(data.get("examples") or 0),
        float(data["tokens"]),
        f"tokens of {source}",
        float(fill) if fill else None,
    )


def from_data_file(profile: Any) -> DataSize | None:
    """Count the train split of the profile's data file (any format `cockpit.data` reads), if it is on
    this machine and readable (None otherwise, or where `datasets` is not installed); and its validation
    sample, as the trainer draws it (`cockpit.data.examples.validation_sample`), when the profile
    validates; and its eval split (what evaluation scores: `cockpit.plan.eval_time`)."""
    source = str(profile.data.source)
    path = Path(source).expanduser()
    if source.startswith("builtin:") or not path.exists():
        return None
    try:
        from cockpit.cache import cache_root
        from cockpit.data import DataError, load_examples
        from cockpit.data.builtin import tokenizer_folder
        from cockpit.data.chat import token_count
        from cockpit.data.examples import validation_sample

        data = load_examples(path, profile.data, strict=False, cache_dir=cache_root() / "datasets")
    except (ImportError, DataError):
        return None
    count = token_count(tokenizer_folder(profile.model.path), profile.model.path)
    by = count.how if count.tokenizer is None else f"counted with {count.how}"
    train = data.split("train")
    tokens = count.total(train)
    validation = None
    v = getattr(profile, "validation", None)
    if v is not None and v.eval_steps:
        sample, split = validation_sample(data, v.examples_per_tenant)
        if sample:
            val_tokens = count.total(sample)
            first = f"its {split} split's first {v.examples_per_tenant} a tenant"
            how = f"{len(sample)} examples of {path} ({first})"
            validation = DataSize(float(len(sample)), float(val_tokens), f"{how}, {by}")
    return DataSize(
        float(len(train)),
        float(tokens),
        f"{len(train)} examples of {path}, {by}",
        validation=validation,
        held_out=held_out_split(data.split("eval"), str(path)),
    )


def from_profile(profile: Any) -> DataSize | None:
    """The profile's assumption: `data.examples` of `data.mean_tokens` tokens."""
    d = profile.data
    if not (d.examples and d.mean_tokens):
        return None
    how = f"assumed: {d.examples} examples of {d.mean_tokens} tokens (data.examples, data.mean_tokens)"
    return DataSize(float(d.examples), float(d.examples * d.mean_tokens), how)


def data_size(profile: Any, data: dict[str, Any] | None = None) -> DataSize | None:
    """The best count at hand: measured, then the data file, then the profile's assumption."""
    return (from_data_event(data) if data else None) or from_data_file(profile) or from_profile(profile)


def run_steps(profile: Any, size: DataSize | None, ranks: int) -> tuple[int, str]:
    """Optimizer steps of the whole run over `size`, and how the count was found."""
    t = profile.training
    if size is None:
        return 0, "unknown: no data file here and no data.examples / data.mean_tokens in the profile"
    how = size.how
    if not t.packing:
        fill = 1.0
    elif size.fill is not None:
        fill = size.fill
    else:  # pack examples of the mean length, as the trainer packs them (best-fit decreasing)
        mean = round(size.tokens / size.examples) if size.examples else t.seq_len
        fill = packed_fill(max(2, min(mean, t.seq_len)), t.seq_len)
        how += f", packed {fill:.2f} full"
    rows = math.ceil(size.tokens / (t.seq_len * fill)) if t.packing else int(size.examples)
    per_step = t.micro_batch_size * t.grad_accum * ranks
    steps = math.ceil(rows / per_step) * t.epochs if t.max_steps < 0 else t.max_steps
    return math.ceil(steps), how
