"""Frozen expert weights under autograd: dequantized for the forward, never saved for backward.

The NF4 experts (`trainer.experts4bit`) dequantize a chunk of experts' weights for the forward; keeping
them for backward would hold every expert's 16-bit weights at once. These functions save nothing of the
weights: backward asks the chunk to dequantize them again, once, when their gradients arrive.
"""

from __future__ import annotations

from typing import Any

import torch


class DequantChunk:
    """The experts of one forward chunk, dequantized again (once, lazily) when their gradients arrive."""

    def __init__(self, owner: Any, which: str, experts: list[int]) -> None:
        self.owner, self.which, self.experts = owner, which, experts
        self.pending = len(experts)
        self.weights: torch.Tensor | None = None

    def take_all(self) -> torch.Tensor:
        weights = (
            self.weights if self.weights is not None else self.owner.dequantize(self.which, self.experts)
        )
        self.weights = None
        return weights

    def take(self, j: int) -> torch.Tensor:
        if self.weights is None:
            self.weights = self.owner.dequantize(self.which, self.experts)
        weight = self.weights[j]
        self.pending -= 1
        if self.pending <= 0:
            self.weights = None
        return weight


class FrozenExpertLinear(torch.autograd.Function):
    """y = x @ W.T for a frozen dequantized expert weight, which backward dequantizes again (never saved)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, chunk: DequantChunk, j: int) -> torch.Tensor:
        ctx.chunk, ctx.j = chunk, j
        return torch.nn.functional.linear(x, weight)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        weight = ctx.chunk.take(ctx.j)
        grad_x = grad @ weight.to(grad.dtype) if ctx.needs_input_grad[0] else None
        return grad_x, None, None, None


class FrozenExpertsGrouped(torch.autograd.Function):
    """Rows of x sorted by expert times their experts' frozen weights in one grouped GEMM; backward
    dequantizes the chunk again instead of saving it."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weights: torch.Tensor, offs: torch.Tensor, chunk: DequantChunk
    ) -> torch.Tensor:
        ctx.chunk = chunk
        ctx.save_for_backward(offs)
        return torch._grouped_mm(x, weights.transpose(-2, -1), offs=offs)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        (offs,) = ctx.saved_tensors
        weights = ctx.chunk.take_all()
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = torch._grouped_mm(grad.contiguous(), weights.to(grad.dtype), offs=offs)
        return grad_x, None, None, None
