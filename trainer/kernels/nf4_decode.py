"""The NF4 grouped GEMM for a few rows an expert (decoding), with the block scale on the accumulator.

At decode sizes (a handful of rows an expert) the fused kernel in `trainer.kernels.nf4_triton` streams
the weights, and its limit is the integer pipe that turns codes into values (benchmarks/results/
nf4_ncu_h200.md: 67% busy with DRAM at 23%), not memory. There every value goes code -> bf16 pair (PTX
byte permutes) -> float32 -> times its block's scale -> bf16 again: about 4 integer operations a value
and a float32 weight tile in registers.

Here a K step is one 64-value scale block, so the scale leaves the weights: the tile is the table's
bf16 values as the byte permutes give them (no float32 round trip, half the registers), the tensor
cores multiply it by the rows, and the block's float32 scale multiplies that product on the accumulator:
`acc += s[n] * (T[q[n, k0:k0+64]] @ x[:, k0:k0+64].T)`, a few multiply-adds a weight row for a handful
of rows. With `words` the codes are read as 32-bit words and K is reordered inside each block (the rows'
columns with it) so that the 8 code bytes each thread hands the tensor cores lie together: the byte order
took 32 one-byte shared-memory loads and 24 byte permutes a K step to assemble the words the decode
takes (benchmarks/results/nf4_sass_h200.md: 418 instructions a K step, 382 with words). The rows are
loaded in that order by each tile, or (`rows_in_order`, for tiles of 32 rows and more, whose strided
loads cost more than the words save) put in it by one gather before the kernel. With `prefetch` a
block's scales are loaded one step ahead.

The weights are never rounded after scaling, so the result is nearer the float32 reference than the
fused kernel's (which rounds every scaled weight to bf16). `x @ W.T` only (the forward's
orientation: the blocks run along K), bf16 rows only; `trainer.kernels.nf4_triton.nf4_grouped_mm`
sends such calls here when its config says `scale_acc`.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from trainer.kernels.device import on_device
from trainer.kernels.nf4_ref import dynamic_map, nf4_table
from trainer.kernels.nf4_tiles import (
    PRMT_PAIRS,
    block_scales,
    nf4_lookup,
    num_sms,
    packed_views,
    tile_group,
    tile_rows,
)

if TYPE_CHECKING:
    from trainer.nf4_pack import PackedLayout


@triton.jit
def _values(e, n0, k0, codes_ptr, lut_ptr, s_codes, K: tl.constexpr, BN: tl.constexpr, DECODE: tl.constexpr):
    """Unscaled NF4 values of W_e[n0:n0+BN, k0:k0+64] in bf16 (the table rounded to bf16)."""
    r = n0 + tl.arange(0, BN)
    jb = k0 // 2 + tl.arange(0, 32)
    packed = tl.load(codes_ptr + e * s_codes + r[:, None] * (K // 2) + jb[None, :])
    if DECODE == 2:  # each byte -> one int32 holding its two values as bf16, the high nibble's low
        pairs = tl.inline_asm_elementwise(
            PRMT_PAIRS, "=r,=r,=r,=r,r", [packed], dtype=tl.int32, is_pure=True, pack=4
        )
        first = pairs.to(tl.int16).to(tl.bfloat16, bitcast=True)
        second = (pairs >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        first = nf4_lookup(packed >> 4, lut_ptr, DECODE).to(tl.bfloat16)
        second = nf4_lookup(packed & 15, lut_ptr, DECODE).to(tl.bfloat16)
    return tl.reshape(tl.join(first, second), (BN, 64))


@triton.jit
def _by_pair(b0, b1, b2, b3, BN: tl.constexpr):
    """Per-byte tensors [BN, 8] (byte i of each of a row's 8 words) as [BN, 32] in the K order of `WORDS`
    steps: pair p = 16h + 4i + c is byte i of word 2c + h, so the 8 pairs a thread holds for the tensor
    cores (p = c + 4j) are 8 bytes in a row (words 2c and 2c + 1)."""
    q = tl.reshape(tl.join(tl.join(b0, b2), tl.join(b1, b3)), (BN, 4, 2, 4))
    return tl.reshape(tl.permute(q, (0, 2, 3, 1)), (BN, 32))


@triton.jit
def _word_values(
    e, n0, k0, words_ptr, lut_ptr, s_words, K: tl.constexpr, BN: tl.constexpr, DECODE: tl.constexpr
):
    """`_values` from whole 32-bit words of codes, in the K order of `_by_pair` (the rows take it too)."""
    r = n0 + tl.arange(0, BN)
    jw = k0 // 8 + tl.arange(0, 8)
    words = tl.load(words_ptr + e * s_words + r[:, None] * (K // 8) + jw[None, :])
    if DECODE == 2:
        o0, o1, o2, o3 = tl.inline_asm_elementwise(
            PRMT_PAIRS, "=r,=r,=r,=r,r", [words], dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
            is_pure=True, pack=1,
        )  # fmt: skip
        pairs = _by_pair(o0, o1, o2, o3, BN)
        first = pairs.to(tl.int16).to(tl.bfloat16, bitcast=True)
        second = (pairs >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        b0, b1, b2, b3 = words & 255, (words >> 8) & 255, (words >> 16) & 255, (words >> 24) & 255
        first = _by_pair(
            nf4_lookup(b0 >> 4, lut_ptr, DECODE), nf4_lookup(b1 >> 4, lut_ptr, DECODE),
            nf4_lookup(b2 >> 4, lut_ptr, DECODE), nf4_lookup(b3 >> 4, lut_ptr, DECODE), BN,
        ).to(tl.bfloat16)  # fmt: skip
        second = _by_pair(
            nf4_lookup(b0 & 15, lut_ptr, DECODE), nf4_lookup(b1 & 15, lut_ptr, DECODE),
            nf4_lookup(b2 & 15, lut_ptr, DECODE), nf4_lookup(b3 & 15, lut_ptr, DECODE), BN,
        ).to(tl.bfloat16)  # fmt: skip
    return tl.reshape(tl.join(first, second), (BN, 64))


@triton.jit
def _word_columns():
    """The row columns (within a 64-value block) that `_word_values`' K order puts at 0..63."""
    kappa = tl.arange(0, 64)
    p = kappa // 2
    return 16 * (p % 4) + 8 * (p // 16) + 2 * ((p // 4) % 4) + kappa % 2


@triton.jit
def _nf4_decode_mm_kernel(
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
    QOFF: tl.constexpr,
    NESTED: tl.constexpr,
    DECODE: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    GP: tl.constexpr,
    PREFETCH: tl.constexpr,
    WORDS: tl.constexpr,
    ROWS_IN_ORDER: tl.constexpr,
):
    n_tiles = N // BN
    total, starts, ends, tiles, cum = tile_rows(offs_ptr, M, G, BM, GP, n_tiles)
    tile = tl.program_id(0)
    while tile < total:  # persistent, as the fused kernel (a while loop for Triton's interpreter)
        nt = tile % n_tiles
        row0, row_end, e = tile_group(tile // n_tiles, starts, ends, tiles, cum, eids_ptr, G, BM, GP)
        rows = row0 + tl.arange(0, BM)
        rmask = rows < row_end
        amask = rmask & (e >= 0)  # the tail group (rows that went nowhere) multiplies zeros
        e = tl.maximum(e, 0)
        n = nt * BN + tl.arange(0, BN)
        if WORDS and not ROWS_IN_ORDER:
            x_ptrs = x_ptr + rows[:, None] * s_xm + _word_columns()[None, :]
        else:
            x_ptrs = x_ptr + rows[:, None] * s_xm + tl.arange(0, 64)[None, :]
        acc = tl.zeros((BN, BM), dtype=tl.float32)
        blk = n * (K // 64)
        if PREFETCH:
            s_next = block_scales(blk, e, qscale_ptr, qstate_ptr, code2_ptr, s_qscale, s_qstate, NESTED, QOFF)
        for k0 in range(0, K, 64):
            a = tl.load(x_ptrs + k0, mask=amask[:, None], other=0.0)
            if WORDS:
                w = _word_values(e, nt * BN, k0, codes_ptr, lut_ptr, s_codes, K, BN, DECODE)
            else:
                w = _values(e, nt * BN, k0, codes_ptr, lut_ptr, s_codes, K, BN, DECODE)
            if PREFETCH:  # the next block's scales loaded a step ahead (their loads wait on no MMA)
                s = s_next
                ahead = tl.minimum(k0 + 64, K - 64) // 64
                s_next = block_scales(blk + ahead, e, qscale_ptr, qstate_ptr, code2_ptr, s_qscale, s_qstate,
                                      NESTED, QOFF)  # fmt: skip
            else:
                s = block_scales(blk + k0 // 64, e, qscale_ptr, qstate_ptr, code2_ptr, s_qscale, s_qstate,
                                 NESTED, QOFF)  # fmt: skip
            if DECODE == 2:
                acc += s[:, None] * tl.dot(w, tl.trans(a))
            else:  # the same products in float32 (Triton's interpreter multiplies bf16 as integers)
                acc += s[:, None] * tl.dot(
                    w.to(tl.float32), tl.trans(a).to(tl.float32), input_precision="ieee"
                )
        out = tl.trans(acc)
        tl.store(
            out_ptr + rows[:, None] * s_om + n[None, :], out.to(out_ptr.dtype.element_ty), mask=rmask[:, None]
        )
        tile += NUM_PROGS


# Made on a device's first call, outside any CUDA graph capture: evaluation runs a step eagerly before it
# captures one (`trainer.evaluation.decode.GreedyDecoder._record`).
@cache
def word_order(device: torch.device) -> torch.Tensor:
    """The columns of a 64-value block in the K order of `words` (`_word_columns`), for a gather."""
    kappa = torch.arange(64)
    p = kappa // 2
    return (16 * (p % 4) + 8 * (p // 16) + 2 * ((p // 4) % 4) + kappa % 2).to(device)


def decode_mm(
    x: torch.Tensor,
    packed: dict[str, torch.Tensor],
    layout: PackedLayout,
    expert_ids: torch.Tensor,
    offs: torch.Tensor,
    out: torch.Tensor,
    *,
    bm: int,
    bn: int,
    warps: int,
    stages: int,
    programs_per_sm: int,
    decode: int,
    prefetch: bool = False,
    words: bool = False,
    rows_in_order: bool = False,
) -> torch.Tensor:
    """`x @ W.T` per group into `out`, as `trainer.kernels.nf4_triton.nf4_grouped_mm` (which checks the
    shapes and hands over int32 offs and ids): x bf16; a tile of bm rows by bn outputs (bn >= 16 dividing
    the weight's outputs), each K step one 64-value scale block; `prefetch`: each block's scales loaded
    a step ahead of their use; `words`: the codes read as 32-bit words, K reordered within each block
    (`rows_in_order`: the rows too, by one gather before the kernel, not by each tile's loads)."""
    m, g = x.shape[0], offs.shape[0]
    if bn < 16 or layout.out % bn or layout.inp % 64:
        raise ValueError(f"a tile of {bn} outputs over {layout}: bn >= 16 must divide out, 64 divide in")
    codes, qscale, qstate = packed_views(packed)
    if words:
        codes = codes.view(torch.int32)
        if rows_in_order:
            x = x.view(m, layout.inp // 64, 64)[:, :, word_order(x.device)].reshape(m, layout.inp)
    bound = (triton.cdiv(m, bm) + g) * (layout.out // bn)
    programs = max(1, min(bound, num_sms(x.device) * programs_per_sm))
    with on_device(x.device):
        _nf4_decode_mm_kernel[(programs,)](
            x, out, codes, qscale, qstate, dynamic_map(x.device), nf4_table(x.device), offs, expert_ids,
            m, g, programs, x.stride(0), out.stride(0), codes.stride(0), qscale.stride(0), qstate.stride(0),
            N=layout.out, K=layout.inp, QOFF=layout.blocks // layout.nested, NESTED=layout.nested,
            DECODE=decode, BM=bm, BN=bn, GP=triton.next_power_of_2(g + 1), PREFETCH=prefetch, WORDS=words,
            ROWS_IN_ORDER=rows_in_order,
            num_warps=warps, num_stages=stages,
        )  # fmt: skip
    return out
