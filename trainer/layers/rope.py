"""The model family's `apply_rotary_pos_emb` replaced by one that runs the fused kernel on a GPU.

Transformers' attention modules call their modeling file's `apply_rotary_pos_emb(q, k, cos, sin)` by
name, so `install` swaps that name in the file of the model's attention class (once; idempotent). The
replacement takes `trainer.kernels.rope` for bf16/fp16 CUDA tensors in the usual layout and falls back
to the original everywhere else (the CPU, another layout, a kernel that fails here: then for good).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from trainer.fast_path import FastPath

# Off for the speed benchmark's control row: COCKPIT_FUSED_ROPE=0 (Transformers' own).
ENABLED = os.environ.get("COCKPIT_FUSED_ROPE", "1") != "0"
KERNEL = FastPath("fused RoPE", "Transformers' own")


def fusable(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, unsqueeze_dim: int) -> bool:
    """Whether the kernel takes this call: CUDA bf16/fp16 [B, H, T, D] q and k, [B, T, D] cos, D a power
    of two, nothing asking for the gradient of cos."""
    d = q.shape[-1] if q.dim() == 4 else 0
    return (
        not KERNEL.failed
        and unsqueeze_dim == 1
        and q.is_cuda
        and q.dtype in (torch.bfloat16, torch.float16)
        and k.dtype == q.dtype
        and q.dim() == k.dim() == 4
        and cos.dim() == 3
        and d >= 16
        and d & (d - 1) == 0
        and not cos.requires_grad
    )


def _rotate(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    from trainer.kernels import rope  # Triton: imported where the kernel is tried

    return rope.rotate(q, cos, sin), rope.rotate(k, cos, sin)


def _fused(original: Callable[..., Any]) -> Callable[..., Any]:
    def apply_rotary_pos_emb(
        q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if fusable(q, k, cos, unsqueeze_dim):
            pair = KERNEL.run(lambda: _rotate(q, k, cos, sin))
            if pair is not None:
                return pair
        return original(q, k, cos, sin, unsqueeze_dim)

    apply_rotary_pos_emb.cockpit_original = original  # type: ignore[attr-defined]
    return apply_rotary_pos_emb


def _modeling(model: torch.nn.Module) -> Any:
    """The modeling file of `model`'s attention (where `apply_rotary_pos_emb` lives), or None."""
    attention = next((m for m in model.modules() if type(m).__name__.endswith("Attention")), None)
    return None if attention is None else sys.modules.get(type(attention).__module__)


def install(model: torch.nn.Module) -> bool:
    """Swap `apply_rotary_pos_emb` in the modeling file of `model`'s attention; whether it is in place."""
    if not ENABLED:
        return False
    modeling = _modeling(model)
    current = getattr(modeling, "apply_rotary_pos_emb", None)
    if current is None or not callable(current):
        return False
    if not hasattr(current, "cockpit_original"):
        modeling.apply_rotary_pos_emb = _fused(current)
    return True


def uninstall(model: torch.nn.Module) -> bool:
    """Put Transformers' own `apply_rotary_pos_emb` back (a benchmark's control); whether it was swapped."""
    modeling = _modeling(model)
    current = getattr(modeling, "apply_rotary_pos_emb", None)
    if not hasattr(current, "cockpit_original"):
        return False
    modeling.apply_rotary_pos_emb = current.cockpit_original
    return True
