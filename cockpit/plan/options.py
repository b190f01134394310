"""The options table: the configuration a profile asks for, beside every offload mode and loader (and, where
the experts keep their dequantized weights for backward, the same without), more rows a micro-batch, other
GPU counts and shorter sequences; the fastest that fits, and what fitting requires.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cockpit.contract import LOADERS
from cockpit.plan.configuration import OFFLOAD_MODES, Setup
from cockpit.plan.estimator import Estimate, estimate
from cockpit.plan.inputs import GiB, Inputs
from cockpit.plan.memory import keeps_dequantized

# How much faster a fitting option must be modelled than the configuration that fits to be recommended:
# the step model's own spread (benchmarks/results/plan_speed_fit.md: the story's rehearsals with offload
# predicted 3 to 14% off) is wider than a tie broken by a percent.
SPEED_TIE = 0.03


def _rank(e: Estimate) -> tuple:
    """Sort key for fitting options: fastest first; then what the trainer does today, then less offload,
    then the experts' dequantized weights kept for backward (a dequantization fewer, unmodelled)."""
    s = e.setup
    offload = ("none", "cpu", "nvme").index(s.offload_param) * 2 + ("none", "cpu", "nvme").index(
        s.offload_optimizer
    )
    return (-(e.tokens_per_s or 0.0), s.loader != "layerwise", offload, not s.keep_dequant)


def pick(estimates: list[Estimate]) -> Estimate:
    """The fastest that fits; if none fits, the one closest to fitting."""
    fitting = [e for e in estimates if e.fits]
    if fitting:
        return min(fitting, key=_rank)
    return min(estimates, key=lambda e: e.binding.ratio if e.binding else 0.0)


@dataclass
class Option:
    """One row of the options table: its label and the estimate it shows."""

    label: str
    estimate: Estimate


def _variants(inputs: Inputs, base: Setup, gpus: int, seq_len: int) -> list[Estimate]:
    """Every offload mode and loader for one GPU count and sequence length."""
    out = []
    for param, opt in OFFLOAD_MODES:
        for loader in LOADERS:
            setup = replace(
                base,
                gpus=gpus,
                seq_len=seq_len,
                stage=3,
                offload_param=param,
                offload_optimizer=opt,
                loader=loader,
            )
            out.append(estimate(inputs, setup))
            if keeps_dequantized(inputs, setup):  # its twin gives the kept weights back
                out.append(estimate(inputs, replace(setup, keep_dequant=False)))
    return out


