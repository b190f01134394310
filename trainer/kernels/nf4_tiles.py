"""Device pieces shared by the NF4 kernels (`trainer.kernels.nf4_triton`, `trainer.kernels.nf4_decode`).

How 4-bit codes become NF4 values (a gather from the 16-entry table, a select tree, or PTX byte
permutes on the packed bytes, 8 codes a 32-bit word with no memory access, the table rounded to bf16),
the block scales with the double quantization undone, the persistent walk over every group's tiles,
and the host's helpers for a launch.
"""

from __future__ import annotations

from functools import cache

import torch
import triton
import triton.language as tl

from trainer.kernels.nf4_ref import NF4_VALUES

# --- dequantization pieces (device functions) --------------------------------------------------------

GATHER, TREE, PRMT = 0, 1, 2  # how 4-bit codes become NF4 values (MMConfig.decode)


def prmt_asm(finish: str, outputs: tuple[tuple[int, int], tuple[int, int]]) -> str:
    """PTX: 4 packed bytes (8 codes, `$4`) -> 4 int32 outputs of bf16 NF4 values, by byte lookups with
    `prmt` in two 8-entry halves of the table (selected by bit 3 of the code), so no memory access; the
    NF4 values are rounded to bf16 first. Each half (two bytes) leaves the low and high bytes of its four
    values in `l` and `h` (nibbles in the order [b.lo, b.hi, b'.lo, b'.hi]); `finish` (two `prmt`s into
    `${o0}` and `${o1}`) packs them into outputs, numbered by `outputs` for the first and second half."""
    bits = torch.tensor(NF4_VALUES, dtype=torch.float32).bfloat16().view(torch.int16).int() & 0xFFFF
    lo = [int(b) & 0xFF for b in bits]
    hi = [int(b) >> 8 for b in bits]

    def word(table: list[int], k: int) -> str:
        return f"0x{sum(table[4 * k + i] << (8 * i) for i in range(4)):08X}"

    tables = "".join(f"mov.b32 lo{k}, {word(lo, k)}; mov.b32 hi{k}, {word(hi, k)}; " for k in range(4))
    half = (
        "prmt.b32 a, lo0, lo1, {s}; prmt.b32 b, lo2, lo3, {s}; lop3.b32 l, b, a, {m}, 0xE4; "
        "prmt.b32 a, hi0, hi1, {s}; prmt.b32 b, hi2, hi3, {s}; lop3.b32 h, b, a, {m}, 0xE4; " + finish
    )
    (a0, a1), (b0, b1) = outputs
    return (
        "{ .reg .b32 lo0, lo1, lo2, lo3, hi0, hi1, hi2, hi3, s0, s1, t, m0, m1, a, b, l, h; "
        + tables
        + "and.b32 s0, $4, 0x7777; shr.u32 s1, $4, 16; and.b32 s1, s1, 0x7777; shl.b32 t, $4, 4; "
        "prmt.b32 m0, t, $4, 0xD9C8; prmt.b32 m1, t, $4, 0xFBEA; "
        + half.format(s="s0", m="m0", o0=a0, o1=a1)
        + half.format(s="s1", m="m1", o0=b0, o1=b1)
        + "}"
    )


# Each byte's two values as one int32 (the high nibble's value in the low half), bytes in order.
PRMT_PAIRS = tl.constexpr(
    prmt_asm("prmt.b32 ${o0}, l, h, 0x4051; prmt.b32 ${o1}, l, h, 0x6273; ", ((0, 1), (2, 3)))
)


