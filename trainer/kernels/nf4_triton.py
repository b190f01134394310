"""Triton kernels on packed NF4 experts (`trainer.nf4_pack.PackedLayout`), no host sync.

`nf4_grouped_mm`: rows of x sorted by expert, each group times its expert's weight, NF4 dequantized
inside the GEMM's K loop (fp32 accumulation, output in x's dtype). One persistent launch: every program
reads the group offsets from the device, counts the m-tiles of every group itself and walks the tiles
(m-tile, n-tile) pid, pid + programs, ...; the host only needs M, the number of groups and the shapes.
`nf4_dequantize`: the weights of the selected experts in one launch.

Codes become NF4 values by a gather from the 16-entry table, a select tree, or (the GPU default) PTX
byte permutes on the packed bytes, 8 codes a 32-bit word with no memory access; that last one rounds
the table to bf16 before the scale multiplies it (relative error 2.7e-3 against 2.3e-3 for the exact
table, bf16 operands, on the story's shapes). Otherwise the arithmetic is `trainer.kernels.nf4_ref`'s
(tests check the kernels under TRITON_INTERPRET=1 on the CPU, where the permutes run as the tree).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from trainer.kernels.device import on_device
from trainer.kernels.nf4_decode import decode_mm
from trainer.kernels.nf4_ref import dynamic_map, nf4_table
from trainer.kernels.nf4_tiles import (
    GATHER,
    PRMT,
    TREE,
    block_scales,
    decode_for,
    decode_pairs,
    num_sms,
    packed_views,
    tile_group,
    tile_rows,
)

if TYPE_CHECKING:
    from trainer.nf4_pack import PackedLayout


@triton.jit
def _w_tile(
    e,
    r0,
    c0,
    codes_ptr,
    qscale_ptr,
    qstate_ptr,
    code2_ptr,
    lut_ptr,
    s_codes,
    s_qscale,
    s_qstate,
    W_IN: tl.constexpr,
    R: tl.constexpr,
    C: tl.constexpr,
    NESTED: tl.constexpr,
    QOFF: tl.constexpr,
    DECODE: tl.constexpr,
):
    """Dequantized W_e[r0:r0+R, c0:c0+C] (float32; C a multiple of 64, c0 of C)."""
    r = r0 + tl.arange(0, R)
    jb = c0 // 2 + tl.arange(0, C // 2)
    packed = tl.load(codes_ptr + e * s_codes + r[:, None] * (W_IN // 2) + jb[None, :])
    high, low = decode_pairs(packed, lut_ptr, DECODE)
    values = tl.reshape(tl.join(high, low), (R, C))
    blk = r[:, None] * (W_IN // 64) + c0 // 64 + tl.arange(0, C // 64)[None, :]
    scales = block_scales(blk, e, qscale_ptr, qstate_ptr, code2_ptr, s_qscale, s_qstate, NESTED, QOFF)
    if C == 64:
        return values * scales
    return tl.reshape(tl.reshape(values, (R, C // 64, 64)) * scales[:, :, None], (R, C))


# --- the grouped GEMM ------------------------------------------------------------------------------


@triton.jit
def _nf4_grouped_mm_kernel(
    x_ptr,
    out_ptr,
    codes_ptr,
    qscale_ptr,
    qstate_ptr,
    code2_ptr,
    lut_ptr,
    offs_ptr,
    eids_ptr,
    M,
    G,
    NUM_PROGS,
    s_xm,
    s_om,
    s_codes,
    s_qscale,
    s_qstate,
    N: tl.constexpr,
    K: tl.constexpr,
    W_IN: tl.constexpr,
    QOFF: tl.constexpr,
    NESTED: tl.constexpr,
    TRANS: tl.constexpr,
    SWAP: tl.constexpr,
    DECODE: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GP: tl.constexpr,
):
    n_tiles = N // BN
    total, starts, ends, tiles, cum = tile_rows(offs_ptr, M, G, BM, GP, n_tiles)
    dtype = x_ptr.dtype.element_ty
    tile = tl.program_id(0)
    while tile < total:  # a while loop: Triton's interpreter cannot range() over a traced scalar
        nt = tile % n_tiles
        row0, row_end, e = tile_group(tile // n_tiles, starts, ends, tiles, cum, eids_ptr, G, BM, GP)
        rows = row0 + tl.arange(0, BM)
        rmask = rows < row_end
        amask = rmask & (e >= 0)  # the tail group multiplies zeros (it is empty unless rows went nowhere)
        e = tl.maximum(e, 0)
        x_ptrs = x_ptr + rows[:, None] * s_xm + tl.arange(0, BK)[None, :]
        if SWAP:  # noqa: SIM108 (constexpr branches)
            acc = tl.zeros((BN, BM), dtype=tl.float32)
        else:
            acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            a = tl.load(x_ptrs + k0, mask=amask[:, None], other=0.0)
            if TRANS:  # W[k0:k0+BK, cols]: [BK, BN]
                w = _w_tile(e, k0, nt * BN, codes_ptr, qscale_ptr, qstate_ptr, code2_ptr, lut_ptr, s_codes,
                            s_qscale, s_qstate, W_IN, BK, BN, NESTED, QOFF, DECODE).to(dtype)  # fmt: skip
                if SWAP:  # noqa: SIM108
                    acc = tl.dot(tl.trans(w), tl.trans(a), acc)
                else:
                    acc = tl.dot(a, w, acc)
            else:  # W[cols, k0:k0+BK]: [BN, BK]
                w = _w_tile(e, nt * BN, k0, codes_ptr, qscale_ptr, qstate_ptr, code2_ptr, lut_ptr, s_codes,
                            s_qscale, s_qstate, W_IN, BN, BK, NESTED, QOFF, DECODE).to(dtype)  # fmt: skip
                if SWAP:  # noqa: SIM108
                    acc = tl.dot(w, tl.trans(a), acc)
                else:
                    acc = tl.dot(a, tl.trans(w), acc)
        if SWAP:
            acc = tl.trans(acc)
        cols = nt * BN + tl.arange(0, BN)
        tl.store(out_ptr + rows[:, None] * s_om + cols[None, :], acc.to(dtype), mask=rmask[:, None])
        tile += NUM_PROGS


@dataclass(frozen=True)
class MMConfig:
    """Block sizes of the grouped GEMM: BM rows (tokens) x BN outputs, BK deep; Triton's warps and stages."""

    bm: int = 128
    bn: int = 128
    bk: int = 64
    warps: int = 8
    stages: int = 3
    swap: bool = False  # the weight tile as the left operand (computes out^T, the tokens as MMA columns)
    decode: int = TREE  # GATHER, TREE or PRMT (PTX byte permutes; CUDA only, NF4 values rounded to bf16)
    programs_per_sm: int = 1
    scale_acc: bool = False  # x @ W.T of bf16 rows by `trainer.kernels.nf4_decode` (scale on the accumulator)
    prefetch: bool = False  # scale_acc: each block's scales loaded a K step ahead
    words: bool = False  # scale_acc: the codes read as 32-bit words, K reordered within each block
    rows_in_order: bool = False  # words: the rows reordered by a gather before the kernel


