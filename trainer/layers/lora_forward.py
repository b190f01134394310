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
"""

from __future__ import annotations

import os
from typing import Any

import torch

from trainer.fast_path import swap_forwards

# Off for the speed benchmark's control row: COCKPIT_LEAN_LORA=0 (PEFT's own forward).
ENABLED = os.environ.get("COCKPIT_LEAN_LORA", "1") != "0"


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
    h = lora_A(self.lora_dropout[adapter](self._cast_input_dtype(x, lora_A.weight.dtype)))
    return result + lora_B(h * self.scaling[adapter]).to(result.dtype)


def is_lora_linear(module: torch.nn.Module) -> bool:
    """A PEFT LoRA linear layer (plain or 4-bit bitsandbytes) of the kind `_lean_forward` stands in for."""
    from peft.tuners.lora import LoraLayer

    return isinstance(module, LoraLayer) and type(module).__name__ in ("Linear", "Linear4bit")


def install(model: torch.nn.Module) -> int:
    """Give each LoRA linear layer of `model` the lean forward; returns how many (0 when disabled)."""
    if not ENABLED:
        return 0
    return swap_forwards(model, is_lora_linear, _lean_forward)
