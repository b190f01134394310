"""A profile's plan: the model's parameters and bytes, both phases as configured, a verdict, and options.

`build_plan(profile)` reads only the model's config.json; `Plan.to_dict()` is what `cockpit plan
--format json` prints and what `cockpit run` stores as `plan.json` beside `run.json`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cockpit.contract import LOADERS, TINY_MODEL, experts_storage_dtype, loader_of
from cockpit.plan.formats import bytes_per_param_4bit, four_bit, plain
from cockpit.plan.geometry import KINDS, GeometryError, ModelGeometry, geometry_from_config, load_geometry
from cockpit.plan.hardware import Hardware, resolve_hardware
from cockpit.plan.model import (
    OFFLOAD_MODES,
    Assumptions,
    Estimate,
    GiB,
    Inputs,
    Precision,
    Setup,
    estimate,
    lora_params,
)
from cockpit.plan.units import size
from cockpit.plan.validation_time import ValidationTime
from cockpit.profiles import BUILTIN_PREFIX, Profile


class PlanError(ValueError):
    """A profile that cannot be planned (no readable config.json)."""


def resolve_geometry(profile: Profile) -> ModelGeometry:
    """The model's geometry: `model.config`, else `model.path`/config.json, else the built-in config."""
    name = profile.model.name or Path(profile.model.path).name
    try:
        if profile.model.config:
            return load_geometry(profile.model.config, name)
        if profile.model.path.startswith(BUILTIN_PREFIX):
            return geometry_from_config({"model_type": "qwen3_moe", **TINY_MODEL}, name)
        return load_geometry(profile.model.path, name)
    except GeometryError as exc:
        raise PlanError(
            f"{exc} (set model.config to the model's config.json to plan without the weights)"
        ) from None


def inputs_for(profile: Profile, geometry: ModelGeometry, assumptions: Assumptions | None = None) -> Inputs:
    q = profile.quantization
    return Inputs(
        geometry=geometry,
        precision=Precision(
            load_in_4bit=q.load_in_4bit,
            quant_type=q.quant_type,
            double_quant=q.double_quant,
            storage_dtype=q.storage_dtype,
            compute_dtype=q.compute_dtype,
            experts_4bit=q.quantize_experts,
            experts_storage_dtype=experts_storage_dtype(profile.training.bf16, q.storage_dtype),
        ),
        lora_targets=tuple(profile.lora.target_modules),
        lora_r=profile.lora.r,
        assumptions=assumptions or Assumptions(),
    )


def setup_for(profile: Profile, hw: Hardware) -> Setup:
    """The profile's own configuration, loaded the way the trainer loads it."""
    ds, t = profile.deepspeed, profile.training
    return Setup(
        gpus=hw.gpus,
        nodes=hw.nodes,
        stage=ds.stage,
        offload_param=ds.offload_param,
        offload_optimizer=ds.offload_optimizer,
        loader=loader_of(profile.model.loader, profile.model.trust_remote_code),
        seq_len=t.seq_len,
        micro_batch=t.micro_batch_size,
        grad_ckpt=t.gradient_checkpointing,
        gpu_mem_gib=hw.gpu_mem_gib,
        host_ram_gib=hw.host_ram_gib,
        gpu_name=hw.gpu_name,
        packing=t.packing,
        doc_tokens=profile.data.mean_tokens,
        prefetch_layers=ds.prefetch_layers if ds.stage == 3 else 0.0,
        embeddings_on_gpu=ds.embeddings_on_gpu,
        chunked_loss=t.chunked_loss,
        attention=t.attention,
    )


def _rank(e: Estimate) -> tuple:
    """Sort key for fitting options: fastest first; then what the trainer does today, then less offload."""
    s = e.setup
    offload = ("none", "cpu", "nvme").index(s.offload_param) * 2 + ("none", "cpu", "nvme").index(
        s.offload_optimizer
    )
    return (-(e.tokens_per_s or 0.0), s.loader != "layerwise", offload)


def pick(estimates: list[Estimate]) -> Estimate:
    """The fastest that fits; if none fits, the one closest to fitting."""
    fitting = [e for e in estimates if e.fits]
    if fitting:
        return min(fitting, key=_rank)
    return min(estimates, key=lambda e: e.binding.ratio if e.binding else 0.0)


