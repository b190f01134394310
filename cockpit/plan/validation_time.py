"""The wall time of the validation passes of a run (`trainer/evaluation/validation.py`), shared by `cockpit
plan` and the rehearsal's forecast.

The trainer computes the validation loss at the first step, every `validation.eval_steps` optimizer
steps and at the last: a pass is a forward (no backward, no generation) over the validation sample, its
examples packed into rows of `training.seq_len` and collated `training.micro_batch_size` rows at a time,
the micro-batches shared by the ranks. A micro-batch's forward is timed by a rehearsal where one ran
(`cockpit.rehearse`: the forwards timed on its slices); the plan models it from a training micro-batch's
step of the same shape (`modelled_forward`):

- compute: a training step does the forward, again the forward under gradient checkpointing (the
  recompute), and the backward of the inputs (frozen weights have no weight gradient; LoRA's are small),
  so a forward is about 1/3 of the step's compute, 1/2 without gradient checkpointing;
- transfers: ZeRO-3 gathers a layer `ZERO3_LAYER_FETCHES` times a training micro-batch
  (`cockpit.contract`) and once a forward, so a forward pays 1 / `ZERO3_LAYER_FETCHES` of what the step
  spends beyond its compute (the copies and gathers not hidden under it).

A rehearsal record from before it timed forwards takes the plan's modelled forward, scaled to the
rehearsed step; with neither (no plan of the step), a forward is a share of the whole step
(`forward_share`): the compute share, and with parameter offload at least 1 / `ZERO3_LAYER_FETCHES` (a
step set by its copies).

Early stopping can end a run before its last pass; the count here is the run to its end. The sample's
size comes from the data file when it is here (the trainer's own choice of examples), else from the
profile's assumption: the held-out share (`data.eval_fraction`) of `data.examples`, at most
`validation.examples_per_tenant` a tenant when `data.tenants` says how many there are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cockpit.contract import ZERO3_LAYER_FETCHES, packed_fill
from cockpit.plan.run_length import DataSize, from_data_file

FORWARD_SHARE_CHECKPOINTED = 1 / 3  # forward of forward + recompute + input backward
FORWARD_SHARE_PLAIN = 1 / 2  # forward of forward + input backward


@dataclass(frozen=True)
class ValidationTime:
    """The validation passes of a run and what they cost."""

    passes: int
    examples: float  # a pass's
    tokens: float
    micro_batches: int  # a pass's, over every rank
    rounds: int  # forwards a rank runs a pass (the ranks share the micro-batches)
    forward_share: float  # a forward's time, as a share of a training micro-batch's step
    pass_s: float | None
    total_s: float | None
    how: str  # where the sample's size came from
    share_how: str  # why that forward share

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def words(self) -> str:
        """One line: `9 passes x 30 examples (4,211 tokens; 2 micro-batches, 2 forwards a rank) x 1/3 of a
        micro-batch step (...) = 0.01 h`."""
        cost = f" = {self.total_s / 3600:.2f} h" if self.total_s is not None else ""
        each = f", {self.pass_s:.1f} s each" if self.pass_s is not None else ""
        return (
            f"{self.passes} passes x {self.examples:,.0f} examples ({self.tokens:,.0f} tokens; "
            f"{self.micro_batches} micro-batch(es), {self.rounds} forward(s) a rank{each}) x "
            f"{self.forward_share:.2f} of a micro-batch step ({self.share_how}){cost}; sample: {self.how}"
        )


def modelled_forward(profile: Any, compute_s: float, step_s: float) -> tuple[float, str]:
    """A validation forward of a micro-batch from a training micro-batch's compute and whole step: the
    forward's share of the compute, and one of the step's layer fetches of what it spends beyond its
    compute; and why."""
    share, _ = compute_share(profile)
    beyond = max(0.0, step_s - compute_s)
    why = f"modelled: {share:.2f} of the step's compute"
    if beyond > 0:
        why += f" + 1/{ZERO3_LAYER_FETCHES} of its {beyond:.2f} s of exposed transfers"
    return share * compute_s + beyond / ZERO3_LAYER_FETCHES, why


def validation_passes(steps: int, eval_steps: int) -> int:
    """Validations of a run of `steps` optimizer steps: at step 0, every `eval_steps` and at the last
    (0 when `eval_steps` is 0: no validation)."""
    if not eval_steps or steps <= 0:
        return 0
    return 1 + steps // eval_steps + (1 if steps % eval_steps else 0)


def compute_share(profile: Any) -> tuple[float, str]:
    """A forward's share of a training micro-batch's compute, and why."""
    if profile.training.gradient_checkpointing:
        return FORWARD_SHARE_CHECKPOINTED, "forward of forward, recompute and input backward"
    return FORWARD_SHARE_PLAIN, "forward of forward and input backward"


def forward_share(profile: Any) -> tuple[float, str]:
    """A validation forward's time as a share of a training micro-batch's step, and why."""
    share, why = compute_share(profile)
    if profile.deepspeed.stage == 3 and profile.deepspeed.offload_param != "none":
        copies = 1 / ZERO3_LAYER_FETCHES
        if copies > share:
            share = copies
            why = f"offloaded: one layer copy of a training micro-batch's {ZERO3_LAYER_FETCHES}"
    return share, why


def from_profile(profile: Any) -> DataSize | None:
    """The profile's assumption: the held-out share of `data.examples` of `data.mean_tokens` tokens, at
    most `validation.examples_per_tenant` a tenant of `data.tenants` (when given)."""
    d, v = profile.data, profile.validation
    if not (d.examples and d.mean_tokens):
        return None
    held = d.examples * d.eval_fraction / (1 - d.eval_fraction)
    how = f"assumed: the held-out {d.eval_fraction:g} of data.examples"
    tenants = getattr(d, "tenants", 0)
    if tenants:
        if tenants * v.examples_per_tenant < held:
            how = f"assumed: {v.examples_per_tenant} a tenant of data.tenants {tenants}"
        held = min(held, tenants * v.examples_per_tenant)
    else:
        how += " (no data.tenants: every held-out example)"
    examples = math.floor(held)
    return DataSize(float(examples), float(examples * d.mean_tokens), f"{how}, {d.mean_tokens} tokens each")


def validation_size(profile: Any, size: DataSize | None = None) -> DataSize | None:
    """The validation sample: the data file's (from `size` when it was counted there, else read now),
    else the profile's assumption."""
    if size is not None and size.validation is not None:
        return size.validation
    here = from_data_file(profile)
    return (here.validation if here is not None else None) or from_profile(profile)


