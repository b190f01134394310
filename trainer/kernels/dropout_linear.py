"""Dropout and LoRA's A matrix in one pass: `h = dropout(x, p) @ A.T`, the mask drawn inside the kernel.

PEFT's LoRA computes `lora_A(dropout(x))`: the dropout writes a new [tokens, in] tensor (the width of the
hidden state, 4,096, or 8,192 for the output projection) and the narrow product reads it again; backward
scales the input gradient by the mask in one more pass, and the dropped input is saved for the weight's
gradient. On the story's profile that is four such dropouts a layer, in forward and in recompute, 3.3 ms
of a further layer's 118 (`benchmarks/results/step_speed_h200_lora_profile.md`).

Here the forward reads x once and writes only the rank-wide h; the mask is never stored. Each value's
keep bit comes from Philox (`tl.randint4x`, one call for four neighbouring values) at its (row, column)
under a seed, so it does not depend on the tiling: the backward draws the same bits again, writing the
input's gradient `(g @ A) * mask / (1 - p)` and summing A's gradient `g.T @ (x * mask / (1 - p))` over
the rows (float32, one atomic add a tile). The seed is drawn from torch's generator on x's device at each
forward, so gradient checkpointing's recompute, which restores that generator, draws the same mask.

The arithmetic is PEFT's: the dropped value `x / (1 - p)` in float32 rounded to x's dtype, the product
accumulated in float32 and rounded to the weight's dtype (x and the weight share it here). The mask is
another draw than torch's dropout (a value is kept with probability 1 - p, as there).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from trainer.kernels.device import on_device

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_RANK = 128  # wider adapters: PEFT's path (the kernels hold a rank-wide tile in registers)
BM, BK = 64, 256  # rows and input columns a tile (four quarters, one Philox word each)
GROUP_M = 8  # row tiles a backward program sums into its one atomic add of A's gradient
WARPS = 4


@triton.jit
def _words(seed, rows, k0, quads, BQ: tl.constexpr):
    """Four 32-bit Philox words for each row and each column of the quarter tiles at k0 (counter: row x
    quads + k0 / 4 + column within the quarter; word j for quarter j)."""
    q = k0 // 4 + tl.arange(0, BQ)
    return tl.randint4x(seed, rows[:, None] * quads + q[None, :])


@triton.jit
def _forward_quarter(
    acc, x, w, rows, live, ns, n_in, c0, K, stride_x, stride_w, word, thresh, scale,
    BQ: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    cols = c0 + tl.arange(0, BQ)
    c_in = cols < K
    xv = tl.load(x + rows[:, None] * stride_x + cols[None, :], mask=live[:, None] & c_in[None, :], other=0.0)
    xd = tl.where(word >= thresh, xv.to(tl.float32) * scale, 0.0).to(xv.dtype)
    wv = tl.load(w + ns[None, :] * stride_w + cols[:, None], mask=n_in[None, :] & c_in[:, None], other=0.0)
    return tl.dot(xd, wv, acc, input_precision=PRECISION)


@triton.jit
def _forward_kernel(
    x, w, h, seed_ptr, M, K, quads, N, stride_x, stride_w, stride_h, thresh, scale,
    BM: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    BQ: tl.constexpr = BK // 4
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    live = rows < M
    rows = rows.to(tl.int64)
    ns = tl.arange(0, BN)
    n_in = ns < N
    seed = tl.load(seed_ptr)
    thresh = thresh.to(tl.uint32)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        r0, r1, r2, r3 = _words(seed, rows, k0, quads, BQ)
        args = (x, w, rows, live, ns, n_in)
        acc = _forward_quarter(acc, *args, k0, K, stride_x, stride_w, r0, thresh, scale, BQ, PRECISION)
        acc = _forward_quarter(acc, *args, k0 + BQ, K, stride_x, stride_w, r1, thresh, scale, BQ, PRECISION)
        acc = _forward_quarter(
            acc, *args, k0 + 2 * BQ, K, stride_x, stride_w, r2, thresh, scale, BQ, PRECISION
        )
        acc = _forward_quarter(
            acc, *args, k0 + 3 * BQ, K, stride_x, stride_w, r3, thresh, scale, BQ, PRECISION
        )
    tl.store(h + rows[:, None] * stride_h + ns[None, :], acc.to(h.dtype.element_ty),
             mask=live[:, None] & n_in[None, :])  # fmt: skip


@triton.jit
def _backward_quarter(
    acc, x, dx, wv, gv, rows, live, c0, K, stride_x, stride_dx, word, thresh, scale,
    BQ: tl.constexpr, WANT_DX: tl.constexpr, WANT_DW: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    cols = c0 + tl.arange(0, BQ)
    tile = live[:, None] & (cols < K)[None, :]
    keep = word >= thresh
    if WANT_DX:
        dxv = tl.where(keep, tl.dot(gv, wv, input_precision=PRECISION) * scale, 0.0)
        tl.store(dx + rows[:, None] * stride_dx + cols[None, :], dxv.to(dx.dtype.element_ty), mask=tile)
    if WANT_DW:
        xv = tl.load(x + rows[:, None] * stride_x + cols[None, :], mask=tile, other=0.0)
        xd = tl.where(keep, xv.to(tl.float32) * scale, 0.0).to(xv.dtype)
        acc = tl.dot(tl.trans(gv), xd, acc, input_precision=PRECISION)
    return acc


@triton.jit
def _weight_quarter(w, ns, n_in, c0, K, stride_w, BQ: tl.constexpr):
    cols = c0 + tl.arange(0, BQ)
    return tl.load(
        w + ns[:, None] * stride_w + cols[None, :], mask=n_in[:, None] & (cols < K)[None, :], other=0.0
    )


@triton.jit
def _add_quarter(dw, acc, ns, n_in, c0, K, BQ: tl.constexpr):
    cols = c0 + tl.arange(0, BQ)
    tl.atomic_add(dw + ns[:, None] * K + cols[None, :], acc, mask=n_in[:, None] & (cols < K)[None, :])


@triton.jit
def _backward_kernel(
    x, w, g, dx, dw, seed_ptr, M, K, quads, N, stride_x, stride_w, stride_g, stride_dx, thresh, scale,
    BM: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr,
    WANT_DX: tl.constexpr, WANT_DW: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    BQ: tl.constexpr = BK // 4
    k0 = tl.program_id(0) * BK
    ns = tl.arange(0, BN)
    n_in = ns < N
    seed = tl.load(seed_ptr)
    thresh = thresh.to(tl.uint32)
    w0 = _weight_quarter(w, ns, n_in, k0, K, stride_w, BQ)
    w1 = _weight_quarter(w, ns, n_in, k0 + BQ, K, stride_w, BQ)
    w2 = _weight_quarter(w, ns, n_in, k0 + 2 * BQ, K, stride_w, BQ)
    w3 = _weight_quarter(w, ns, n_in, k0 + 3 * BQ, K, stride_w, BQ)
    a0 = tl.zeros([BN, BQ], dtype=tl.float32)
    a1 = tl.zeros([BN, BQ], dtype=tl.float32)
    a2 = tl.zeros([BN, BQ], dtype=tl.float32)
    a3 = tl.zeros([BN, BQ], dtype=tl.float32)
    for i in range(GROUP_M):
        rows = (tl.program_id(1) * GROUP_M + i) * BM + tl.arange(0, BM)
        live = rows < M
        rows = rows.to(tl.int64)
        gv = tl.load(
            g + rows[:, None] * stride_g + ns[None, :], mask=live[:, None] & n_in[None, :], other=0.0
        )
        r0, r1, r2, r3 = _words(seed, rows, k0, quads, BQ)
        args = (x, dx)
        rest = (K, stride_x, stride_dx)
        a0 = _backward_quarter(
            a0, *args, w0, gv, rows, live, k0, *rest, r0, thresh, scale, BQ, WANT_DX, WANT_DW, PRECISION
        )
        a1 = _backward_quarter(
            a1, *args, w1, gv, rows, live, k0 + BQ, *rest, r1, thresh, scale, BQ, WANT_DX, WANT_DW, PRECISION
        )
        a2 = _backward_quarter(
            a2,
            *args,
            w2,
            gv,
            rows,
            live,
            k0 + 2 * BQ,
            *rest,
            r2,
            thresh,
            scale,
            BQ,
            WANT_DX,
            WANT_DW,
            PRECISION,
        )
        a3 = _backward_quarter(
            a3,
            *args,
            w3,
            gv,
            rows,
            live,
            k0 + 3 * BQ,
            *rest,
            r3,
            thresh,
            scale,
            BQ,
            WANT_DX,
            WANT_DW,
            PRECISION,
        )
    if WANT_DW:
        _add_quarter(dw, a0, ns, n_in, k0, K, BQ)
        _add_quarter(dw, a1, ns, n_in, k0 + BQ, K, BQ)
        _add_quarter(dw, a2, ns, n_in, k0 + 2 * BQ, K, BQ)
        _add_quarter(dw, a3, ns, n_in, k0 + 3 * BQ, K, BQ)


def _launch_args(x: torch.Tensor, p: float) -> dict[str, Any]:
    """The mask's threshold on a 32-bit draw and the kept values' scale, the dot's precision for dtype,
    the Philox counters a row (its tiles' quarters, so that no two values share a word), the tiles."""
    k = x.shape[-1]
    return {
        "quads": triton.cdiv(k, BK) * (BK // 4),
        "BM": BM,
        "BK": BK,
        "num_warps": WARPS,
        "thresh": int(p * 2**32),
        "scale": 1.0 / (1.0 - p),
        "PRECISION": "ieee" if x.dtype == torch.float32 else "tf32",
    }


class _DropoutLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, p: float, seed: torch.Tensor) -> Any:
        k, n = x.shape[-1], weight.shape[0]
        x2 = x.reshape(-1, k)
        x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
        h = torch.empty(x2.shape[0], n, dtype=weight.dtype, device=x.device)
        bn = max(16, triton.next_power_of_2(n))
        if x2.shape[0]:
            with on_device(x.device):
                _forward_kernel[(triton.cdiv(x2.shape[0], BM),)](
                    x2, weight, h, seed, x2.shape[0], k, N=n, stride_x=x2.stride(0),
                    stride_w=weight.stride(0), stride_h=h.stride(0), BN=bn, **_launch_args(x, p),
                )  # fmt: skip
        ctx.save_for_backward(x2, weight, seed)
        ctx.p, ctx.shape = p, x.shape
        return h.view(*x.shape[:-1], n)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
        x2, weight, seed = ctx.saved_tensors
        m, k = x2.shape
        n = weight.shape[0]
        g2 = grad.reshape(m, n).to(x2.dtype).contiguous()
        want_dx, want_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dx = torch.empty_like(x2) if want_dx else None
        dw = torch.zeros(n, k, dtype=torch.float32, device=x2.device) if want_dw else None
        if m and (want_dx or want_dw):
            grid = (triton.cdiv(k, BK), triton.cdiv(m, BM * GROUP_M))
            with on_device(x2.device):
                _backward_kernel[grid](
                    x2, weight, g2, x2 if dx is None else dx, x2 if dw is None else dw, seed, m, k,
                    N=n, stride_x=x2.stride(0), stride_w=weight.stride(0), stride_g=g2.stride(0),
                    stride_dx=k, BN=max(16, triton.next_power_of_2(n)), GROUP_M=GROUP_M,
                    WANT_DX=want_dx, WANT_DW=want_dw, **_launch_args(x2, ctx.p),
                )  # fmt: skip
        if dx is not None:
            dx = dx.view(ctx.shape)
        if dw is not None:
            dw = dw.to(weight.dtype) if m else torch.zeros_like(weight)
        return dx, dw, None, None


def fits(x: torch.Tensor, weight: torch.Tensor, p: float) -> bool:
    """Whether the kernels take these: one float dtype, a [rank, in] weight with unit column stride, an
    input width divisible by 4 (the Philox words), a rank up to `MAX_RANK`, 0 < p < 1."""
    return (
        x.dtype in DTYPES
        and weight.dtype == x.dtype
        and weight.dim() == 2
        and weight.shape[1] == x.shape[-1]
        and weight.stride(1) == 1
        and x.shape[-1] % 4 == 0
        and 0 < weight.shape[0] <= MAX_RANK
        and 0.0 < p < 1.0
    )


def probe(device: torch.device, dtype: torch.dtype) -> None:
    """Both kernels once on a small problem of `dtype` on `device`, under a fixed seed (torch's generator
    untouched): raises where they do not build or run here, before a real call draws its mask."""
    # Its own graph, outside any caller's saved-tensor hooks: checkpointing counts the tensors a forward
    # saves, and its recompute (which runs no probe) must save as many.
    identity = torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
    with torch.enable_grad(), identity:
        x = torch.ones(32, 64, device=device, dtype=dtype, requires_grad=True)
        weight = torch.ones(16, 64, device=device, dtype=dtype, requires_grad=True)
        seed = torch.zeros(1, dtype=torch.int64, device=device)
        dropout_linear(x, weight, 0.5, seed).sum().backward()


def draw_seed(device: torch.device) -> torch.Tensor:
    """A Philox seed from torch's generator on `device` (one int64, left on the device: no host sync)."""
    return torch.randint(1 << 62, (1,), dtype=torch.int64, device=device)


def dropout_linear(
    x: torch.Tensor, weight: torch.Tensor, p: float, seed: torch.Tensor | None = None
) -> torch.Tensor:
    """`dropout(x, p) @ weight.T` in one Triton kernel each way (see `fits`); the mask from `seed`, else
    from a seed drawn from torch's generator (`draw_seed`)."""
    if not fits(x, weight, p):
        what = f"x {tuple(x.shape)} {x.dtype}, weight {tuple(weight.shape)} {weight.dtype}, p {p}"
        raise ValueError(f"dropout_linear: {what}")
    return _DropoutLinear.apply(x, weight, p, draw_seed(x.device) if seed is None else seed)
