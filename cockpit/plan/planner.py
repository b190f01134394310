"""A profile's plan: the model's parameters and bytes, both phases as configured, a verdict, and options.

`build_plan(profile)` reads only the model's config.json; `Plan.to_dict()` is what `cockpit plan
--format json` prints and what `cockpit run` stores as `plan.json` beside `run.json`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cockpit.plan.estimator import Estimate, estimate
from cockpit.plan.eval_time import EvalTime
from cockpit.plan.formats import bytes_per_param_4bit, four_bit, plain
from cockpit.plan.geometry import KINDS, ModelGeometry
from cockpit.plan.hardware import Hardware, resolve_hardware
from cockpit.plan.inputs import Assumptions, Inputs, inputs_for, resolve_geometry, setup_for
from cockpit.plan.load_read import LoadRead, load_read
from cockpit.plan.options import Option, OptionSet, options, overrides_for
from cockpit.plan.validation_time import ValidationTime
from cockpit.plan.weights import lora_params
from cockpit.profiles import Profile
from cockpit.units import size


@dataclass
class Plan:
    """A profile's plan: its model and hardware, the configured estimate, the options and the run."""

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
    load: LoadRead | None = None  # what a load reads: the checkpoint, the NF4 cache after

    @property
    def options(self) -> list[Option]:
        """The options table's rows."""
        return self.found.rows

    @property
    def best(self) -> Estimate | None:
        """The fastest configuration that fits, if any does."""
        return self.found.best

    @property
    def requirements(self) -> list[str]:
        """What any configuration that fits here requires."""
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
        """LoRA parameters of the profile's targets and rank."""
        return lora_params(self.geometry, self.inputs.lora_targets, self.inputs.lora_r)

    def verdict(self) -> str:
        """One line: fits, does not fit (and by what), or not checked."""
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
            return head + (f"; tightest: {b.name}, {size(b.need)} of {size(b.limit)} usable" if b else "")
        return (
            f"DOES NOT FIT as configured ({e.setup.describe()}): {b.name} needs {size(b.need)} "
            f"of {size(b.limit)} usable"
            if b
            else "DOES NOT FIT as configured"
        )

    def to_dict(self) -> dict[str, Any]:
        """The plan as `cockpit plan --format json` prints it and `plan.json` keeps it."""
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
            "load": self.load.to_dict() if self.load else None,
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
            "nf4_cache": self.load.cache_bytes if self.load else 0,
        }


def estimate_dict(e: Estimate) -> dict[str, Any]:
    """An estimate as `plan.json` and `cockpit plan --format json` carry it."""
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


@dataclass(frozen=True)
class RunLength:
    """Optimizer steps for the profile's data and epochs, and their training time as configured."""

    steps: int
    how: str  # where the token count came from
    micro_batches: int  # a rank's micro-batches an optimizer step (gradient accumulation)
    optimizer_step_s: float | None
    train_s: float | None
    validation: ValidationTime | None = None  # the validation loss's passes, on top of `train_s`
    evaluation: EvalTime | None = None  # the held-out evaluation after training (modelled)

    @property
    def validation_s(self) -> float | None:
        """The validation passes' seconds, where known."""
        return self.validation.total_s if self.validation is not None else None

    @property
    def with_validation_s(self) -> float | None:
        """Training and the validation passes on top of it (None without a training time)."""
        return None if self.train_s is None else self.train_s + (self.validation_s or 0.0)

    def to_dict(self) -> dict[str, Any]:
        """The run's length as the plan's JSON carries it."""
        out = dict(vars(self))
        out["validation"] = self.validation.to_dict() if self.validation else None
        out["evaluation"] = self.evaluation.to_dict() if self.evaluation else None
        return out


def run_length(profile: Profile, hw: Hardware, configured: Estimate, inputs: Inputs) -> RunLength:
    """Steps from the data (`cockpit.plan.run_length`) times the configured micro-batch's step time, the
    validation passes (`cockpit.plan.validation_time`) and the evaluation after training
    (`cockpit.plan.eval_time`)."""
    from cockpit.plan.eval_time import eval_time
    from cockpit.plan.run_length import data_size, run_steps
    from cockpit.plan.validation_time import modelled_forward, validation_time

    size = data_size(profile)
    steps, how = run_steps(profile, size, hw.ranks)
    accum = profile.training.grad_accum
    step = configured.step_s * accum if configured.step_s else None
    forward = None
    if configured.compute_s is not None and configured.step_s:
        forward = modelled_forward(profile, configured.compute_s, configured.step_s)
    validation = validation_time(profile, steps, hw.ranks, configured.step_s, size, forward)
    evaluation = eval_time(profile, inputs, hw, size)
    train = steps * step if step and steps else None
    return RunLength(steps, how, accum, step, train, validation, evaluation)


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
        run=run_length(profile, hw, configured, inputs),
        load=load_read(profile, inputs.weights, base.loader, inputs.assumptions.disk_gbps),
    )