def validation_time(
    profile: Any,
    steps: int,
    ranks: int,
    micro_step_s: float | None,
    size: DataSize | None = None,
    forward: tuple[float, str] | None = None,
) -> ValidationTime | None:
    """The validation passes of a run of `steps` steps on `ranks` ranks, each micro-batch's forward
    `forward` (its seconds and how they were found: timed by a rehearsal, or `modelled_forward`), else a
    share of `micro_step_s` (a training micro-batch's step); None when the run does not validate or the
    sample's size is unknown."""
    t, v = profile.training, profile.validation
    passes = validation_passes(steps, v.eval_steps)
    sample = validation_size(profile, size) if passes else None
    if not passes or sample is None or not sample.examples:
        return None
    mean = round(sample.tokens / sample.examples)
    fill = packed_fill(max(2, min(mean, t.seq_len)), t.seq_len)  # validation rows are always packed
    rows = math.ceil(sample.tokens / (t.seq_len * fill))
    micro_batches = math.ceil(rows / t.micro_batch_size)
    rounds = math.ceil(micro_batches / max(1, ranks))
    if forward is not None:
        forward_s, why = forward
        share = forward_s / micro_step_s if micro_step_s else 0.0
        pass_s: float | None = rounds * forward_s
    else:
        share, why = forward_share(profile)
        pass_s = rounds * micro_step_s * share if micro_step_s else None
    return ValidationTime(
        passes=passes,
        examples=sample.examples,
        tokens=sample.tokens,
        micro_batches=micro_batches,
        rounds=rounds,
        forward_share=share,
        pass_s=pass_s,
        total_s=passes * pass_s if pass_s is not None else None,
        how=sample.how,
        share_how=why,
    )