def shorter(seq_len: int) -> list[int]:
    """The shorter sequence lengths the table tries: a half and a quarter, 256 at least."""
    return [s for s in (seq_len // 2, seq_len // 4) if s >= 256]


def other_gpus(gpus: int) -> list[int]:
    """The other GPU counts the table tries: half and twice, 1 to 16."""
    return [n for n in (gpus // 2, gpus * 2) if 1 <= n <= 16 and n != gpus]


def overrides_for(configured: Setup, other: Setup, grad_accum: int) -> list[str]:
    """The `--set` overrides that turn the configured setup into `other` (what a user types to take an
    option); more rows a micro-batch divide the accumulation so the optimizer step keeps its rows."""
    sets = []
    for field_name, key in (
        ("offload_param", "deepspeed.offload_param"),
        ("offload_optimizer", "deepspeed.offload_optimizer"),
        ("loader", "model.loader"),
    ):
        if getattr(other, field_name) != getattr(configured, field_name):
            sets.append(f'{key}="{getattr(other, field_name)}"')
    if other.gpus != configured.gpus:
        sets.append(f"hardware.gpus={other.gpus}")
    if other.seq_len != configured.seq_len:
        sets.append(f"training.seq_len={other.seq_len}")
    if other.keep_dequant != configured.keep_dequant:
        sets.append(f"training.keep_dequantized_experts={str(other.keep_dequant).lower()}")
    if other.micro_batch != configured.micro_batch:
        sets.append(f"training.micro_batch_size={other.micro_batch}")
        accum = grad_accum * configured.micro_batch // other.micro_batch
        if accum != grad_accum and accum >= 1:
            sets.append(f"training.grad_accum={accum}")
    return sets


@dataclass
class OptionSet:
    """The options table's rows, the one it recommends, and what fitting requires."""

    rows: list[Option]
    best: Estimate | None  # the fastest that fits: on the profile's GPUs and sequence length if possible
    closest: Estimate | None  # when nothing fits: the configuration nearest to fitting
    requirements: list[str]


def options(inputs: Inputs, base: Setup, grad_accum: int = 1) -> OptionSet:
    """Rows to show, the recommended configuration, and what any configuration that fits requires.

    With an even gradient accumulation, twice the rows a micro-batch and half the accumulation is the
    same optimizer step (the same rows, the same update) for fewer micro-batches: its fixed host work
    (hooks, launches, the step's bookkeeping) is paid half as often. Measured on the story's slice:
    35.6% of the bf16 rate against 29.7% (`benchmarks/results/step_speed_h200.md`, story rows)."""
    if not base.gpus:
        return OptionSet([], None, None, [])
    n, t = base.gpus, base.seq_len
    here = _variants(inputs, base, n, t)
    rows = [
        Option(name, pick([e for e in here if e.setup.offload == name])) for name in OFFLOAD_MODES.values()
    ]
    if grad_accum >= 2 and grad_accum % 2 == 0:
        wider = _variants(
            inputs, replace(base, micro_batch=2 * base.micro_batch, grad_accum=grad_accum // 2), n, t
        )
        rows.append(
            Option(f"{2 * base.micro_batch} rows a micro-batch, accumulation {grad_accum // 2}", pick(wider))
        )
        here = here + wider
    by_gpus = {m: _variants(inputs, base, m, t) for m in other_gpus(n)}
    rows += [Option(f"{'fewer' if m < n else 'more'} GPUs ({m})", pick(ests)) for m, ests in by_gpus.items()]
    by_seq = {s: _variants(inputs, base, n, s) for s in shorter(t)}
    rows += [Option(f"shorter sequences ({s})", pick(ests)) for s, ests in by_seq.items()]

    groups = [here, *by_seq.values(), *by_gpus.values()]
    best = next((pick(group) for group in groups if any(e.fits for e in group)), None)
    configured = next((e for e in here if e.setup == base), None)
    fits = configured is not None and configured.fits
    if best and fits and (best.tokens_per_s or 0) <= (configured.tokens_per_s or 0) * (1 + SPEED_TIE):
        best = configured  # a change the model cannot tell apart from what is configured is no advice
    closest = None if best else pick([e for group in groups for e in group])

    requirements = []
    fit_here = [e for e in here if e.fits]
    if fit_here and all(e.setup.loader == "layerwise" for e in fit_here):
        whole = min(e.load.gpu_peak for e in here if e.setup.loader == "transformers")
        now = "as configured" if base.loader == "layerwise" else "not what the profile says"
        requirements.append(
            f'the layer-by-layer loader (model.loader = "layerwise", {now}): from_pretrained would '
            "put each rank's whole model on its GPU before ZeRO-3 partitions it"
            + (" (the experts still in 16 bit)" if inputs.precision.experts_4bit else "")
            + f", {whole / GiB:,.1f} GiB of {base.gpu_mem_gib:g} GiB"
        )
    if fit_here and all(e.setup.offload_param != "none" for e in fit_here):
        no_off = min((e.train.gpu_peak for e in here if e.setup.offload_param == "none"), default=0)
        requirements.append(
            f"CPU offload of the parameters in training: without it each GPU needs "
            f"{no_off / GiB:,.1f} GiB of {base.gpu_mem_gib:g} GiB"
        )
    if fits and base.flash4 and base.fast_paths:
        torch_kernels = estimate(inputs, replace(base, flash4=False))
        if not torch_kernels.fits:
            requirements.append(
                "FlashAttention-4 where it trains (pip install 'cockpit[flash4]'): with torch's kernels "
                f"each GPU needs {torch_kernels.train.gpu_peak / GiB:,.1f} GiB of {base.gpu_mem_gib:g} GiB"
            )
    return OptionSet(rows, best, closest, requirements)
