"""Transformers' RMSNorm modules run as one fused kernel (`torch.nn.functional.rms_norm`).

Qwen3's RMSNorm is six eager kernels (cast to fp32, square, mean, rsqrt, multiply, cast back) and as
many again in its backward, each a pass over the activations; a layer has four (input, post-attention,
query and key norms), run in forward, recompute and backward. `F.rms_norm` is one kernel each way on
the GPU (fp32 statistics, like Transformers'), and the same arithmetic on the CPU. The only difference:
the weight multiplies the normalized fp32 value before the cast to the input's dtype, not after.

On a GPU the query and key norms (a row a head, 128 wide) are `trainer.kernels.rms_norm` where it runs:
the same arithmetic, a tile of rows a program rather than torch's block a row: at the story's shapes
2.3 times as fast forward and 3.3 times backward; the hidden state's norms (4,096 wide) stay torch's,
which is faster on wide rows (`benchmarks/results/norm_speed_h200.md`).
"""

from __future__ import annotations

import os

import torch
from torch.nn import functional as F

from trainer.fast_path import FastPath, swap_forwards

# Off for the speed benchmark's control rows: COCKPIT_FUSED_NORM=0 (Transformers' eager norm),
# COCKPIT_NORM_KERNEL=0 (torch's fused kernel on the GPU, not the Triton one).
ENABLED = os.environ.get("COCKPIT_FUSED_NORM", "1") != "0"
TRITON = os.environ.get("COCKPIT_NORM_KERNEL", "1") != "0"
KERNEL = FastPath("RMSNorm kernel", "torch's rms_norm")


def _triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    from trainer.kernels import rms_norm  # Triton: imported where the kernel is tried

    return rms_norm.rms_norm(x, weight, eps) if rms_norm.pays(x, weight) else None


def _fused_forward(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    if TRITON and hidden_states.is_cuda:
        out = KERNEL.run(lambda: _triton(hidden_states, self.weight, self.variance_epsilon))
        if out is not None:
            return out
    return F.rms_norm(hidden_states, (hidden_states.shape[-1],), self.weight, self.variance_epsilon)


def is_rms_norm(module: torch.nn.Module) -> bool:
    """A Transformers RMSNorm with a weight the size of its last dimension and `variance_epsilon`."""
    return (
        type(module).__name__.endswith("RMSNorm")
        and isinstance(getattr(module, "weight", None), torch.Tensor)
        and isinstance(getattr(module, "variance_epsilon", None), float)
    )


def fuse_rms_norms(model: torch.nn.Module) -> int:
    """Give every RMSNorm of `model` the fused forward; returns how many (0 when disabled)."""
    if not ENABLED:
        return 0
    return swap_forwards(model, is_rms_norm, _fused_forward)
