"""Pure-torch reference of the packed NF4 experts' arithmetic (the Triton kernels must match it).

The layout is `trainer.nf4_pack.PackedLayout`'s. Per expert e, the logical weight W_e [out, in] is flat
row-major; element i has the 4-bit code in byte i // 2 of `nf4[e]` (the high nibble for even i, as
bitsandbytes packs) and the scale of block b = i // 64:

    scale[e, b] = code2[absmax[e, b]] * qstate[e, b // nested] + qstate[e, -1]
    W_e[i]      = NF4[code[e, i]] * scale[e, i // 64]      (float32, then rounded to the compute dtype)

where NF4 is bitsandbytes' 16-value table and code2 its signed dynamic 8-bit map (the default code of
`quantize_blockwise`). Nothing here imports bitsandbytes or Triton.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from trainer.nf4_pack import PackedLayout

# bitsandbytes' NF4 table (`get_4bit_type("nf4")`), float32.
NF4_VALUES = (
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
)


@cache
def _dynamic_map_cpu() -> torch.Tensor:
    """bitsandbytes' `create_dynamic_map(signed=True)` (8 bits, up to 7 exponent bits), recomputed."""
    data: list[float] = []
    max_exp, non_sign = 7, 7
    for i in range(max_exp):
        items = 2 ** (i + non_sign - max_exp) + 1
        bounds = torch.linspace(0.1, 1, items, dtype=torch.float32)
        means = (bounds[:-1] + bounds[1:]) / 2.0
        data += ((10 ** (-(max_exp - 1) + i)) * means).tolist()
        data += (-(10 ** (-(max_exp - 1) + i)) * means).tolist()
    data += [0.0, 1.0]
    data += [0.0] * (256 - len(data))
    data.sort()
    return torch.tensor(data, dtype=torch.float32)


_tables: dict[tuple[str, torch.device], torch.Tensor] = {}


def nf4_table(device: torch.device | str) -> torch.Tensor:
    """The 16 NF4 values, float32, on `device` (cached)."""
    key = ("nf4", torch.device(device))
    if key not in _tables:
        _tables[key] = torch.tensor(NF4_VALUES, dtype=torch.float32, device=device)
    return _tables[key]


def dynamic_map(device: torch.device | str) -> torch.Tensor:
    """The 256-value map of the double-quantized scales, float32, on `device` (cached)."""
    key = ("dynamic", torch.device(device))
    if key not in _tables:
        _tables[key] = _dynamic_map_cpu().to(device)
    return _tables[key]


def _index(experts: int | list[int] | torch.Tensor) -> list[int] | torch.Tensor:
    return [experts] if isinstance(experts, int) else experts


def nf4_scales(
    packed: dict[str, torch.Tensor], layout: PackedLayout, experts: int | list[int] | torch.Tensor
) -> torch.Tensor:
    """Float32 block scales [k, blocks] of the selected experts (double quantization undone)."""
    index = _index(experts)
    qscales = packed["absmax"].view(torch.uint8)[index]
    qstate = packed["qstate"].view(torch.float32)[index]
    k, nested = qscales.shape[0], layout.nested
    code2 = dynamic_map(qscales.device)
    scales = code2[qscales.long()].view(k, layout.blocks // nested, nested) * qstate[:, :-1, None]
    return scales.view(k, layout.blocks) + qstate[:, -1:]


def nf4_dequantize_ref(
    packed: dict[str, torch.Tensor],
    layout: PackedLayout,
    experts: int | list[int] | torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The [k, out, in] weights (or [out, in] for one int) of the selected experts, in `dtype`."""
    index = _index(experts)
    codes = packed["nf4"].view(torch.uint8)[index]
    k = codes.shape[0]
    nibbles = torch.stack((codes >> 4, codes & 15), dim=-1).view(k, layout.blocks, 64)
    values = nf4_table(codes.device)[nibbles.long()] * nf4_scales(packed, layout, index)[:, :, None]
    weights = values.view(k, layout.out, layout.inp).to(dtype)
    return weights[0] if isinstance(experts, int) else weights


def nf4_grouped_mm_ref(
    x: torch.Tensor,
    packed: dict[str, torch.Tensor],
    layout: PackedLayout,
    expert_ids: torch.Tensor,
    offs: torch.Tensor,
    trans: bool = False,
) -> torch.Tensor:
    """What `nf4_grouped_mm` computes, in float32, rounded to x's dtype.

    Rows of x are sorted by group: group g is rows [offs[g-1], offs[g]) (offs[-1] = 0), multiplied by
    expert expert_ids[g]'s weight W [out, in]: `x @ W.T` ([m, in] -> [m, out]), or with `trans`
    `x @ W` ([m, out] -> [m, in], the input gradient of the first). Rows from offs[-1] on are zero.
    """
    n_out = layout.inp if trans else layout.out
    out = torch.zeros(x.shape[0], n_out, dtype=torch.float32, device=x.device)
    start = 0
    for e, end in zip(expert_ids.tolist(), offs.tolist(), strict=True):
        if end > start:
            w = nf4_dequantize_ref(packed, layout, int(e), torch.float32)
            out[start:end] = x[start:end].float() @ (w if trans else w.t())
        start = end
    return out.to(x.dtype)
