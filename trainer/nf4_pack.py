"""Packed NF4 storage of fused expert weights: the layout, and quantizing and dequantizing with
bitsandbytes' functional kernels.

Per fused weight `w` of logical shape [E, out, in] (n = out * in elements an expert):
  `w_nf4`    the 4-bit codes, two a byte, [E, n / 2] bytes
  `w_absmax` the 64-element block scales, double-quantized to one byte each, [E, n / 64] bytes
  `w_qstate` float32 per expert: the fp32 scales of those bytes (one per `nested` blocks) and the
             offset that double quantization subtracts, [E, n / 64 / nested + 1]
Each is stored reinterpreted as a float dtype (bf16 or fp32), so DeepSpeed ZeRO-3 can own it like any
parameter; every quantity is per expert, so one expert dequantizes on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from cockpit.contract import (
    NF4_BLOCKSIZE,
    PACKED_STORAGE_DTYPES,
    packed_expert_problem,
    packed_nested_blocksize,
)

BLOCKSIZE = NF4_BLOCKSIZE
STORAGE_DTYPES = tuple(getattr(torch, name) for name in PACKED_STORAGE_DTYPES)


@dataclass(frozen=True)
class PackedLayout:
    """Shapes of one packed fused weight of logical shape [experts, out, in]."""

    experts: int
    out: int
    inp: int
    storage_dtype: torch.dtype

    @property
    def numel(self) -> int:
        return self.out * self.inp

    @property
    def blocks(self) -> int:
        return self.numel // BLOCKSIZE

    @property
    def nested(self) -> int:
        return packed_nested_blocksize(self.blocks)

    @property
    def itemsize(self) -> int:
        return torch.empty(0, dtype=self.storage_dtype).element_size()

    def check(self) -> None:
        """ValueError for a layout the trainer cannot pack (`cockpit.contract.packed_expert_problem`, the
        rule plan and doctor refuse it by too)."""
        if self.storage_dtype not in STORAGE_DTYPES:
            raise ValueError(f"packed storage must be a float dtype, got {self.storage_dtype}")
        problem = packed_expert_problem(self.out, self.inp, str(self.storage_dtype).removeprefix("torch."))
        if problem:
            raise ValueError(problem)

    @property
    def nbytes(self) -> int:
        """Bytes of the packed weight, codes, scales and state, all experts (for memory plans)."""
        return self.experts * (self.numel // 2 + self.blocks + 4 * (self.blocks // self.nested + 1))

    def shapes(self) -> dict[str, tuple[int, int]]:
        """Per suffix, the shape of the parameter in the storage dtype."""
        s = self.itemsize
        return {
            "nf4": (self.experts, self.numel // 2 // s),
            "absmax": (self.experts, self.blocks // s),
            "qstate": (self.experts, 4 * (self.blocks // self.nested + 1) // s),
        }


def quantize_experts_nf4(
    expert: Callable[[int], torch.Tensor], layout: PackedLayout, device: torch.device | str, chunk: int = 8
) -> dict[str, torch.Tensor]:
    """Pack `expert(e)` ([out, in], any float dtype) for every expert, `chunk` experts at a time on `device`.

    Only the packed tensors and one chunk of 16-bit weights are alive at once, so weights can be streamed
    from a checkpoint one expert at a time. Returns the three tensors keyed by suffix, in the storage dtype.
    """
    import bitsandbytes.functional as bnbf

    layout.check()
    e_all, n, nb, nested = layout.experts, layout.numel, layout.blocks, layout.nested
    codes = torch.empty(e_all, n // 2, dtype=torch.uint8, device=device)
    absmax = torch.empty(e_all, nb, dtype=torch.uint8, device=device)
    qstate = torch.empty(e_all, nb // nested + 1, dtype=torch.float32, device=device)
    for e0 in range(0, e_all, chunk):
        e1 = min(e_all, e0 + chunk)
        w = torch.stack([expert(e).to(device) for e in range(e0, e1)])
        if w.shape[1:] != (layout.out, layout.inp):
            raise ValueError(
                f"expert weight of shape {tuple(w.shape[1:])}, expected {(layout.out, layout.inp)}"
            )
        if w.dtype not in STORAGE_DTYPES:
            w = w.float()
        packed, state = bnbf.quantize_4bit(
            w.reshape(-1),
            blocksize=BLOCKSIZE,
            compress_statistics=False,
            quant_type="nf4",
            quant_storage=torch.uint8,
        )
        del w
        codes[e0:e1] = packed.view(e1 - e0, n // 2)
        scales = state.absmax.float().view(e1 - e0, nb)
        # Double quantization as bitsandbytes does it (subtract the mean, 8-bit blockwise), but per expert,
        # with nested blocks that never straddle two experts.
        offset = scales.mean(dim=1, keepdim=True)
        qscales, state2 = bnbf.quantize_blockwise((scales - offset).reshape(-1), blocksize=nested)
        absmax[e0:e1] = qscales.view(e1 - e0, nb)
        qstate[e0:e1, :-1] = state2.absmax.view(e1 - e0, nb // nested)
        qstate[e0:e1, -1] = offset[:, 0]
    dtype = layout.storage_dtype
    return {"nf4": codes.view(dtype), "absmax": absmax.view(dtype), "qstate": qstate.view(dtype)}


def dequantize_experts_nf4(
    packed: dict[str, torch.Tensor],
    layout: PackedLayout,
    experts: int | list[int] | torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The [k, out, in] weights (or [out, in] for one int) of the selected experts, in `dtype`."""
    import bitsandbytes.functional as bnbf

    single = isinstance(experts, int)
    index = [experts] if single else experts
    codes = packed["nf4"].view(torch.uint8)[index]
    qscales = packed["absmax"].view(torch.uint8)[index]
    qstate = packed["qstate"].view(torch.float32)[index]
    k = codes.shape[0]
    scales = bnbf.dequantize_blockwise(
        qscales.reshape(-1), absmax=qstate[:, :-1].reshape(-1).contiguous(), blocksize=layout.nested
    )
    scales = (scales.view(k, layout.blocks) + qstate[:, -1:]).reshape(-1)
    state = bnbf.QuantState(
        absmax=scales, shape=(k, layout.out, layout.inp), dtype=dtype, blocksize=BLOCKSIZE, quant_type="nf4"
    )
    weights = bnbf.dequantize_4bit(codes.reshape(-1), state)
    return weights[0] if single else weights