# Picked on an H200 (benchmarks/nf4_kernels.py --explore, story shapes): PTX byte-permute decoding with the
# weight tile as the MMA's left operand (`swap`) ran 2.5x the select tree and 10x the table gather. At
# 256 rows an expert the 256-token tile ran the four GEMMs at 300-330 TFLOP/s; at 64 rows an expert the
# 128-token tile did better (130-150 against 110-120). Seen wrong on that machine (Triton 3.6): the
# swapped kernel with 4 warps and a 128x128x64 tile gave garbage in the forward orientation (the
# input-gradient one was right); keep every config here checked by the benchmark's numerics.
SMALL_GROUPS = MMConfig(bm=128, bn=256, bk=64, warps=8, stages=3, swap=True, decode=PRMT)
LARGE_GROUPS = MMConfig(bm=256, bn=128, bk=64, warps=8, stages=3, swap=True, decode=PRMT)
SMALL_GROUP_ROWS = 128  # rows an expert (on average) up to which SMALL_GROUPS is used
# Decoding: a few rows an expert (batch x top-k / experts), so the step only streams the weights. A
# 16-token tile (the tokens are the MMA's narrow side) wastes no tensor-core work on rows that are not
# there, and the weight tile is as wide as it takes to keep the memory busy.
# Measured on an H200 (benchmarks/decode_speed.py, story shapes, decode_speed_h200_acc_kernels.md): the
# forward of bf16 rows with the scale on the accumulator (`scale_acc`, trainer.kernels.nf4_decode) ran
# the step's expert GEMMs 2% faster than the fused kernel's best config at 0.5 rows an expert (8 tokens),
# 7% at 4 (64 tokens), 21% at 16 (256 tokens, a 32-token tile) and 26% at 32 (512 tokens, a 64-token
# tile). At one token (8 experts hit) the fused kernel's deeper K tile (DECODE_FEW) stays ahead.
# With the 16-token tile, reading the codes as words (`words`), each block's scales a step ahead
# (`prefetch`) and 4 stages cut it by a further 19% at 8 tokens and 16% at 64 (decode_speed_h200_words2;
# words alone: 15% and 12%). The 32- and 64-token tiles read words with the rows put in that K order by
# one gather first (`rows_in_order`: their own strided loads of the rows cost more than the words
# saved): 9% faster at 256 tokens, 11% at 512; at 400 the 32-token tile beat the 64-token one by 14%
# (decode_speed_h200_rows), so it now runs to 28 rows an expert (between the 25 and 32 measured).
# The input gradient and rows not in bf16 keep the fused kernel: DECODE_GROUPS up to 8 rows an expert
# (1.7x faster than SMALL_GROUPS at 0.5 and 4 rows), and to 16 the input gradient; a forward of 9 to 16
# rows takes a 32-token tile with 4 programs an SM (DECODE_WIDE: 19% faster at 16 rows, nf4_split_h200.md).
DECODE_GROUPS = MMConfig(bm=16, bn=128, bk=128, warps=4, stages=4, swap=True, decode=PRMT, programs_per_sm=2)
DECODE_FEW = MMConfig(bm=16, bn=128, bk=256, warps=4, stages=3, swap=True, decode=PRMT, programs_per_sm=2)
DECODE_WIDE = MMConfig(bm=32, bn=128, bk=128, warps=4, stages=4, swap=True, decode=PRMT, programs_per_sm=4)
DECODE_ACC = MMConfig(
    bm=16, bn=128, warps=4, stages=4, swap=True, decode=PRMT, programs_per_sm=3, scale_acc=True,
    prefetch=True, words=True,
)  # fmt: skip
DECODE_ACC_WIDE = MMConfig(
    bm=32, bn=128, warps=4, stages=3, swap=True, decode=PRMT, programs_per_sm=3, scale_acc=True,
    words=True, rows_in_order=True,
)  # fmt: skip
DECODE_ACC_TALL = replace(DECODE_ACC_WIDE, bm=64, programs_per_sm=2)
# Rows an expert (on average) up to which each is used: DECODE_FEW to batch 4 (top-8 of 128), then
# DECODE_ACC (or DECODE_GROUPS), DECODE_ACC_WIDE (DECODE_WIDE, or DECODE_GROUPS for the input
# gradient) and DECODE_ACC_TALL.
DECODE_FEW_ROWS, DECODE_ACC_ROWS, DECODE_WIDE_ROWS, DECODE_TALL_ROWS = 0.25, 8, 16, 32
DECODE_ACC_WIDE_ROWS = 28  # rows an expert up to which a bf16 forward takes DECODE_ACC_WIDE


