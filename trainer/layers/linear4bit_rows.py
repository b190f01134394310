"""bitsandbytes' 4-bit linear layers on a few rows (a decode step) through the NF4 decode kernel.

Without a gradient, bitsandbytes 0.50 multiplies up to 4 rows by its own 4-bit kernel; past that, where
its heuristic says so (on Hopper, mostly), `matmul_4bit` dequantizes the whole weight to 16 bit and
multiplies that: it writes and reads again four times the bytes of the codes, in two launches (three with
the double-quantized scales). At the story's geometry a decode step's four attention projections are 71M
weights a layer, so at batch 8 or 64 that is most of what the step reads outside the experts. Here rows
`MIN_ROWS` to `ROWS` of bf16, on a GPU, with no gradient asked for, take
`trainer.kernels.nf4_triton.nf4_grouped_mm`: the weight read as a packed expert of its own (bitsandbytes'
codes and double-quantized scales are the packed experts' layout, `trainer.nf4_pack`), one group, the
block scale on the accumulator. Everything else, and any weight whose quantization is not that layout
(FP4, single quantization, another block size), keeps bitsandbytes' forward.

The arithmetic is the experts' decode kernel's: the NF4 table rounded to bf16 times the rows, float32
accumulation, the block scale on the accumulator; bitsandbytes rounds each scaled weight to bf16 first.
Both are within bf16's rounding of the float32 product (`tests/test_linear4bit_rows.py`). Each weight
shape and tile config is probed once on its first call (outside a CUDA graph capture: a decode step runs
eagerly first) against bitsandbytes' own product, and left to bitsandbytes where they disagree.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from trainer.fast_path import FastPath, swap_forwards

# COCKPIT_NF4_LINEAR=0: bitsandbytes' own forward everywhere (the benchmarks' control).
ENABLED = os.environ.get("COCKPIT_NF4_LINEAR", "1") != "0"
# Rows the kernel takes: fewer go to bitsandbytes' own 4-bit kernel; more (the 64-row tile,
# `nf4_triton.DECODE_ACC_TALL`, past `DECODE_ACC_WIDE_ROWS`) to bitsandbytes' dequantize and matmul, which
# one H100 measured faster there: a layer's four projections at 64 rows 0.180 ms against the kernel's
# 0.196, at 8 rows 0.185 against 0.129 (benchmarks/results/projection_speed_h100.md).
MIN_ROWS, ROWS = 5, 28
# Weight rows a tile: narrower than the experts' 128, as one weight alone must give every SM tiles
# (the story's o_proj has 4,096 outputs: 64 tiles of 64).
TILE_OUTPUTS = 64
KERNEL = FastPath("NF4 linear kernel", "bitsandbytes' dequantize and matmul")
TOLERANCE = 2e-2  # the most relative difference from bitsandbytes' product a probe accepts (bf16: ~5e-3)
_PROBED: dict[tuple[Any, ...], bool] = {}  # (out, in, tile config, device) -> whether its probe passed
log = logging.getLogger(__name__)


def _packed(module: Any) -> tuple[dict[str, torch.Tensor], Any] | None:
    """The module's weight as a one-expert packed weight and its layout (made once, outside any CUDA
    graph capture: a decode step runs eagerly before it is captured), or None where its quantization is
    not the packed experts' layout."""
    state = module.weight.quant_state
    nested = state.state2 if state.nested else None
    try:
        key = (
            module.weight.data_ptr(),
            state.absmax.data_ptr(),
            None if nested is None else (nested.absmax.data_ptr(), state.offset.data_ptr()),
        )
    except AttributeError:  # a state without bitsandbytes' tensors: not ours to take
        return None
    cached = getattr(module, "_cockpit_packed", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    try:
        found = _as_packed(module, state, nested)
    except Exception:  # a quantization state of another shape than bitsandbytes' own: not ours to take
        found = None
    module._cockpit_packed = (key, found)
    return found


def _as_packed(module: Any, state: Any, nested: Any) -> tuple[dict[str, torch.Tensor], Any] | None:
    from cockpit.contract import NF4_BLOCKSIZE
    from trainer.kernels.nf4_ref import NF4_VALUES, dynamic_map
    from trainer.nf4_pack import PackedLayout

    out, inp = (int(n) for n in state.shape)
    layout = PackedLayout(1, out, inp, torch.bfloat16)
    if (
        state.quant_type == "nf4"
        and state.blocksize == NF4_BLOCKSIZE
        and nested is not None
        and out % 64 == 0
        and inp % 64 == 0
        and layout.blocks % 256 == 0
        and nested.blocksize == layout.nested
        and torch.equal(nested.code.float().cpu(), dynamic_map("cpu"))
        and torch.equal(state.code.float().cpu(), torch.tensor(NF4_VALUES))
    ):
        device = module.weight.device
        qstate = torch.cat([nested.absmax.float().reshape(-1), state.offset.float().reshape(1).to(device)])
        packed = {
            "nf4": module.weight.data.view(torch.uint8).reshape(1, -1),
            "absmax": state.absmax.view(torch.uint8).reshape(1, -1),
            "qstate": qstate.reshape(1, -1),
        }
        return packed, layout
    return None


def takes(module: Any, x: torch.Tensor) -> bool:
    """Whether the kernel takes this forward: MIN_ROWS to ROWS bf16 rows on a GPU, no gradient, a weight of
    the packed layout."""
    rows = x.numel() // max(x.shape[-1], 1)
    return (
        ENABLED
        and not KERNEL.failed
        and x.is_cuda
        and x.dtype == torch.bfloat16
        and MIN_ROWS <= rows <= ROWS
        and not (torch.is_grad_enabled() and x.requires_grad)
        and _packed(module) is not None
    )


def config_for(rows: int) -> Any:
    """The decode kernel's config for `rows` rows of one weight: the experts' tile for that many rows an
    expert (`trainer.kernels.nf4_triton`), TILE_OUTPUTS weight rows wide."""
    from dataclasses import replace

    from trainer.kernels import nf4_triton as k

    tile = k.DECODE_ACC if rows <= k.DECODE_ACC_ROWS else k.DECODE_ACC_WIDE
    return replace(tile if rows <= k.DECODE_ACC_WIDE_ROWS else k.DECODE_ACC_TALL, bn=TILE_OUTPUTS)


def rows_mm(module: Any, x: torch.Tensor) -> torch.Tensor:
    """`x @ W.T (+ bias)` by the NF4 decode kernel, one group (also the CPU under Triton's interpreter)."""
    from trainer.kernels.nf4_triton import nf4_grouped_mm

    found = _packed(module)
    if found is None:
        raise ValueError("the weight is not in the packed NF4 layout")
    packed, layout = found
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    rows = flat.shape[0]
    one = torch.zeros(1, dtype=torch.int32, device=x.device)
    offs = torch.full((1,), rows, dtype=torch.int32, device=x.device)
    out = nf4_grouped_mm(flat, packed, layout, one, offs, config=config_for(rows))
    if module.bias is not None:
        out = out + module.bias.to(out.dtype)
    return out.view(*x.shape[:-1], layout.out)


def probe(module: Any, x: torch.Tensor) -> tuple[bool, torch.Tensor]:
    """(whether the kernel's product agrees with bitsandbytes' own within TOLERANCE, the kernel's product)
    on this call: a tile config seen first on a GPU is checked once before it is trusted (a Triton tile
    can compile and still compute garbage, `trainer.kernels.nf4_triton`'s notes)."""
    got = rows_mm(module, x)
    want = type(module).forward(module, x).float()
    err = float((got.float() - want).norm() / want.norm().clamp_min(1e-30))
    return err <= TOLERANCE, got


def _trusted(module: Any, x: torch.Tensor) -> bool | None:
    """Whether this shape and tile config passed its probe (probing it now if it is new); None during a
    CUDA graph capture that meets a new one (the capture then records bitsandbytes' forward)."""
    rows = x.numel() // x.shape[-1]
    key = (module.out_features, module.in_features, config_for(rows), x.device)
    if key not in _PROBED:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return None
        checked = KERNEL.run(lambda: probe(module, x))
        _PROBED[key] = bool(checked and checked[0])
        if not _PROBED[key]:
            log.warning("NF4 linear kernel: [%d, %d] at %d rows disagrees with bitsandbytes (or failed); "
                        "bitsandbytes' forward for it", key[0], key[1], rows)  # fmt: skip
    return _PROBED[key]


def _forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    if takes(self, x) and _trusted(self, x):
        out = KERNEL.run(lambda: rows_mm(self, x))
        if out is not None:
            return out
    return type(self).forward(self, x)


def is_linear4bit(module: torch.nn.Module) -> bool:
    """A bitsandbytes `Linear4bit` (not PEFT's wrapper of one, which calls its base layer)."""
    try:
        import bitsandbytes as bnb
    except ImportError:
        return False
    return isinstance(module, bnb.nn.Linear4bit) and getattr(module.weight, "quant_state", None) is not None


def install(model: torch.nn.Module) -> int:
    """Give every bitsandbytes `Linear4bit` of `model` the few-rows forward; returns how many (0 when
    COCKPIT_NF4_LINEAR=0)."""
    return swap_forwards(model, is_linear4bit, _forward) if ENABLED else 0