@dataclass
class Option:
    label: str
    estimate: Estimate


@dataclass
class Plan:
    profile_name: str
    geometry: ModelGeometry
    hardware: Hardware
    inputs: Inputs
    configured: Estimate
    found: OptionSet
    alt_experts: Estimate | None = None  # as configured, with the experts' precision flipped
    alt_found: OptionSet | None = None
    notes: list[str] = field(default_factory=list)
    save_total_limit: int = 1
    run: RunLength | None = None  # the training run's length and wall time for its data

    @property
    def options(self) -> list[Option]:
        return self.found.rows

    @property
    def best(self) -> Estimate | None:
        return self.found.best

    @property
    def requirements(self) -> list[str]:
        return self.found.requirements

    def best_overrides(self) -> list[str]:
        """The `--set` overrides that take the fastest configuration that fits (none: it is the profile's)."""
        if self.best is None:
            return []
        accum = self.run.micro_batches if self.run else 1
        return overrides_for(self.configured.setup, self.best.setup, accum)

    # --- figures ---------------------------------------------------------------------------
    def kind_table(self) -> list[dict[str, Any]]:
        """Per kind: parameters, bytes in bf16 / NF4 / NF4 with double quant, and as planned."""
        prec = self.inputs.precision
        rows: dict[str, dict[str, Any]] = {
            k: {
                "kind": k,
                "params": 0,
                "bf16": 0,
                "nf4": 0,
                "nf4_dq": 0,
                "planned": 0,
                "planned_4bit_params": 0,
            }
            for k in KINDS
        }
        for t, s in self.inputs.weights.items:
            r = rows.setdefault(
                t.kind,
                {
                    "kind": t.kind,
                    "params": 0,
                    "bf16": 0,
                    "nf4": 0,
                    "nf4_dq": 0,
                    "planned": 0,
                    "planned_4bit_params": 0,
                },
            )
            r["params"] += t.numel
            r["bf16"] += plain(t.numel, "bfloat16").total
            quantizable = len(t.shape) >= 2
            r["nf4"] += (
                four_bit(t.numel, False, prec.storage_dtype).total
                if quantizable
                else plain(t.numel, "bfloat16").total
            )
            r["nf4_dq"] += (
                four_bit(t.numel, True, prec.storage_dtype).total
                if quantizable
                else plain(t.numel, "bfloat16").total
            )
            r["planned"] += s.total
            if prec.quantized(t):
                r["planned_4bit_params"] += t.numel
        return [r for r in rows.values() if r["params"]]

    @property
    def lora_params(self) -> int:
        return lora_params(self.geometry, self.inputs.lora_targets, self.inputs.lora_r)

    def verdict(self) -> str:
        e = self.configured
        b = e.binding
        if e.fits and e.unchecked:
            missing = " and ".join(e.unchecked)
            return (
                f"NOT CHECKED: {missing} unknown (pass --gpu-mem-gib / --host-ram-gib, or set them in the "
                f"profile's [hardware]); as configured ({e.setup.describe()}) it fits what is known"
            )
        if e.fits:
            head = f"FITS as configured ({e.setup.describe()})"
            return head + (f"; tightest: {b.name}, {gib(b.need)} of {gib(b.limit)} usable" if b else "")
        return (
            f"DOES NOT FIT as configured ({e.setup.describe()}): {b.name} needs {gib(b.need)} "
            f"of {gib(b.limit)} usable"
            if b
            else "DOES NOT FIT as configured"
        )

    def to_dict(self) -> dict[str, Any]:
        g, hw, prec = self.geometry, self.hardware, self.inputs.precision
        acts = self.inputs.activations(self.configured.setup)
        w = self.inputs.weights
        layer_name, layer_bytes = w.largest_layer()
        return {
            "plan_version": 1,
            "profile": self.profile_name,
            "model": {
                "name": g.name,
                "model_type": g.model_type,
                "layers": g.layers,
                "hidden": g.hidden,
                "experts": g.experts,
                "top_k": g.top_k,
                "vocab": g.vocab,
                "params_total": g.total_params,
                "params_active_per_token": g.active_matmul_params(),
                "notes": list(g.notes),
            },
            "hardware": {
                "gpus": hw.gpus,
                "nodes": hw.nodes,
                "gpu_name": hw.gpu_name,
                "gpu_mem_gib": hw.gpu_mem_gib,
                "host_ram_gib": hw.host_ram_gib,
                "source": hw.source,
            },
            "precision": {
                "load_in_4bit": prec.load_in_4bit,
                "quant_type": prec.quant_type,
                "double_quant": prec.double_quant,
                "storage_dtype": prec.storage_dtype,
                "compute_dtype": prec.compute_dtype,
                "experts_4bit": prec.experts_4bit,
                "bytes_per_param_4bit": bytes_per_param_4bit(prec.double_quant),
            },
            "kinds": self.kind_table(),
            "weights_bytes": {
                "checkpoint": w.checkpoint_bytes,
                "stored": w.stored_bytes,
                "stored_data": w.data_bytes,
                "quantization_state": w.state_bytes,
            },
            "lora": {
                "r": self.inputs.lora_r,
                "targets": list(self.inputs.lora_targets),
                "params": self.lora_params,
                "optimizer_bytes": 16 * self.lora_params,
            },
            "activations": {
                "seq_len": self.configured.setup.seq_len,
                "micro_batch": self.configured.setup.micro_batch,
                "with_checkpointing": acts.total(True),
                "without_checkpointing": acts.total(False),
                "logits": acts.logits,
            },
            "zero3": {
                "largest_gathered_layer": layer_name,
                "largest_gathered_layer_bytes": layer_bytes,
                "partition_bytes_per_gpu": w.data_bytes // max(1, hw.gpus),
                "pinned_exact_per_rank": self.configured.pinned_exact,
                "pinned_rounded_per_rank": self.configured.pinned_rounded,
                "blocks": w.blocks,
            },
            "disk": self.disk(),
            "configured": estimate_dict(self.configured),
            "verdict": self.verdict(),
            "requirements": self.requirements,
            "best": estimate_dict(self.best) if self.best else None,
            "best_overrides": self.best_overrides(),
            "options": [{"label": o.label, **estimate_dict(o.estimate)} for o in self.options],
            "alt_experts": estimate_dict(self.alt_experts) if self.alt_experts else None,
            "alt_best": estimate_dict(self.alt_found.best)
            if self.alt_found and self.alt_found.best
            else None,
            "assumptions": {
                **vars(self.inputs.assumptions),
                "speed": vars(self.inputs.assumptions.speed),
            },
            "notes": self.notes,
            "run": self.run.to_dict() if self.run else None,
        }

    def disk(self) -> dict[str, int]:
        """Checkpoints: DeepSpeed saves the LoRA weights and their optimizer state (not the frozen ones)."""
        lora = self.lora_params
        act = self.inputs.precision.act_bytes
        per_checkpoint = lora * (act + 12) + lora * act  # engine states + fp32 optimizer + the adapter file
        return {
            "per_checkpoint": per_checkpoint,
            "checkpoints_kept": per_checkpoint * self.save_total_limit,
            "adapter": lora * act,
            "model_files": self.inputs.weights.checkpoint_bytes,
        }


