"""Rotary position embedding of a query or key tensor, one Triton kernel each way.

Transformers applies it as `x * cos + rotate_half(x) * sin` on the [B, H, T, D] transposed view of the
projection's output: a negation, a concatenation, two products and a sum, most on torch's slow path for
non-contiguous tensors, and as many kernels again in backward. Here one pass reads x, cos and sin and
writes the result in the input's own memory order (so the attention's [B*T, H, D] view of it stays a
view), float32 inside and one rounding. With x = [x1 | x2] and cos, sin split the same way:
    out1 = x1 cos1 - x2 sin1        out2 = x2 cos2 + x1 sin2
    dx1 = g1 cos1 + g2 sin2         dx2 = g2 cos2 - g1 sin1
`reference` is the same formula in torch (the tests' reference).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from trainer.kernels.device import on_device

BLOCK_HEADS = 16


def reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Transformers' formula on [B, H, T, D] x and [B, T, D] cos and sin (broadcast over heads)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


@triton.jit
def _rope_kernel(
    x, cs, sn, out, heads, seq,
    sxb, sxh, sxt, scb, sct, sob, soh, sot,
    BACKWARD: tl.constexpr, HALF: tl.constexpr, BH: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)  # one (b, t)
    b = (row // seq).to(tl.int64)
    t = (row % seq).to(tl.int64)
    hs = tl.program_id(1) * BH + tl.arange(0, BH)
    live = hs < heads
    d = tl.arange(0, HALF)
    at_c = cs + b * scb + t * sct + d
    at_s = sn + b * scb + t * sct + d
    c1 = tl.load(at_c).to(tl.float32)[None, :]
    c2 = tl.load(at_c + HALF).to(tl.float32)[None, :]
    s1 = tl.load(at_s).to(tl.float32)[None, :]
    s2 = tl.load(at_s + HALF).to(tl.float32)[None, :]
    heads_at = hs.to(tl.int64)[:, None]
    at_x = x + b * sxb + t * sxt + heads_at * sxh + d[None, :]
    x1 = tl.load(at_x, mask=live[:, None], other=0.0).to(tl.float32)
    x2 = tl.load(at_x + HALF, mask=live[:, None], other=0.0).to(tl.float32)
    if BACKWARD:
        o1 = x1 * c1 + x2 * s2
        o2 = x2 * c2 - x1 * s1
    else:
        o1 = x1 * c1 - x2 * s1
        o2 = x2 * c2 + x1 * s2
    at_o = out + b * sob + t * sot + heads_at * soh + d[None, :]
    tl.store(at_o, o1.to(out.dtype.element_ty), mask=live[:, None])
    tl.store(at_o + HALF, o2.to(out.dtype.element_ty), mask=live[:, None])


def _launch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool) -> torch.Tensor:
    b, h, t, d = x.shape
    out = torch.empty_like(x)  # in x's memory order: [B, T, H, D] memory for Transformers' transposed view
    if x.numel():
        with on_device(x.device):
            _rope_kernel[(b * t, triton.cdiv(h, BLOCK_HEADS))](
                x, cos, sin, out, h, t,
                x.stride(0), x.stride(1), x.stride(2), cos.stride(0), cos.stride(1),
                out.stride(0), out.stride(1), out.stride(2),
                BACKWARD=backward, HALF=d // 2, BH=BLOCK_HEADS,
            )  # fmt: skip
    return out


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        return _launch(x, cos, sin, backward=False)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        grad = grad if grad.stride(-1) == 1 else grad.contiguous()
        return _launch(grad, cos, sin, backward=True), None, None


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`reference(x, cos, sin)` in one kernel each way: x [B, H, T, D] (last dimension contiguous, D even
    and a power of two), cos and sin [B or 1, T, D] without gradient."""
    if x.dim() != 4 or cos.dim() != 3 or cos.shape[-1] != x.shape[-1] or cos.shape[1] != x.shape[2]:
        raise ValueError(f"rope: x {tuple(x.shape)} against cos {tuple(cos.shape)}")
    if cos.shape[0] != x.shape[0]:
        cos, sin = cos.expand(x.shape[0], -1, -1), sin.expand(x.shape[0], -1, -1)
    x = x if x.stride(-1) == 1 else x.contiguous()
    cos = cos if cos.stride(-1) == 1 else cos.contiguous()
    sin = sin if sin.stride(-1) == 1 else sin.contiguous()
    if cos.stride() != sin.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    return _Rope.apply(x, cos, sin)
