"""Bytes per storage format, as bitsandbytes and PyTorch lay them out.

NF4/FP4 (bitsandbytes `Params4bit`): two weights a byte, packed into elements of the storage dtype
(`(n + 1) // (2 * itemsize)` of them), plus a quantization state that is *not* a parameter (so ZeRO-3
never partitions or offloads it; it stays whole on the device that quantized it):
- blocks of 64 weights, one absmax each: fp32 without double quant;
- with double quant the absmaxes are themselves quantized to 8 bit in blocks of 256, which adds one
  fp32 absmax per 256 blocks, a 256-entry fp32 code book and an fp32 offset;
- the 16-entry fp32 NF4/FP4 code book.
So NF4 costs 0.5 + 4/64 = 0.5625 bytes a weight without double quant and about 0.5159 with it.

The trainer packs the fused MoE experts itself (`trainer/layers/experts4bit.py`, `PackedLayout`), per expert:
NF4 codes (n/2 bytes), one double-quantized byte of scale per 64 weights, and per expert an fp32 scale
per `nested` blocks of those bytes plus an fp32 offset. Those are three ordinary parameters in the
float storage dtype, so ZeRO-3 partitions, offloads and gathers them like any other: no quantization
state stays whole on a GPU (`packed_experts`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cockpit.contract import (
    BNB_NESTED_BLOCKSIZE,
    NF4_BLOCKSIZE,
    PACKED_NESTED_BLOCKSIZES,
    packed_nested_blocksize,
)

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "uint8": 1, "int8": 1}
BLOCKSIZE = NF4_BLOCKSIZE
NESTED_BLOCKSIZE = BNB_NESTED_BLOCKSIZE
CODE_4BIT_BYTES = 16 * 4
CODE_NESTED_BYTES = 256 * 4
OFFSET_BYTES = 4


@dataclass(frozen=True)
class Stored:
    """How one tensor is held: its data (what ZeRO-3 partitions) and any quantization state."""

    fmt: str  # "nf4", "fp4" or a dtype name
    data_bytes: int
    data_numel: int  # elements of the stored tensor (packed elements for 4 bit)
    itemsize: int
    state_bytes: int = 0
    # Bytes of each separately stored parameter when the data is several (packed experts: codes, scales,
    # state); empty: one parameter of `data_bytes`. ZeRO-3 partitions and pins each on its own.
    parts: tuple[int, ...] = ()

    def pieces(self) -> tuple[tuple[int, int], ...]:
        """(elements, itemsize) of every parameter that holds the data."""
        if not self.parts:
            return ((self.data_numel, self.itemsize),)
        return tuple((b // self.itemsize, self.itemsize) for b in self.parts)

    @property
    def total(self) -> int:
        return self.data_bytes + self.state_bytes

    @property
    def is_4bit(self) -> bool:
        return self.fmt in ("nf4", "fp4", "nf4-packed")


def plain(numel: int, dtype: str) -> Stored:
    size = DTYPE_BYTES[dtype]
    return Stored(dtype, numel * size, numel, size)


def four_bit(numel: int, double_quant: bool, storage_dtype: str = "uint8", quant_type: str = "nf4") -> Stored:
    """A tensor quantized by bitsandbytes to 4 bit."""
    size = DTYPE_BYTES[storage_dtype]
    packed = (numel + 1) // (2 * size)
    blocks = math.ceil(numel / BLOCKSIZE)
    if double_quant:
        state = blocks + 4 * math.ceil(blocks / NESTED_BLOCKSIZE) + CODE_NESTED_BYTES + OFFSET_BYTES
    else:
        state = 4 * blocks
    return Stored(quant_type, packed * size, packed, size, state + CODE_4BIT_BYTES)


def packed_experts(experts: int, out: int, inp: int, storage_dtype: str = "bfloat16") -> Stored:
    """A fused experts weight [experts, out, inp] as the trainer packs it (`PackedLayout.nbytes`)."""
    size = DTYPE_BYTES[storage_dtype]
    numel = out * inp
    blocks = math.ceil(numel / BLOCKSIZE)
    try:
        nested = packed_nested_blocksize(blocks)
    except ValueError:  # the trainer refuses such a layout at load; plan its size all the same
        nested = PACKED_NESTED_BLOCKSIZES[-1]
    codes = experts * math.ceil(numel / 2)
    scales = experts * blocks
    state = experts * 4 * (math.ceil(blocks / nested) + 1)
    parts = tuple(size * math.ceil(b / size) for b in (codes, scales, state))
    total = sum(parts)
    return Stored("nf4-packed", total, total // size, size, 0, parts)


def bytes_per_param_4bit(double_quant: bool) -> float:
    """Asymptotic bytes a weight for 4-bit storage (large tensors)."""
    state = 1 / BLOCKSIZE + 4 / (BLOCKSIZE * NESTED_BLOCKSIZE) if double_quant else 4 / BLOCKSIZE
    return 0.5 + state


def pow2_ceil(n: int) -> int:
    """PyTorch's pinned host allocator rounds every block up to a power of two."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()
