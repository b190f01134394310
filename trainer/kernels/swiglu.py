"""The experts' activation with each pair's routing weight, one kernel each way: `silu(gate) * up * w`.

The gate/up GEMM gives `gu = [gate | up]` ([N, 2w], one row a token-expert pair sorted by expert). In
torch the activation is four kernels on the strided halves (silu, the product with `up`, the routing
weight's broadcast product, and in backward their gradients and a concatenation into d(gu)), most of
them on torch's slow path for non-contiguous tensors. Here one pass reads `gu` and writes `h` ([N, w]);
the backward reads `gu` and dh and writes d(gu) and, in the same pass, the weights' gradient (each
row's sum of dh * silu(gate) * up). The arithmetic is float32 inside, rounded once to the output's
dtype (torch rounds after each of its kernels); `reference` is the same formula in torch.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from trainer.fast_path import FastPath
from trainer.kernels.device import on_device

KERNEL = FastPath("fused expert activation", "torch's")

BLOCK_ROWS = 16
BLOCK_COLS = 256


def is_silu(act_fn: Any) -> bool:
    """Whether an experts module's activation is SiLU (torch's or Transformers' class), the one fused here."""
    return type(act_fn).__name__ in ("SiLU", "SiLUActivation")


def reference(gu: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up * weight` in float32 torch, rounded once to gu's dtype (the tests' reference)."""
    gate, up = gu.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up * weights.float().reshape(-1, 1)).to(gu.dtype)


@triton.jit
def _rows(wts, n_rows, BM: tl.constexpr):
    """This program's rows (int64), which of them exist, and their routing weights in float32."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    live = rows < n_rows
    rows = rows.to(tl.int64)
    return rows, live, tl.load(wts + rows, mask=live, other=0.0).to(tl.float32)


@triton.jit
def _gate_up(gu, rows, live, stride_gu, c0, width: tl.constexpr, BN: tl.constexpr):
    """Columns c0.. of the rows' gate and up halves in float32, with the columns and the mask."""
    cols = c0 + tl.arange(0, BN)
    mask = live[:, None] & (cols < width)[None, :]
    at = gu + rows[:, None] * stride_gu + cols[None, :]
    g = tl.load(at, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(at + width, mask=mask, other=0.0).to(tl.float32)
    return cols, mask, g, u


@triton.jit
def _forward_kernel(
    gu, wts, out, n_rows, stride_gu, stride_out, width: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr
):
    rows, live, w = _rows(wts, n_rows, BM)
    for c0 in range(0, width, BN):
        cols, mask, g, u = _gate_up(gu, rows, live, stride_gu, c0, width, BN)
        h = g * tl.sigmoid(g) * u * w[:, None]
        tl.store(out + rows[:, None] * stride_out + cols[None, :], h.to(out.dtype.element_ty), mask=mask)


@triton.jit
def _backward_kernel(
    gu, wts, dh, dgu, dw, n_rows, stride_gu, stride_dh, stride_dgu,
    width: tl.constexpr, WANT_DW: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
):  # fmt: skip
    rows, live, w = _rows(wts, n_rows, BM)
    acc = tl.zeros([BM], dtype=tl.float32)
    for c0 in range(0, width, BN):
        cols, mask, g, u = _gate_up(gu, rows, live, stride_gu, c0, width, BN)
        d = tl.load(dh + rows[:, None] * stride_dh + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        s = tl.sigmoid(g)
        silu = g * s
        dw_rows = d * w[:, None]
        d_up = dw_rows * silu
        d_gate = dw_rows * u * s * (1.0 + g * (1.0 - s))
        to = dgu + rows[:, None] * stride_dgu + cols[None, :]
        tl.store(to, d_gate.to(dgu.dtype.element_ty), mask=mask)
        tl.store(to + width, d_up.to(dgu.dtype.element_ty), mask=mask)
        if WANT_DW:
            acc += tl.sum(d * silu * u, axis=1)
    if WANT_DW:
        tl.store(dw + rows, acc, mask=live)


class _SwigluRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, gu: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        gu = gu if gu.stride(-1) == 1 else gu.contiguous()
        flat = weights.reshape(-1).contiguous()
        n, width = gu.shape[0], gu.shape[1] // 2
        out = torch.empty(n, width, dtype=gu.dtype, device=gu.device)
        if n:
            with on_device(gu.device):
                _forward_kernel[(triton.cdiv(n, BLOCK_ROWS),)](
                    gu, flat, out, n, gu.stride(0), out.stride(0), width=width, BM=BLOCK_ROWS, BN=BLOCK_COLS
                )
        ctx.save_for_backward(gu, flat)
        ctx.weights_shape, ctx.weights_dtype = weights.shape, weights.dtype
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dh: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        gu, flat = ctx.saved_tensors
        dh = dh if dh.stride(-1) == 1 else dh.contiguous()
        n, width = gu.shape[0], gu.shape[1] // 2
        want_dw = ctx.needs_input_grad[1]
        dgu = torch.empty_like(gu)
        dw = torch.empty(n, dtype=torch.float32, device=gu.device) if want_dw else flat
        if n:
            with on_device(gu.device):
                _backward_kernel[(triton.cdiv(n, BLOCK_ROWS),)](
                    gu, flat, dh, dgu, dw, n, gu.stride(0), dh.stride(0), dgu.stride(0),
                    width=width, WANT_DW=want_dw, BM=BLOCK_ROWS, BN=BLOCK_COLS,
                )  # fmt: skip
        grad_w = dw.to(ctx.weights_dtype).reshape(ctx.weights_shape) if want_dw else None
        return dgu, grad_w


def swiglu_rows(gu: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`silu(gu[:, :w]) * gu[:, w:] * weights` ([N, 2w] and N weights, any shape of N elements) -> [N, w],
    differentiable in both, one Triton kernel each way."""
    if gu.dim() != 2 or gu.shape[1] % 2 or weights.numel() != gu.shape[0]:
        raise ValueError(f"swiglu_rows: gu {tuple(gu.shape)} with {weights.numel()} weights")
    return _SwigluRows.apply(gu, weights)


def activate(gu: torch.Tensor, weights: torch.Tensor, act_fn: Any, fused: bool = True) -> torch.Tensor:
    """`act_fn(gate) * up * weights` of sorted pairs: `swiglu_rows` for SiLU where `fused`, torch's kernels
    otherwise, and from then on where the kernel fails here (out of memory is raised, not a failure)."""
    if fused and is_silu(act_fn):
        h = KERNEL.run(lambda: swiglu_rows(gu, weights))
        if h is not None:
            return h
    gate, up = gu.chunk(2, dim=-1)
    return act_fn(gate) * up * weights.to(gu.dtype)
