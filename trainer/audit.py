"""The audit: what the profile asked for next to what was actually applied after load.

Transformers can drop a memory-saving setting without a word (a quantized model skips ZeRO-3
partitioning at load; bitsandbytes leaves fused MoE experts in 16 bit). Each such gap becomes a
warning with the memory it costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cockpit.profiles import Profile
from cockpit.units import size

# A group this large that is not in 4 bit when 4 bit was asked for is worth a warning.
LARGE_GROUP_FRACTION = 0.05
# QLoRA keeps these in 16 bit by design: bitsandbytes never quantizes them.
KEPT_16BIT = ("lora", "norms", "router", "embeddings", "lm_head")


@dataclass(frozen=True)
class EngineFacts:
    """What the DeepSpeed engine reports once it is built (absent fields: no engine)."""

    zero_stage: int | None
    offload_param: str | None
    offload_optimizer: str | None
    params_partitioned: bool


def _bytes_16bit_vs_4bit(params: int) -> float:
    """Extra bytes of keeping `params` in 16 bit instead of NF4 (0.5 byte plus about 1/64 for scales)."""
    return params * (2.0 - 0.5 - 1 / 64)


def build_audit(
    profile: Profile,
    census: dict[str, dict[str, int]],
    lora_counts: dict[str, int],
    engine: EngineFacts,
    partitioned_at_load: bool,
    gradient_checkpointing: bool,
) -> dict[str, Any]:
    """The audit event's fields: requested, applied, and warnings for every setting that was dropped."""
    total = sum(g["params"] for name, g in census.items() if name != "lora")
    in_4bit = sum(g["params_4bit"] for g in census.values())
    # bitsandbytes never quantizes embeddings or the head: on a small vocabulary model they weigh a lot.
    body = total - sum(census[name]["params"] for name in ("embeddings", "lm_head") if name in census)
    trainable = sum(g["trainable"] for g in census.values())
    warnings: list[str] = []
    q = profile.quantization
    if q.load_in_4bit:
        for name, g in sorted(census.items()):
            left = g["params"] - g["params_4bit"]
            if name in KEPT_16BIT or left <= LARGE_GROUP_FRACTION * total:
                continue
            warnings.append(
                f"{name}: {left / 1e6:,.1f} M parameters are not in 4 bit "
                f"(+{size(_bytes_16bit_vs_4bit(left))} in 16 bit against NF4)"
            )
    unmatched = [t for t, n in lora_counts.items() if n == 0]
    if unmatched:
        warnings.append(f"LoRA targets matched no module: {', '.join(unmatched)}")
    ds = profile.deepspeed
    if engine.zero_stage is not None and engine.zero_stage != ds.stage:
        warnings.append(f"ZeRO stage {ds.stage} asked, {engine.zero_stage} in effect")
    if engine.offload_param is not None and engine.offload_param != ds.offload_param:
        warnings.append(f"parameter offload '{ds.offload_param}' asked, '{engine.offload_param}' in effect")
    if engine.offload_optimizer is not None and engine.offload_optimizer != ds.offload_optimizer:
        warnings.append(
            f"optimizer offload '{ds.offload_optimizer}' asked, '{engine.offload_optimizer}' in effect"
        )
    if ds.stage == 3 and not partitioned_at_load:
        warnings.append(
            "ZeRO-3 did not partition at load (Transformers skips zero.Init for quantized models): "
            f"each of {profile.world_size} rank(s) held the whole model in host RAM before partitioning"
        )
    if profile.training.gradient_checkpointing and not gradient_checkpointing:
        warnings.append("gradient checkpointing asked, not in effect")
    return {
        "params_total": total,
        "params_4bit": in_4bit,
        "fraction_4bit": in_4bit / total if total else 0.0,
        "fraction_4bit_body": in_4bit / body if body else 0.0,
        "params_trainable": trainable,
        "groups": census,
        "lora_targets": lora_counts,
        "requested": {
            "load_in_4bit": q.load_in_4bit,
            "quant_type": q.quant_type,
            "double_quant": q.double_quant,
            "zero_stage": ds.stage,
            "offload_param": ds.offload_param,
            "offload_optimizer": ds.offload_optimizer,
            "gradient_checkpointing": profile.training.gradient_checkpointing,
        },
        "applied": {
            "zero_stage": engine.zero_stage,
            "offload_param": engine.offload_param,
            "offload_optimizer": engine.offload_optimizer,
            "params_partitioned": engine.params_partitioned,
            "partitioned_at_load": partitioned_at_load,
            "gradient_checkpointing": gradient_checkpointing,
        },
        "warnings": warnings,
    }
