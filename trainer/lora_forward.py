"""PEFT's LoRA forward on the attention projections, without its passes over the projection's output.

PEFT's 4-bit LoRA layer computes `base(x).clone() + lora_B(lora_A(dropout(x))) * scaling`: besides the
base product it clones the base output, scales the adapter's output and adds, each a pass over a
[tokens, out_features] tensor (8,192 wide for the query projection), in forward, in recompute and (the
scale) in backward. Here the scale multiplies the adapter's rank-wide activation instead (16 wide),
before `lora_B`, and the sum is one out-of-place add: no clone (nothing modifies the base output in
place). `lora_B(h * s) == lora_B(h) * s` by linearity; with a power-of-two scale (alpha / r = 2, the
default) the two round identically, otherwise they differ by the output's rounding.

Only the plain case takes this path: one active vanilla adapter (no DoRA or other variant), not merged
or disabled, called with the input alone (no per-row adapter names), autocast off. Everything else runs
PEFT's own forward. The modules are still called (`lora_A`, `lora_B`, the dropout), so ZeRO-3's hooks
gather their weights as before, and the dropout draws as PEFT's does.

On a GPU, an active dropout and `lora_A` are one Triton kernel each way instead
(`trainer.kernels.dropout_linear`): `lora_A` is called with the input and the dropout's probability, so
ZeRO-3 still gathers its weight, and draws the mask inside its product; the dropped input is neither
written nor saved. The mask is another draw than torch's dropout, with the same probability.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.nn import functional as F

from trainer.fast_path import FastPath, swap_forwards

# Off for the speed benchmark's control rows: COCKPIT_LEAN_LORA=0 (PEFT's own forward),
# COCKPIT_DROPOUT_KERNEL=0 (torch's dropout, then lora_A).
ENABLED = os.environ.get("COCKPIT_LEAN_LORA", "1") != "0"
DROPOUT_KERNEL = os.environ.get("COCKPIT_DROPOUT_KERNEL", "1") != "0"
KERNEL = FastPath("dropout + LoRA A kernel", "torch's dropout, then lora_A")


def _plain(layer: Any) -> str | None:
    """The one vanilla adapter a call with no further arguments runs, or None where PEFT's must run."""
    if layer.disable_adapters or layer.merged:
        return None
    active = [a for a in layer.active_adapters if a in layer.lora_A]
    if len(active) != 1 or active[0] in getattr(layer, "lora_variant", {}):
        return None
    return active[0]


def _lean_forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    adapter = None if args or kwargs or torch.is_autocast_enabled() else _plain(self)
    if adapter is None:
        return type(self).forward(self, x, *args, **kwargs)
    result = self.base_layer(x)
    lora_A, lora_B = self.lora_A[adapter], self.lora_B[adapter]
    x = self._cast_input_dtype(x, lora_A.weight.dtype)
    p = _fused_p(self.lora_dropout[adapter], lora_A, x)
    h = lora_A(x, p) if p else lora_A(self.lora_dropout[adapter](x))
    return result + lora_B(h * self.scaling[adapter]).to(result.dtype)


def _fused_p(dropout: torch.nn.Module, lora_A: torch.nn.Module, x: torch.Tensor) -> float:
    """The dropout's probability where `lora_A` draws it in its kernel (an active dropout, a GPU), else 0."""
    active = isinstance(dropout, torch.nn.Dropout) and dropout.training and dropout.p > 0
    fused = getattr(lora_A, "cockpit_dropout_kernel", False) and not KERNEL.failed
    return float(dropout.p) if active and fused and kernel_device(x) else 0.0


def kernel_device(x: torch.Tensor) -> bool:
    """Whether the dropout kernel is tried for x: on a GPU (the tests also try it on the CPU, interpreted)."""
    return x.is_cuda


def _lora_a_forward(self: torch.nn.Module, x: torch.Tensor, p: float = 0.0) -> torch.Tensor:
    """`lora_A`'s forward: with the input alone (as PEFT calls it) a plain linear; with a dropout
    probability, the dropout and the product in one kernel where it takes them, else one after the other."""
    if p:
        from trainer.kernels import dropout_linear  # Triton: imported where the kernel is tried

        if self.bias is None and dropout_linear.fits(x, self.weight, p) and _probed(x):
            return dropout_linear.dropout_linear(x, self.weight, p)
        x = F.dropout(x, p, training=True)
    return F.linear(x, self.weight, self.bias)


_PROBED: dict[tuple[torch.device, torch.dtype], bool] = {}


def _probed(x: torch.Tensor) -> bool:
    """Whether the dropout kernels ran, both ways, on x's device and dtype: tried once, on a small problem,
    before any real call. A kernel that fails only in a real call raises: its forward would have drawn its
    mask from the generator, and a fallback (or checkpointing's recompute) would draw another."""
    from trainer.kernels import dropout_linear

    key = (x.device, x.dtype)
    if key not in _PROBED:
        _PROBED[key] = KERNEL.run(lambda: dropout_linear.probe(x.device, x.dtype) or True) is not None
    return _PROBED[key]


def is_lora_linear(module: torch.nn.Module) -> bool:
    """A PEFT LoRA linear layer (plain or 4-bit bitsandbytes) of the kind `_lean_forward` stands in for."""
    from peft.tuners.lora import LoraLayer

    return isinstance(module, LoraLayer) and type(module).__name__ in ("Linear", "Linear4bit")


def _is_lora_a(module: torch.nn.Module) -> bool:
    return type(module) is torch.nn.Linear and getattr(module, "cockpit_dropout_kernel", False)


def install(model: torch.nn.Module) -> int:
    """Give each LoRA linear layer of `model` the lean forward, and its `lora_A` the dropout kernel where
    enabled; returns how many layers (0 when disabled)."""
    if not ENABLED:
        return 0
    if DROPOUT_KERNEL:
        for module in model.modules():
            if is_lora_linear(module):
                for lora_A in module.lora_A.values():
                    lora_A.cockpit_dropout_kernel = True
        swap_forwards(model, _is_lora_a, _lora_a_forward)
    return swap_forwards(model, is_lora_linear, _lean_forward)
