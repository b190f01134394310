"""An experiment that lost, kept so `benchmarks/nf4_split.py` can reproduce it: the forward NF4 grouped
GEMM with the nibbles kept apart (`x @ W.T` per group, `trainer.kernels.nf4_triton.nf4_grouped_mm`'s
contract with `trans=False`). The trainer does not use it.

Measured on an H200 (`benchmarks/results/nf4_split_h200.md`): 27% fewer instructions in its K loop than
the interleaving kernel, yet the same time at decoding shapes (Nsight Compute: its warps then wait on
the MMA and barriers instead of the integer pipe) and 30-60% slower at training shapes.

A packed byte holds W[n, 2j] (high nibble) and W[n, 2j+1] (low nibble). `nf4_triton` decodes both and
interleaves them back into a [BN, BK] tile; here the high values and the low values stay two [BN, 32]
tiles a 64-element block, multiplied by x's even and odd columns: `W x = W_hi x_even + W_lo x_odd`. With
no interleave the tile goes from the load to the MMA's register operand with elementwise steps only,
and on the GPU one PTX routine turns 4 bytes into the bf16 pairs the MMA takes (`_SPLIT_ASM`).

The block scale is applied either to the weights (bf16 scale times bf16 value, `late=False`) or, for
decoding's few rows, to the partial product of each 64-block in float32 (`late=True`: exact scales, a
[BN, BM] multiply-add a block, which is small when BM is). The persistent tile walk is `nf4_triton`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from trainer.kernels.nf4_ref import dynamic_map, nf4_table
from trainer.kernels.nf4_tiles import (
    PRMT,
    block_scales,
    decode_for,
    nf4_lookup,
    num_sms,
    packed_views,
    prmt_asm,
    tile_group,
    tile_rows,
)

if TYPE_CHECKING:
    from trainer.nf4_pack import PackedLayout


# 4 packed bytes -> 2 registers of high-nibble values and 2 of low-nibble values, bf16 pairs in byte order
# (`[v(b0) | v(b1) << 16]`, `[v(b2) | v(b3) << 16]`): from a half's l/h, high = [l1 h1 l3 h3], low = [l0 h0
# l2 h2]; outputs 0-1 the high pairs, 2-3 the low.
_SPLIT_ASM = tl.constexpr(
    prmt_asm("prmt.b32 ${o0}, l, h, 0x7351; prmt.b32 ${o1}, l, h, 0x6240; ", ((0, 2), (1, 3)))
)


@triton.jit
def _split_values(packed, lut_ptr, dtype: tl.constexpr, DECODE: tl.constexpr):
    """(values of the high nibbles, of the low nibbles) of every packed byte, in `dtype`."""
    if DECODE == 2:
        return tl.inline_asm_elementwise(
            _SPLIT_ASM, "=r,=r,=r,=r,r", [packed], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4
        )
    return nf4_lookup(packed >> 4, lut_ptr, DECODE).to(dtype), nf4_lookup(packed & 15, lut_ptr, DECODE).to(
        dtype
    )


@triton.jit
def _nf4_split_mm_kernel(
    x_ptr,
    out_ptr,
    codes_ptr,
    qscale_ptr,
    qstate_ptr,
    code2_ptr,
    lut_ptr,
    offs_ptr,
    eids_ptr,
    scale_ptr,
    M,
    G,
    NUM_PROGS,
    s_xm,
    s_om,
    s_codes,
    s_qscale,
    s_qstate,
    s_scale,
    N: tl.constexpr,
    K: tl.constexpr,
    QOFF: tl.constexpr,
    NESTED: tl.constexpr,
    LATE: tl.constexpr,
    FLAT: tl.constexpr,
    DECODE: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GP: tl.constexpr,
):
    dtype = x_ptr.dtype.element_ty
    n_tiles = N // BN
    total, starts, ends, tiles, cum = tile_rows(offs_ptr, M, G, BM, GP, n_tiles)
    j = tl.arange(0, 32)
    tile = tl.program_id(0)
    while tile < total:  # the tail group (e = -1) multiplies zeros, so its rows come out zero
        nt = tile % n_tiles
        row0, row_end, e = tile_group(tile // n_tiles, starts, ends, tiles, cum, eids_ptr, G, BM, GP)
        rows = row0 + tl.arange(0, BM)
        amask = (rows < row_end) & (e >= 0)
        e = tl.maximum(e, 0)
        r = nt * BN + tl.arange(0, BN)
        w_ptrs = codes_ptr + e * s_codes + r[:, None] * (K // 2) + j[None, :]
        blk = r * (K // 64)
        x_ptrs = x_ptr + rows[:, None] * s_xm + tl.arange(0, 64)[None, :]
        acc = tl.zeros((BN, BM), dtype=tl.float32)
        for k0 in range(0, K, BK):
            for b in tl.static_range(BK // 64):
                kb = k0 + b * 64
                x = tl.load(x_ptrs + kb, mask=amask[:, None], other=0.0)
                x_even, x_odd = tl.split(tl.reshape(x, (BM, 32, 2)))
                high, low = _split_values(tl.load(w_ptrs + kb // 2), lut_ptr, dtype, DECODE)
                if FLAT:  # float32 scales computed beforehand: no load that waits on another
                    s = tl.load(scale_ptr + e * s_scale + blk + kb // 64)
                else:
                    blocks = blk + kb // 64
                    s = block_scales(
                        blocks, e, qscale_ptr, qstate_ptr, code2_ptr, s_qscale, s_qstate, NESTED, QOFF
                    )
                if LATE:
                    part = tl.dot(high, tl.trans(x_even))
                    part = tl.dot(low, tl.trans(x_odd), part)
                    acc += part * s[:, None]
                else:
                    sd = s.to(dtype)[:, None]
                    acc = tl.dot(high * sd, tl.trans(x_even), acc)
                    acc = tl.dot(low * sd, tl.trans(x_odd), acc)
        cols = nt * BN + tl.arange(0, BN)
        out = tl.trans(acc).to(dtype)
        tl.store(out_ptr + rows[:, None] * s_om + cols[None, :], out, mask=(rows < row_end)[:, None])
        tile += NUM_PROGS


@dataclass(frozen=True)
class SplitConfig:
    """Block sizes (BM tokens x BN outputs, BK deep: a multiple of 64), warps, stages, scale placement."""

    bm: int = 16
    bn: int = 128
    bk: int = 128
    warps: int = 4
    stages: int = 4
    late: bool = True  # the block scale on each 64-block's float32 partial product, not on the weights
    decode: int = PRMT
    programs_per_sm: int = 2


DECODE_SPLIT = SplitConfig()


def nf4_split_mm(
    x: torch.Tensor,
    packed: dict[str, torch.Tensor],
    layout: PackedLayout,
    expert_ids: torch.Tensor,
    offs: torch.Tensor,
    config: SplitConfig | None = None,
    out: torch.Tensor | None = None,
    scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x @ W.T` per group ([M, in] -> [M, out]); `nf4_triton.nf4_grouped_mm`'s contract, forward only.

    `scales`: every expert's block scales in float32 ([experts, blocks], `nf4_ref.nf4_scales`), read
    instead of undoing the double quantization in the K loop."""
    cfg = config or DECODE_SPLIT
    k_dim, n_dim = layout.inp, layout.out
    if x.dim() != 2 or x.shape[1] != k_dim or x.stride(1) != 1:
        raise ValueError(f"x must be [M, {k_dim}] with contiguous rows, got {tuple(x.shape)}")
    if k_dim % cfg.bk or n_dim % cfg.bn or cfg.bk % 64:
        raise ValueError(f"weight [{n_dim}, {k_dim}] does not tile by {cfg.bn} x {cfg.bk}")
    m, g = x.shape[0], offs.shape[0]
    if out is None:
        out = torch.empty(m, n_dim, dtype=x.dtype, device=x.device)
    if out.shape != (m, n_dim) or out.stride(1) != 1:
        raise ValueError(f"out must be [{m}, {n_dim}] with contiguous rows, got {tuple(out.shape)}")
    if m == 0:
        return out
    codes, qscale, qstate = packed_views(packed)
    offs = offs.to(device=x.device, dtype=torch.int32)
    expert_ids = expert_ids.to(device=x.device, dtype=torch.int32)
    bound = (triton.cdiv(m, cfg.bm) + g) * (n_dim // cfg.bn)
    programs = max(1, min(bound, num_sms(x.device) * cfg.programs_per_sm))
    _nf4_split_mm_kernel[(programs,)](
        x, out, codes, qscale, qstate, dynamic_map(x.device), nf4_table(x.device), offs, expert_ids,
        qstate if scales is None else scales, m, g, programs, x.stride(0), out.stride(0), codes.stride(0),
        qscale.stride(0), qstate.stride(0), 0 if scales is None else scales.stride(0),
        N=n_dim, K=k_dim, QOFF=layout.blocks // layout.nested, NESTED=layout.nested, LATE=cfg.late,
        FLAT=scales is not None,
        DECODE=decode_for(cfg.decode, x.device), BM=cfg.bm, BN=cfg.bn, BK=cfg.bk,
        GP=triton.next_power_of_2(g + 1), num_warps=cfg.warps, num_stages=cfg.stages,
    )  # fmt: skip
    return out


__all__ = ["DECODE_SPLIT", "SplitConfig", "nf4_split_mm"]
