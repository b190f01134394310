"""The DeepSpeed config a profile asks for. Values HF also sets are "auto" so the two never disagree."""

from __future__ import annotations

import math
from typing import Any

from cockpit.profiles import Profile


def _offload(device: str, profile: Profile) -> dict[str, Any] | None:
    if device == "none":
        return None
    section: dict[str, Any] = {"device": device, "pin_memory": profile.hardware.gpus > 0}
    if device == "nvme":
        section["nvme_path"] = profile.deepspeed.nvme_path
    return section


def layer_elements(profile: Profile) -> int:
    """Stored elements of the model's largest decoder layer (what ZeRO-3 gathers for it), from the plan."""
    return _gathered_elements(profile)[0]


def _gathered_elements(profile: Profile) -> tuple[int, int]:
    """Stored elements of the largest decoder layer and of the lm_head, from the plan (ZeRO-3 counts
    elements of the 16-bit storage dtype)."""
    from cockpit.plan.inputs import inputs_for, resolve_geometry
    from cockpit.plan.weights import Weights

    inputs = inputs_for(profile, resolve_geometry(profile))
    weights = Weights.of(inputs.geometry, inputs.precision)
    return weights.largest_layer()[1] // 2, weights.head_bytes() // 2


# A persistence threshold above any parameter's size: every parameter stays whole.
EVERY_PARAMETER = 2**62


def single_rank_on_device(profile: Profile) -> bool:
    """One rank on a GPU with its parameters there: ZeRO-3 has nothing to partition. Its partition of a
    parameter is the whole tensor, yet each gather still costs a module hook and a device
    synchronization (a world of one "gathers" by waiting on the stream). So every parameter persists:
    the same memory, no gathers."""
    return profile.world_size == 1 and profile.hardware.gpus > 0 and profile.deepspeed.offload_param == "none"


def embeddings_kept(profile: Profile) -> bool:
    """The embedding and lm_head kept on the GPUs (`deepspeed.embeddings_on_gpu` under CPU offload)."""
    from cockpit.contract import keeps_embeddings

    ds = profile.deepspeed
    return keeps_embeddings(ds.embeddings_on_gpu, ds.stage, ds.offload_param, profile.hardware.gpus)


def deepspeed_config(profile: Profile) -> dict[str, Any]:
    """A ZeRO config with the profile's stage and offload (DeepSpeed rejects unknown keys: none added).

    `deepspeed.prefetch_layers` sizes the ZeRO-3 prefetch bucket in decoder layers, so the next layer's
    weights are fetched (copied from the host, with parameter offload) while this one computes; the
    limit on live gathered elements is raised to let them. Without
    optimizer offload the optimizer is torch's AdamW (`torch_adam`): DeepSpeed's own fused Adam would be
    compiled on first use, a minute of nvcc on every fresh machine. A single rank on a GPU without
    parameter offload persists every parameter (`single_rank_on_device`) unless the profile sets a
    threshold.
    """
    ds = profile.deepspeed
    zero: dict[str, Any] = {
        "stage": ds.stage,
        "overlap_comm": profile.hardware.gpus > 0,
        "contiguous_gradients": True,
        "reduce_bucket_size": "auto",
    }
    if ds.stage == 3:
        zero.update(
            {
                "stage3_prefetch_bucket_size": "auto",
                "stage3_param_persistence_threshold": "auto",
                "stage3_gather_16bit_weights_on_model_save": True,
            }
        )
        if ds.persistence_threshold:
            zero["stage3_param_persistence_threshold"] = ds.persistence_threshold
        elif single_rank_on_device(profile):
            zero["stage3_param_persistence_threshold"] = EVERY_PARAMETER
        if ds.prefetch_layers:
            layer, head = _gathered_elements(profile)
            zero["stage3_prefetch_bucket_size"] = int(ds.prefetch_layers * layer)
            # DeepSpeed prefetches only while the gathered elements stay under this limit (default 1e9):
            # below this layer plus the next, the next layer's copy cannot start until this one is freed.
            # Exactly those and the lm_head: what the planner counts as gathered.
            ahead = math.ceil(ds.prefetch_layers)
            # Embeddings kept on the GPU stay counted as live once gathered: the input embedding too.
            kept = head if embeddings_kept(profile) else 0
            zero["stage3_max_live_parameters"] = max(10**9, (1 + ahead) * layer + head + kept)
    for key, device in (("offload_param", ds.offload_param), ("offload_optimizer", ds.offload_optimizer)):
        section = _offload(device, profile)
        if section is not None:
            zero[key] = section
    return {
        "zero_optimization": zero,
        "bf16": {"enabled": "auto"},
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": "auto",
                "betas": "auto",
                "eps": "auto",
                "weight_decay": "auto",
                **({"torch_adam": True} if ds.offload_optimizer == "none" else {}),
            },
        },
        "gradient_clipping": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }


def zero_init_config(profile: Profile, hidden_size: int) -> dict[str, Any]:
    """The config for `deepspeed.zero.Init` at load: the training config with every "auto" resolved.

    Values are those the HF Trainer fills in later (batch sizes from the profile, bucket sizes and the
    persistence threshold from the hidden size), so the parameters partitioned at load are partitioned
    exactly as the engine would have. The optimizer section is left out: the load needs none.
    """
    config = deepspeed_config(profile)
    t = profile.training
    zero = dict(config["zero_optimization"])
    zero["reduce_bucket_size"] = hidden_size * hidden_size
    if zero.get("stage") == 3 and zero["stage3_prefetch_bucket_size"] == "auto":
        zero["stage3_prefetch_bucket_size"] = int(0.9 * hidden_size * hidden_size)
    if zero.get("stage") == 3 and zero["stage3_param_persistence_threshold"] == "auto":
        zero["stage3_param_persistence_threshold"] = 10 * hidden_size
    return {
        "zero_optimization": zero,
        "bf16": {"enabled": t.bf16},
        "train_micro_batch_size_per_gpu": t.micro_batch_size,
        "gradient_accumulation_steps": t.grad_accum,
        "train_batch_size": t.micro_batch_size * t.grad_accum * profile.world_size,
        "steps_per_print": config["steps_per_print"],
        "wall_clock_breakdown": False,
    }