def gib(n: float) -> str:
    """Bytes in the unit that fits (GiB for the story's sizes, MiB or KiB for a tiny model's)."""
    return size(n)


def estimate_dict(e: Estimate) -> dict[str, Any]:
    s = e.setup
    return {
        "setup": {
            "gpus": s.gpus,
            "stage": s.stage,
            "offload_param": s.offload_param,
            "offload_optimizer": s.offload_optimizer,
            "loader": s.loader,
            "seq_len": s.seq_len,
            "micro_batch": s.micro_batch,
            "grad_ckpt": s.grad_ckpt,
            "describe": s.describe(),
        },
        "load": {
            "gpu_peak": e.load.gpu_peak,
            "gpu_terms": e.load.gpu,
            "rss_peak": e.load.rss_peak,
            "rss_terms": e.load.rss,
            "host_peak": e.load.host_peak,
            "host_terms": e.load.host,
            "page_cache": e.load.page_cache,
        },
        "train": {
            "gpu_peak": e.train.gpu_peak,
            "gpu_terms": e.train.gpu,
            "rss_peak": e.train.rss_peak,
            "rss_terms": e.train.rss,
            "host_peak": e.train.host_peak,
            "host_terms": e.train.host,
        },
        "step_s": e.step_s,
        "compute_s": e.compute_s,
        "transfer_s": e.transfer_s,
        "tokens_per_s": e.tokens_per_s,
        "fits": e.fits,
        "unchecked": e.unchecked,
        "binding": e.binding.name if e.binding else None,
        "checks": [{"name": c.name, "need": c.need, "limit": c.limit, "ok": c.ok} for c in e.checks],
        "notes": e.notes,
    }


