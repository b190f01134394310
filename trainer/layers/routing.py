"""Token-expert pairs sorted by expert and back, with permutation backwards (no index accumulation).

A token routed to k experts is k pairs. The expert paths sort the pairs by expert, compute each
expert's rows as one group, and sum each token's k results. Plain indexing would do this, but the
backward of `x[index]` is an accumulating `index_put_` (a sort of the indices and a segmented reduce on
the GPU) even where the index is a permutation. Here the backwards are gathers: the inverse permutation,
and for the spread of each token to its k pairs, a sum over the k rows of the token.

Each token's sum over its k pairs (the combine, and the spread's backward) reads the pairs' rows where
they lie and writes the sums, one Triton kernel on a GPU (`trainer.kernels.gather_sum`), rather than
gathering them into token order first.

The routing weight of each pair is applied where it is cheapest: `weight_rows` scales the expert's
intermediate activation (`moe_intermediate_size` wide) rather than its output (`hidden_size` wide),
which the down projection's linearity allows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from trainer.fast_path import FastPath

# Off for the speed benchmark's control row: COCKPIT_FAST_ROUTING=0 (plain indexing, weights on outputs).
ENABLED = os.environ.get("COCKPIT_FAST_ROUTING", "1") != "0"
# Off for its control row: COCKPIT_FUSED_COMBINE=0 (a gather into token order, then torch's sum).
FUSED_COMBINE = os.environ.get("COCKPIT_FUSED_COMBINE", "1") != "0"
COMBINE_KERNEL = FastPath("fused combine", "torch's gather and sum")
KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # the kernel sums in float32


@dataclass(frozen=True)
class SortedPairs:
    """Pairs sorted by expert: `perm[i]` is the flat (token * k + slot) index of sorted pair i, `unsort`
    its inverse, `offs[e]` the pairs routed to experts <= e (int32; "no expert", index num_experts,
    sorts last)."""

    perm: torch.Tensor
    unsort: torch.Tensor
    offs: torch.Tensor
    k: int

    @classmethod
    def of(cls, top_k_index: torch.Tensor, num_experts: int) -> SortedPairs:
        k = top_k_index.shape[-1]
        with torch.no_grad():
            expert_sorted, perm = torch.sort(top_k_index.reshape(-1), stable=True)
            bounds = torch.arange(1, num_experts + 1, device=perm.device, dtype=expert_sorted.dtype)
            offs = torch.searchsorted(expert_sorted, bounds, out_int32=True)
            unsort = torch.empty_like(perm)
            unsort.scatter_(0, perm, torch.arange(perm.numel(), device=perm.device))
        return cls(perm=perm, unsort=unsort, offs=offs, k=k)


def gather_sum_torch(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`rows[index]` summed over the index's last dimension, in torch: [N, H] rows, [T, k] indices ->
    [T, H] (a gather into token order, then a sum over k; `trainer.kernels.gather_sum` in one pass)."""
    return rows[index.reshape(-1)].view(*index.shape, rows.shape[-1]).sum(dim=1)


def _gather_sum_kernel(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    from trainer.kernels.gather_sum import gather_sum  # Triton: imported where the kernel is tried

    return gather_sum(rows, index)


def sum_pairs(rows: torch.Tensor, unsort: torch.Tensor, k: int) -> torch.Tensor:
    """Each token's sum of its k pairs' rows, sorted order in, token order out ([T * k, H] -> [T, H]): the
    gather-sum kernel on a GPU where it runs, torch's gather and sum otherwise (and from then on where the
    kernel fails here; out of memory is raised, not a failure)."""
    index = unsort.view(-1, k)
    if FUSED_COMBINE and rows.is_cuda and rows.dtype in KERNEL_DTYPES:
        out = COMBINE_KERNEL.run(lambda: _gather_sum_kernel(rows, index))
        if out is not None:
            return out
    return gather_sum_torch(rows, index)


class _SpreadToPairs(torch.autograd.Function):
    """rows[i] = hidden[perm[i] // k]; backward: each token's k pair gradients summed (`sum_pairs`)."""

    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, perm: torch.Tensor, unsort: torch.Tensor, k: int
    ) -> torch.Tensor:
        ctx.save_for_backward(unsort)
        ctx.k = k
        return hidden[perm // k]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        (unsort,) = ctx.saved_tensors
        return sum_pairs(grad, unsort, ctx.k), None, None, None


class _SumPairs(torch.autograd.Function):
    """tokens[t] = the sum of its k pairs' rows (`sum_pairs`); backward: each pair's row its token's
    gradient (a gather): the spread's mirror."""

    @staticmethod
    def forward(
        ctx: Any, rows: torch.Tensor, perm: torch.Tensor, unsort: torch.Tensor, k: int
    ) -> torch.Tensor:
        ctx.save_for_backward(perm)
        ctx.k = k
        return sum_pairs(rows, unsort, k)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        (perm,) = ctx.saved_tensors
        return grad[perm // ctx.k], None, None, None


class _Permute(torch.autograd.Function):
    """out = x[index] for a permutation `index` with inverse `inverse`; backward: grad[inverse]."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, index: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(inverse)
        return x[index]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (inverse,) = ctx.saved_tensors
        return grad[inverse], None, None


def spread(hidden: torch.Tensor, pairs: SortedPairs) -> torch.Tensor:
    """Each sorted pair's token row ([T, H] -> [T * k, H])."""
    if ENABLED:
        return _SpreadToPairs.apply(hidden, pairs.perm, pairs.unsort, pairs.k)
    return hidden[pairs.perm // pairs.k]


def pair_weights(top_k_weights: torch.Tensor, pairs: SortedPairs) -> torch.Tensor:
    """Each sorted pair's routing weight, as a column ([T * k, 1])."""
    flat = top_k_weights.reshape(-1)
    return (_Permute.apply(flat, pairs.perm, pairs.unsort) if ENABLED else flat[pairs.perm])[:, None]


def combine(rows: torch.Tensor, pairs: SortedPairs, top_k_weights: torch.Tensor | None) -> torch.Tensor:
    """Each token's sum over its k pairs' rows (sorted order in, token order out): [T * k, H] -> [T, H].
    `top_k_weights` weighs the rows first, where `weight_rows` did not already."""
    if ENABLED and FUSED_COMBINE and top_k_weights is None:
        return _SumPairs.apply(rows, pairs.perm, pairs.unsort, pairs.k)
    tokens = _Permute.apply(rows, pairs.unsort, pairs.perm) if ENABLED else rows[pairs.unsort]
    tokens = tokens.view(-1, pairs.k, rows.shape[-1])
    if top_k_weights is not None:
        tokens = tokens * top_k_weights.reshape(-1, pairs.k)[..., None]
    return tokens.sum(dim=1)