def pick_config(rows: int, groups: int, trans: bool = False, bf16: bool = True) -> MMConfig:
    """The block config for `rows` rows over `groups` groups (host-known sizes only); `bf16`: the rows
    are bf16 (what the scale-on-accumulator kernel takes)."""
    per_group = rows / max(groups, 1)
    if per_group <= DECODE_FEW_ROWS:
        return DECODE_FEW
    if trans or not bf16:
        if per_group <= DECODE_ACC_ROWS:
            return DECODE_GROUPS
        if per_group <= DECODE_WIDE_ROWS:
            return DECODE_GROUPS if trans else DECODE_WIDE
    elif per_group <= DECODE_TALL_ROWS:
        if per_group <= DECODE_ACC_ROWS:
            return DECODE_ACC
        return DECODE_ACC_WIDE if per_group <= DECODE_ACC_WIDE_ROWS else DECODE_ACC_TALL
    return SMALL_GROUPS if per_group <= SMALL_GROUP_ROWS else LARGE_GROUPS


def _fit(block: int, dim: int) -> int:
    """The largest power-of-two block <= `block` (and >= 64) that divides dim."""
    while block > 64 and dim % block:
        block //= 2
    if dim % block:
        raise ValueError(f"dimension {dim} is not a multiple of 64")
    return block


