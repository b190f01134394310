"""Frozen expert weights under autograd: dequantized for the forward, dequantized again for backward.

The NF4 experts (`trainer.layers.experts4bit`) dequantize their weights for the forward; keeping them for
backward would hold every layer's 16-bit expert weights at once. These functions save nothing of the
weights: backward dequantizes them again (a chunk at a time, once, when their gradients arrive).

One exception pays: under non-reentrant gradient checkpointing (the trainer's), tensors saved in the
first forward are dropped at once, and the layer's recompute runs just before its backward. There the
dequant path's weights are saved (`PackedGroupedMM`, for a module `keep_for_backward` set): the
recompute's dequantization serves the backward too, one of a layer's three. The cost is memory in that
window only: a layer's experts' 16-bit weights of both projections (4.5 GiB for the story's 128 experts)
from its recompute through its backward, where otherwise one projection's (3 GiB) is dequantized at a
time. The profile chooses (`training.keep_dequantized_experts`, on by default; the plan counts it).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


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


def grouped_product(x: torch.Tensor, weights: torch.Tensor, offs: torch.Tensor, trans: bool) -> torch.Tensor:
    """Rows of x times their groups' dequantized weights [groups, out, in]: `x @ W.T`, or `x @ W` with
    trans (one `torch._grouped_mm`; `offs`: each group's end row)."""
    return torch._grouped_mm(x, weights if trans else weights.transpose(-2, -1), offs=offs)


class PackedGroupedMM(torch.autograd.Function):
    """Rows of x sorted by expert times their experts' frozen packed weights (`NF4Experts.packed_mm`: the
    fused kernel, or one dequantization of all experts and one grouped GEMM). Backward runs the transposed
    product, reading the packed weights again (ZeRO-3 gathers them again for backward); on the dequant
    path of a module that keeps them (`keep_for_backward`), it uses the forward's dequantized weights."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, owner: Any, which: str, ids: torch.Tensor, offs: torch.Tensor, path: str
    ) -> torch.Tensor:
        ctx.owner, ctx.which, ctx.path = owner, which, path
        ctx.kept = path == "dequant" and owner.keep_dequantized
        if ctx.kept:
            weights, all_offs = owner.dequantized(which, x, ids, offs)
            ctx.save_for_backward(weights, all_offs)
            return grouped_product(x, weights, all_offs, trans=False)
        ctx.save_for_backward(ids, offs)
        return owner.packed_mm(which, x, ids, offs, trans=False, path=path)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None, None, None]:
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad = grad.contiguous()
            if ctx.kept:
                weights, all_offs = ctx.saved_tensors
                grad_x = grouped_product(grad, weights, all_offs, trans=True)
            else:
                expert_ids, offs = ctx.saved_tensors
                grad_x = ctx.owner.packed_mm(ctx.which, grad, expert_ids, offs, trans=True, path=ctx.path)
        return grad_x, None, None, None, None, None


def keep_for_backward(model: nn.Module) -> int:
    """Let every NF4 experts module of `model` keep its dequantized weights for backward; only for a model
    under non-reentrant gradient checkpointing (see the module docstring). Returns how many."""
    count = 0
    for module in model.modules():
        if hasattr(module, "keep_dequantized"):
            module.keep_dequantized = True
            count += 1
    return count