# --- options -----------------------------------------------------------------------------------
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
    return out


def shorter(seq_len: int) -> list[int]:
    return [s for s in (seq_len // 2, seq_len // 4) if s >= 256]


def other_gpus(gpus: int) -> list[int]:
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
    if other.micro_batch != configured.micro_batch:
        sets.append(f"training.micro_batch_size={other.micro_batch}")
        accum = grad_accum * configured.micro_batch // other.micro_batch
        if accum != grad_accum and accum >= 1:
            sets.append(f"training.grad_accum={accum}")
    return sets


@dataclass
class OptionSet:
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
        wider = _variants(inputs, replace(base, micro_batch=2 * base.micro_batch), n, t)
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
    return OptionSet(rows, best, closest, requirements)


@dataclass(frozen=True)
class RunLength:
    """Optimizer steps for the profile's data and epochs, and their training time as configured."""

    steps: int
    how: str  # where the token count came from
    micro_batches: int  # a rank's micro-batches an optimizer step (gradient accumulation)
    optimizer_step_s: float | None
    train_s: float | None
    validation: ValidationTime | None = None  # the validation loss's passes, on top of `train_s`

    @property
    def validation_s(self) -> float | None:
        """The validation passes' seconds, where known."""
        return self.validation.total_s if self.validation is not None else None

    @property
    def with_validation_s(self) -> float | None:
        """Training and the validation passes on top of it (None without a training time)."""
        return None if self.train_s is None else self.train_s + (self.validation_s or 0.0)

    def to_dict(self) -> dict[str, Any]:
        out = dict(vars(self))
        out["validation"] = self.validation.to_dict() if self.validation else None
        return out


def run_length(profile: Profile, hw: Hardware, configured: Estimate) -> RunLength:
    """Steps from the data (`cockpit.plan.run_length`) times the configured micro-batch's step time, and
    the validation passes (`cockpit.plan.validation_time`)."""
    from cockpit.plan.run_length import data_size, run_steps
    from cockpit.plan.validation_time import validation_time

    size = data_size(profile)
    steps, how = run_steps(profile, size, hw.ranks)
    accum = profile.training.grad_accum
    step = configured.step_s * accum if configured.step_s else None
    validation = validation_time(profile, steps, hw.ranks, configured.step_s, size)
    return RunLength(steps, how, accum, step, steps * step if step and steps else None, validation)


def build_plan(
    profile: Profile,
    hardware: Hardware | None = None,
    assumptions: Assumptions | None = None,
    geometry: ModelGeometry | None = None,
) -> Plan:
    """The plan for a profile on some hardware (by default: the profile's, completed from this machine)."""
    geometry = geometry or resolve_geometry(profile)
    hw = hardware or resolve_hardware(profile)
    inputs = inputs_for(profile, geometry, assumptions)
    base = setup_for(profile, hw)
    configured = estimate(inputs, base)
    found = options(inputs, base, profile.training.grad_accum)
    notes = list(geometry.notes)
    if hw.gpus and not hw.gpu_mem_gib:
        notes.append(
            "GPU memory unknown (no NVML here and none in the profile): pass --gpu-mem-gib to check the GPU"
        )
    alt = alt_found = None
    if geometry.is_moe and inputs.precision.load_in_4bit:
        flipped = inputs.with_experts_4bit(not inputs.precision.experts_4bit)
        alt, alt_found = estimate(flipped, base), options(flipped, base, profile.training.grad_accum)
    return Plan(
        profile_name=profile.name,
        geometry=geometry,
        hardware=hw,
        inputs=inputs,
        configured=configured,
        found=found,
        alt_experts=alt,
        alt_found=alt_found,
        notes=notes,
        save_total_limit=profile.training.save_total_limit,
        run=run_length(profile, hw, configured),
    )
