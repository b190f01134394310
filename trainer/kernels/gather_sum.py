"""Each token's sum over its k expert pairs' rows, gathered in one pass: `out[t] = sum_j x[index[t, j]]`.

The experts' outputs come sorted by expert ([T * k, H], a row a token-expert pair); a token's output is
the sum of its k rows. In torch that is a gather into token order ([T * k, H] written, then read again)
and a sum over k: here one kernel reads each pair's row once where it lies and writes the token's sum,
accumulated in float32 and rounded once to the rows' dtype. The same sum is the backward of spreading a
token to its k pairs (`trainer.layers.routing`, whose `gather_sum_torch` is the same sum in torch: the CPU's
path and the tests' reference).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trainer.kernels.device import on_device

BLOCK_TOKENS = 8
BLOCK_COLS = 256


@triton.jit
def _gather_sum_kernel(
    x, index, out, n_tokens, stride_x, stride_out,
    width: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr,
):  # fmt: skip
    tokens = tl.program_id(0) * BT + tl.arange(0, BT)
    live = tokens < n_tokens
    tokens = tokens.to(tl.int64)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    mask = live[:, None] & (cols < width)[None, :]
    acc = tl.zeros([BT, BN], dtype=tl.float32)
    for j in tl.static_range(K):
        rows = tl.load(index + tokens * K + j, mask=live, other=0).to(tl.int64)
        acc += tl.load(x + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(out + tokens[:, None] * stride_out + cols[None, :], acc.to(out.dtype.element_ty), mask=mask)


def gather_sum(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """[N, H] rows and [T, k] row indices -> [T, H], each token's k rows summed, in one Triton kernel."""
    if x.dim() != 2 or index.dim() != 2:
        raise ValueError(f"gather_sum: rows {tuple(x.shape)}, index {tuple(index.shape)}")
    x = x if x.stride(-1) == 1 else x.contiguous()
    index = index.contiguous()
    tokens, k = index.shape
    width = x.shape[1]
    out = torch.empty(tokens, width, dtype=x.dtype, device=x.device)
    if tokens and width:
        grid = (triton.cdiv(tokens, BLOCK_TOKENS), triton.cdiv(width, BLOCK_COLS))
        with on_device(x.device):
            _gather_sum_kernel[grid](
                x, index, out, tokens, x.stride(0), out.stride(0),
                width=width, K=k, BT=BLOCK_TOKENS, BN=BLOCK_COLS,
            )  # fmt: skip
    return out