@triton.jit
def nf4_lookup(codes, lut_ptr, DECODE: tl.constexpr):
    """NF4 value (float32) of each 4-bit code: a gather from the 16-entry table, or a select tree."""
    if DECODE == 1:
        b0 = (codes & 1) != 0
        b1 = (codes & 2) != 0
        b2 = (codes & 4) != 0
        b3 = (codes & 8) != 0
        v01 = tl.where(b0, -0.6961928009986877, -1.0)
        v23 = tl.where(b0, -0.39491748809814453, -0.5250730514526367)
        v45 = tl.where(b0, -0.18477343022823334, -0.28444138169288635)
        v67 = tl.where(b0, 0.0, -0.09105003625154495)
        v89 = tl.where(b0, 0.16093020141124725, 0.07958029955625534)
        vab = tl.where(b0, 0.33791524171829224, 0.24611230194568634)
        vcd = tl.where(b0, 0.5626170039176941, 0.44070982933044434)
        vef = tl.where(b0, 1.0, 0.7229568362236023)
        v03 = tl.where(b1, v23, v01)
        v47 = tl.where(b1, v67, v45)
        v8b = tl.where(b1, vab, v89)
        vcf = tl.where(b1, vef, vcd)
        v07 = tl.where(b2, v47, v03)
        v8f = tl.where(b2, vcf, v8b)
        return tl.where(b3, v8f, v07).to(tl.float32)
    return tl.load(lut_ptr + codes.to(tl.int32))


@triton.jit
def decode_pairs(packed, lut_ptr, DECODE: tl.constexpr):
    """(value of the high nibble, value of the low nibble) of every packed byte, float32."""
    if DECODE == 2:
        pairs = tl.inline_asm_elementwise(
            PRMT_PAIRS, "=r,=r,=r,=r,r", [packed], dtype=tl.int32, is_pure=True, pack=4
        )
        return (pairs << 16).to(tl.float32, bitcast=True), (pairs & -65536).to(tl.float32, bitcast=True)
    return nf4_lookup(packed >> 4, lut_ptr, DECODE), nf4_lookup(packed & 15, lut_ptr, DECODE)


@triton.jit
def block_scales(blk, e, qscale_ptr, qstate_ptr, code2_ptr, s_qscale, s_qstate, NESTED: tl.constexpr, QOFF):
    """Float32 scales of 64-element blocks `blk` of expert e (the double quantization undone inline)."""
    q = tl.load(qscale_ptr + e * s_qscale + blk)
    nested = tl.load(qstate_ptr + e * s_qstate + blk // NESTED)
    offset = tl.load(qstate_ptr + e * s_qstate + QOFF)
    return tl.load(code2_ptr + q.to(tl.int32)) * nested + offset


# --- the persistent walk over (m-tile, n-tile) of every group (shared by the grouped GEMMs) ----------


@triton.jit
def tile_rows(offs_ptr, M, G, BM: tl.constexpr, GP: tl.constexpr, n_tiles):
    """(tiles in all, group starts, ends, m-tiles a group, their running sum), read from the device.

    Groups 0..G-1 are offs' groups; group G is the tail [offs[G-1], M), which has no expert (zeros)."""
    gi = tl.arange(0, GP)
    ends = tl.load(offs_ptr + gi, mask=gi < G, other=M)
    starts = tl.load(offs_ptr + gi - 1, mask=(gi > 0) & (gi <= G), other=0)
    starts = tl.where(gi > G, M, starts)
    tiles = (tl.maximum(ends - starts, 0) + BM - 1) // BM
    cum = tl.cumsum(tiles, 0)
    return tl.sum(tiles, 0) * n_tiles, starts, ends, tiles, cum


@triton.jit
def tile_group(mt, starts, ends, tiles, cum, eids_ptr, G, BM: tl.constexpr, GP: tl.constexpr):
    """(first row, end row, expert or -1 for the tail) of m-tile `mt`."""
    gi = tl.arange(0, GP)
    g = tl.sum((cum <= mt).to(tl.int32), 0)
    sel = gi == g
    row0 = tl.sum(tl.where(sel, starts + (mt - cum + tiles) * BM, 0), 0)
    row_end = tl.sum(tl.where(sel, ends, 0), 0)
    return row0, row_end, tl.load(eids_ptr + g, mask=g < G, other=-1)


@cache
def num_sms(device: torch.device) -> int:
    """The device's multiprocessors (4 on the CPU, for the interpreter's persistent launches)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def decode_for(decode: int, device: torch.device) -> int:
    """PRMT is inline PTX: Triton's interpreter (CPU) takes the select tree instead."""
    return TREE if decode == PRMT and device.type != "cuda" else decode


def packed_views(packed: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes as bytes, block scales as bytes, quantization state as float32) of a packed weight."""
    return (
        packed["nf4"].view(torch.uint8),
        packed["absmax"].view(torch.uint8),
        packed["qstate"].view(torch.float32),
    )
