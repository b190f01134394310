"""RMSNorm over the last dimension, many rows a program: `y = x * rsqrt(mean(x^2) + eps) * w`.

torch's fused `rms_norm` kernel gives each row its own thread block. That suits the hidden state's rows
(4,096 wide), but Qwen3's query and key norms run over each head (128 wide): a block of threads for 128
values, millions of times a step. Here a program normalizes a tile of rows at once (about 4,096 values,
a row or many), in float32, the weight multiplying the normalized float32 value before the one rounding
to the input's dtype, as torch's kernel does. Forward keeps each row's reciprocal RMS (float32, one
value a row) for the backward, which is one more pass:

    dx = r * (g * w) - x * r^3 * mean(g * w * x)

The weight's gradient, where the weight trains (it is frozen in QLoRA), is summed over the rows in torch.
`reference` is the same arithmetic in torch: the tests' check.

Measured at the story's shapes on an H200 (`benchmarks/norm_speed.py`): over the query heads (2.1M rows of
128) 0.57 ms forward and 0.43 ms backward against torch's 1.30 and 1.42; over the hidden state (4,096
wide) slower than torch's (0.21 and 0.49 against 0.17 and 0.31 ms). So the trainer takes it for rows up
to `NARROW` wide only (`pays`).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from trainer.kernels.device import on_device

TILE = 4096  # values a program: rows of the tile x its columns (a power of two)
MAX_WIDTH = 16384  # wider rows: torch's kernel (a row would not fit a program's registers)
NARROW = 512  # rows up to this wide: faster than torch's kernel (a block a row); wider ones: slower
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The kernel's arithmetic in torch: float32 statistics and product, one rounding to x's dtype."""
    xf = x.float()
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * r * weight.float()).to(x.dtype)


def _tile(width: int) -> tuple[int, int, int]:
    """(rows a program, columns a program, warps) for rows of `width`."""
    cols = triton.next_power_of_2(width)
    rows = max(1, TILE // cols)
    return rows, cols, 8 if rows * cols >= 4096 else 4


@triton.jit
def _tile_of(t, n_rows, stride, width: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr):
    """This program's tile of rows: their indices, its columns, the masks, and t's values in float32."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    live = rows < n_rows
    rows = rows.to(tl.int64)
    cols = tl.arange(0, BN)
    inside = cols < width
    mask = live[:, None] & inside[None, :]
    values = tl.load(t + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    return rows, cols, live, inside, mask, values


@triton.jit
def _forward_kernel(
    x, w, y, rstd, n_rows, stride_x, stride_y, eps,
    width: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr,
):  # fmt: skip
    rows, cols, live, inside, mask, xv = _tile_of(x, n_rows, stride_x, width, BR, BN)
    r = 1.0 / tl.sqrt(tl.sum(xv * xv, axis=1) / width + eps)
    wv = tl.load(w + cols, mask=inside, other=0.0).to(tl.float32)
    out = xv * r[:, None] * wv[None, :]
    tl.store(y + rows[:, None] * stride_y + cols[None, :], out.to(y.dtype.element_ty), mask=mask)
    tl.store(rstd + rows, r, mask=live)


@triton.jit
def _backward_kernel(
    g, x, w, rstd, dx, n_rows, stride_g, stride_x, stride_dx,
    width: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr,
):  # fmt: skip
    rows, cols, live, inside, mask, xv = _tile_of(x, n_rows, stride_x, width, BR, BN)
    gv = tl.load(g + rows[:, None] * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    wv = tl.load(w + cols, mask=inside, other=0.0).to(tl.float32)
    r = tl.load(rstd + rows, mask=live, other=0.0)
    gw = gv * wv[None, :]
    dot = tl.sum(gw * xv, axis=1) / width
    out = r[:, None] * (gw - xv * (r * r * dot)[:, None])
    tl.store(dx + rows[:, None] * stride_dx + cols[None, :], out.to(dx.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor, width: int) -> torch.Tensor:
    """`t` as [rows, width] with unit column stride (a view where it can be)."""
    t = t.reshape(-1, width)
    return t if t.stride(-1) == 1 else t.contiguous()


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        width = x.shape[-1]
        x2 = _rows(x, width)
        y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
        rstd = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
        br, bn, warps = _tile(width)
        if x2.shape[0]:
            with on_device(x.device):
                _forward_kernel[(triton.cdiv(x2.shape[0], br),)](
                    x2, weight, y, rstd, x2.shape[0], x2.stride(0), y.stride(0), eps,
                    width=width, BR=br, BN=bn, num_warps=warps,
                )  # fmt: skip
        ctx.save_for_backward(x2, weight, rstd)
        ctx.shape = x.shape
        return y.view(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x2, weight, rstd = ctx.saved_tensors
        width = x2.shape[1]
        g2 = _rows(grad, width)
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = torch.empty(x2.shape, dtype=x2.dtype, device=x2.device)
            br, bn, warps = _tile(width)
            if x2.shape[0]:
                with on_device(x2.device):
                    _backward_kernel[(triton.cdiv(x2.shape[0], br),)](
                        g2, x2, weight, rstd, dx, x2.shape[0], g2.stride(0), x2.stride(0), dx.stride(0),
                        width=width, BR=br, BN=bn, num_warps=warps,
                    )  # fmt: skip
            dx = dx.view(ctx.shape)
        if ctx.needs_input_grad[1]:  # a weight that trains: the sum over rows of g * normalized x
            dw = (g2.float() * x2.float() * rstd[:, None]).sum(0).to(weight.dtype)
        return dx, dw, None


def fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the kernel takes these tensors: one float dtype for both, a weight as wide as x's rows."""
    width = x.shape[-1] if x.dim() else 0
    return (
        x.dtype in DTYPES
        and weight.dtype == x.dtype
        and weight.dim() == 1
        and weight.shape[0] == width
        and 0 < width <= MAX_WIDTH
        and weight.is_contiguous()
    )


def pays(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the kernel takes these tensors and beats torch's on them: rows up to `NARROW` wide."""
    return fits(x, weight) and x.shape[-1] <= NARROW


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x's last dimension times `weight`, one Triton kernel each way (see `fits`)."""
    if not fits(x, weight):
        what = f"x {tuple(x.shape)} {x.dtype}, weight {tuple(weight.shape)} {weight.dtype}"
        raise ValueError(f"rms_norm: {what}")
    return _RMSNorm.apply(x, weight, eps)