def nf4_grouped_mm(
    x: torch.Tensor,
    packed: dict[str, torch.Tensor],
    layout: PackedLayout,
    expert_ids: torch.Tensor,
    offs: torch.Tensor,
    trans: bool = False,
    config: MMConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x @ W.T` per group ([M, in] -> [M, out]), or with `trans` `x @ W` ([M, out] -> [M, in]).

    Group g is rows [offs[g-1], offs[g]) of x (sorted by expert) and uses expert expert_ids[g]; rows
    from offs[-1] on come out zero. offs and expert_ids stay on the device (int32). See
    `trainer.kernels.nf4_ref.nf4_grouped_mm_ref` for the reference.
    """
    bf16 = x.dtype == torch.bfloat16 and (out is None or out.dtype == torch.bfloat16)
    cfg = config or pick_config(x.shape[0], offs.shape[0], trans, bf16)
    if cfg.scale_acc and (trans or not bf16):  # the fused kernel's own config (its tiles are checked)
        cfg = pick_config(x.shape[0], offs.shape[0], trans, bf16=False)
    k_dim, n_dim = (layout.out, layout.inp) if trans else (layout.inp, layout.out)
    if x.dim() != 2 or x.shape[1] != k_dim or x.stride(1) != 1:
        raise ValueError(f"x must be [M, {k_dim}] with contiguous rows, got {tuple(x.shape)}")
    if layout.inp % 64 or layout.out % 64:
        raise ValueError(f"NF4 kernels need both weight dimensions a multiple of 64, got {layout}")
    bn, bk = _fit(cfg.bn, n_dim), _fit(cfg.bk, k_dim)
    m, g = x.shape[0], offs.shape[0]
    if out is None:
        out = torch.empty(m, n_dim, dtype=x.dtype, device=x.device)
    if out.shape != (m, n_dim) or out.stride(1) != 1:
        raise ValueError(f"out must be [{m}, {n_dim}] with contiguous rows, got {tuple(out.shape)}")
    if max(x.stride(0), out.stride(0)) * m >= 2**31:
        raise ValueError("x or out too large for 32-bit offsets")
    if m == 0:
        return out
    offs = offs.to(device=x.device, dtype=torch.int32)
    expert_ids = expert_ids.to(device=x.device, dtype=torch.int32)
    if cfg.scale_acc:
        return decode_mm(
            x, packed, layout, expert_ids, offs, out, bm=cfg.bm, bn=bn, warps=cfg.warps, stages=cfg.stages,
            programs_per_sm=cfg.programs_per_sm, decode=decode_for(cfg.decode, x.device),
            prefetch=cfg.prefetch, words=cfg.words, rows_in_order=cfg.rows_in_order,
        )  # fmt: skip
    codes, qscale, qstate = packed_views(packed)
    bound = (triton.cdiv(m, cfg.bm) + g) * (n_dim // bn)
    programs = max(1, min(bound, num_sms(x.device) * cfg.programs_per_sm))
    with on_device(x.device):  # Triton launches on the current device; the layer may be on another GPU
        _nf4_grouped_mm_kernel[(programs,)](
            x, out, codes, qscale, qstate, dynamic_map(x.device), nf4_table(x.device), offs, expert_ids,
            m, g, programs, x.stride(0), out.stride(0), codes.stride(0), qscale.stride(0), qstate.stride(0),
            N=n_dim, K=k_dim, W_IN=layout.inp, QOFF=layout.blocks // layout.nested, NESTED=layout.nested,
            TRANS=trans, SWAP=cfg.swap, DECODE=decode_for(cfg.decode, x.device),
            BM=cfg.bm, BN=bn, BK=bk, GP=triton.next_power_of_2(g + 1),
            num_warps=cfg.warps, num_stages=cfg.stages,
        )  # fmt: skip
    return out


# --- dequantize in one launch ------------------------------------------------------------------------


@triton.jit
def _nf4_dequant_kernel(
    out_ptr,
    codes_ptr,
    qscale_ptr,
    qstate_ptr,
    code2_ptr,
    lut_ptr,
    eids_ptr,
    s_codes,
    s_qscale,
    s_qstate,
    NBYTES: tl.constexpr,
    QOFF: tl.constexpr,
    NESTED: tl.constexpr,
    BLOCK: tl.constexpr,
    DECODE: tl.constexpr,
):
    """Program (b, k): bytes [b*BLOCK, (b+1)*BLOCK) of expert eids[k] -> elements of out[k]."""
    b = tl.program_id(0)
    k = tl.program_id(1).to(tl.int64)
    e = tl.load(eids_ptr + k)
    valid = e >= 0  # expert -1: zeros
    e = tl.maximum(e, 0)
    j = b * BLOCK + tl.arange(0, BLOCK)
    packed = tl.load(codes_ptr + e * s_codes + j, mask=j < NBYTES, other=0)
    high, low = decode_pairs(packed, lut_ptr, DECODE)
    blk = b * (BLOCK // 32) + tl.arange(0, BLOCK // 32)
    q = tl.load(qscale_ptr + e * s_qscale + blk, mask=blk < NBYTES // 32, other=0)
    nested = tl.load(qstate_ptr + e * s_qstate + blk // NESTED, mask=blk < NBYTES // 32, other=0.0)
    scales = tl.load(code2_ptr + q.to(tl.int32)) * nested + tl.load(qstate_ptr + e * s_qstate + QOFF)
    values = tl.reshape(tl.join(high, low), (BLOCK // 32, 64))
    w = tl.reshape(values * scales[:, None], (2 * BLOCK,))
    w = tl.where(valid, w, 0.0)
    i = 2 * b * BLOCK + tl.arange(0, 2 * BLOCK)
    tl.store(out_ptr + k * (2 * NBYTES) + i, w.to(out_ptr.dtype.element_ty), mask=i < 2 * NBYTES)


@dataclass(frozen=True)
class DequantConfig:
    """Packed bytes a program, Triton warps, the decoding (2048 bytes, 4 warps: 4.0 TB/s on an H200)."""

    block: int = 2048
    warps: int = 4
    decode: int = GATHER


DEFAULT_DEQUANT = DequantConfig()


def nf4_dequantize(
    packed: dict[str, torch.Tensor],
    layout: PackedLayout,
    expert_ids: torch.Tensor,
    dtype: torch.dtype = torch.bfloat16,
    config: DequantConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The [k, out, in] weights of experts `expert_ids` (on the device; -1 gives zeros), in one launch."""
    cfg = config or DEFAULT_DEQUANT
    codes, qscale, qstate = packed_views(packed)
    device = codes.device
    expert_ids = expert_ids.to(device=device, dtype=torch.int32)
    k = expert_ids.shape[0]
    if out is None:
        out = torch.empty(k, layout.out, layout.inp, dtype=dtype, device=device)
    if out.shape != (k, layout.out, layout.inp) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [{k}, {layout.out}, {layout.inp}] tensor")
    nbytes = layout.numel // 2
    if k == 0:
        return out
    with on_device(device):  # Triton launches on the current device
        _nf4_dequant_kernel[(triton.cdiv(nbytes, cfg.block), k)](
            out, codes, qscale, qstate, dynamic_map(device), nf4_table(device), expert_ids,
            codes.stride(0), qscale.stride(0), qstate.stride(0),
            NBYTES=nbytes, QOFF=layout.blocks // layout.nested, NESTED=layout.nested, BLOCK=cfg.block,
            DECODE=decode_for(cfg.decode, device), num_warps=cfg.warps,
        )  # fmt: skip
    return out
