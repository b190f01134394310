"""The experts of a whole model: find the fused ones, quantize them in place, make the MoE blocks ZeRO-3
leaves, and the expert LoRA's weights (added, saved, loaded)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from trainer.layers.experts4bit import NF4Experts, is_fused_experts


def fused_experts_modules(model: nn.Module) -> Iterable[tuple[str, nn.Module, str, nn.Module]]:
    """(parent name, parent, attribute, experts module) for every fused experts module still in 16 bit."""
    for name, parent in list(model.named_modules()):
        for attr, child in list(parent.named_children()):
            if is_fused_experts(child) and not isinstance(child, NF4Experts):
                yield name, parent, attr, child


def quantize_model_experts(model: nn.Module, storage_dtype: torch.dtype) -> int:
    """Replace every fused experts module of an in-memory model by its NF4 form; returns how many."""
    count = 0
    for _name, parent, attr, experts in fused_experts_modules(model):
        new = NF4Experts.from_fused(experts, storage_dtype)
        setattr(parent, attr, new)
        del experts
        count += 1
    return count


def moe_block_classes(model: nn.Module) -> list[type]:
    """Classes of the modules that hold experts (the MoE blocks): the ZeRO-3 leaf modules."""
    classes: list[type] = []
    for module in model.modules():
        for child in module.children():
            if (isinstance(child, NF4Experts) or is_fused_experts(child)) and type(module) not in classes:
                classes.append(type(module))
    return classes


def set_moe_leaf_modules(model: nn.Module) -> list[str]:
    """Make every MoE block a ZeRO-3 leaf: all its parameters are gathered on entry, whatever the routing.

    Without it ZeRO-3 fetches parameters module by module as they run, and a rank whose tokens miss an
    expert would skip a collective the other ranks wait on (DeepSpeed#5066).
    """
    classes = moe_block_classes(model)
    if classes:
        from deepspeed.utils import set_z3_leaf_modules

        set_z3_leaf_modules(model, classes)
    return [c.__name__ for c in classes]


def add_expert_lora(model: nn.Module, r: int, alpha: float, dropout: float) -> int:
    """LoRA on every NF4 experts module; returns the number of trainable parameters added."""
    added = 0
    for module in model.modules():
        if isinstance(module, NF4Experts):
            module.add_lora(r, alpha, dropout)
            added += sum(p.numel() for p in module.lora_parameters().values())
    return added


def expert_lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The expert LoRA weights by parameter name (call with ZeRO-3 parameters gathered)."""
    return {
        name: param.detach().cpu().clone()
        for name, param in model.named_parameters()
        if ".experts.lora_" in name or name.startswith("experts.lora_")
    }


def load_expert_lora(model: nn.Module, path: str, dropout: float = 0.0) -> int:
    """Add expert LoRA to `model` (a PEFT model on an NF4-experts base) and load it from `path`.

    The file is the `expert_lora.safetensors` the trainer writes beside the PEFT adapter; its metadata
    holds r and alpha. Returns the number of tensors loaded.
    """
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    add_expert_lora(model, int(meta["r"]), float(meta["alpha"]), dropout)
    params = dict(model.named_parameters())
    missing = [k for k in state if k not in params]
    if missing:
        raise KeyError(f"{path}: no parameter for {missing[:3]}")
    with torch.no_grad():
        for name, tensor in state.items():
            params[name].copy_(tensor)
    return len(state)
