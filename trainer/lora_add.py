"""PEFT's LoRA forward on the 4-bit projections with the adapter's output scaled and added in one kernel.

PEFT's `Linear4bit.forward` clones the base layer's output ("defensively", for in-place adds on a view
that no longer happen), multiplies the adapter's output by its scaling, then adds: three passes over an
[tokens, out] tensor, 2.9 ms of the story's 128 ms further layer on an H200 (`top_ops_s` of the
`now-8L-prof` row in `benchmarks/step_speed.py`). Here the sum is `torch.add(result, lora, alpha=s)`:
one pass, out of place (nothing is modified, so nothing needs the clone), fp32 inside and one rounding
where PEFT rounded the scaled term first. Dropout and the two adapter matrices are PEFT's own modules,
called as PEFT calls them, so ZeRO-3's hooks gather and release them as before.

Only the plain case takes this path: one active vanilla adapter, not merged, not disabled, no mixed
batch or variant arguments, no autocast, the adapter in the input's dtype. Everything else is PEFT's.
`COCKPIT_LORA_ADD=0` leaves PEFT's forward everywhere (the speed benchmark's control row).
"""

from __future__ import annotations

import os
import types
from typing import Any

import torch

ENABLED = os.environ.get("COCKPIT_LORA_ADD", "1") != "0"


def _plain_adapter(module: Any, x: torch.Tensor, kwargs: dict[str, Any]) -> str | None:
    """The one adapter the plain path serves for this call, or None (PEFT's forward then)."""
    if module.disable_adapters or module.merged or kwargs or torch.is_autocast_enabled():
        return None
    active = [name for name in module.active_adapters if name in module.lora_A]
    if len(active) != 1 or active[0] in getattr(module, "lora_variant", {}):
        return None
    name = active[0]
    if module.lora_A[name].weight.dtype != x.dtype:
        return None
    return name


def forward(module: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """`base(x) + scaling * B(A(dropout(x)))`, the sum in one kernel; PEFT's forward where not plain."""
    name = _plain_adapter(module, x, kwargs)
    if name is None or args:
        return type(module).forward(module, x, *args, **kwargs)
    module._check_forward_args(x)
    result = module.base_layer(x)
    lora = module.lora_B[name](module.lora_A[name](module.lora_dropout[name](x)))
    if lora.dtype != result.dtype:  # a base layer computing in another dtype: PEFT's order of roundings
        return result + (lora * module.scaling[name]).to(result.dtype)
    return torch.add(result, lora, alpha=module.scaling[name])


def install(model: torch.nn.Module) -> int:
    """Give every 4-bit LoRA projection of `model` this forward; how many took it (0 where off)."""
    if not ENABLED:
        return 0
    try:
        from peft.tuners.lora.bnb import Linear4bit
    except ImportError:  # PEFT without bitsandbytes support: nothing 4-bit to serve
        return 0
    count = 0
    for module in model.modules():
        if type(module) is Linear4bit:
            module.forward = types.MethodType(forward, module)
            count += 1
    return count
