"""The language-model head and its cross-entropy in chunks: the logits are never whole in memory.

With a 151,936-token vocabulary, a 4,096-token micro-batch has 622 M logits: 1.2 GB in bf16 and 2.5 GB
once the loss upcasts them, plus their gradient. Here only rows that have a target go through the head,
a few hundred at a time (`cockpit.contract.loss_chunk_rows`); each chunk's logits give its loss and, at
once, its gradient with respect to the hidden states (the loss is the last operation, so the gradient is
known up to the scalar that backward brings). Backward only scales what forward kept: the head's
GEMM runs twice per target row (logits, then hidden-state gradient), as in the unchunked path, and the
frozen head gets no weight gradient.

`use_chunked_loss(model)` switches a Transformers causal LM to this head in place (the head module keeps
its identity, so ZeRO-3's hooks still gather its weight for forward and backward).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from cockpit.contract import loss_chunk_rows
from trainer.inputs.data import IGNORE


class _LinearCrossEntropy(torch.autograd.Function):
    """sum over rows of CE(h @ W.T, target), with the gradient for h computed in the forward pass."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int
    ) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        grad_h = torch.empty_like(h) if h.requires_grad else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if weight.requires_grad else None
        w = weight.to(h.dtype)
        for s in range(0, h.shape[0], chunk):
            hc, tc = h[s : s + chunk], targets[s : s + chunk]
            logits = (hc @ w.t()).float()
            lse = torch.logsumexp(logits, dim=-1)
            total += (lse - logits.gather(1, tc[:, None])[:, 0]).sum()
            if grad_h is not None or grad_w is not None:
                probs = logits.sub_(lse[:, None]).exp_()  # softmax, in place of the logits
                probs[torch.arange(tc.shape[0], device=tc.device), tc] -= 1.0
                dlogits = probs.to(h.dtype)
                if grad_h is not None:
                    grad_h[s : s + chunk] = dlogits @ w
                if grad_w is not None:
                    grad_w += (dlogits.t() @ hc).float()
                del probs, dlogits
            # freed before the next chunk's logits exist: one chunk alive at a time, not two
            del logits, lse
        ctx.save_for_backward(*(g for g in (grad_h, grad_w) if g is not None))
        ctx.has = (grad_h is not None, grad_w is not None)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
        saved = list(ctx.saved_tensors)
        grad_h = grad_w = None
        if ctx.has[0]:
            grad_h = saved.pop(0)
            grad_h = grad_h * grad.to(grad_h.dtype)
        if ctx.has[1]:
            grad_w = (saved.pop(0) * grad).to(ctx.weight_dtype)
        return grad_h, grad_w, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch: torch.Tensor | int | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """Causal-LM loss of `hidden` [B, T, H] through the head `weight` [V, H] against `labels` [B, T].

    Position t predicts label t + 1; `-100` is ignored. The mean over targets, or the sum over
    `num_items_in_batch` when the Trainer gives it (gradient accumulation), as Transformers' loss does.
    """
    targets = labels[:, 1:].reshape(-1)
    rows = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    keep = (targets != IGNORE).nonzero()[:, 0]
    rows, targets = rows.index_select(0, keep), targets.index_select(0, keep)
    size = chunk or loss_chunk_rows(weight.shape[0])
    total = _LinearCrossEntropy.apply(rows, weight, targets, size)
    if num_items_in_batch is None:
        return total / max(1, targets.shape[0])
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def _group_targets(
    labels: torch.Tensor, groups: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flat indices of the positions that predict a target of a group, their targets and groups.

    Position t predicts label t + 1, which belongs to group `groups[:, t + 1]` (-1: none).
    """
    targets, owner = labels[:, 1:].reshape(-1), groups[:, 1:].reshape(-1)
    keep = ((targets != IGNORE) & (owner >= 0)).nonzero()[:, 0]
    return keep, targets.index_select(0, keep), owner.index_select(0, keep)


def _add_by_group(losses: torch.Tensor, owner: torch.Tensor, out: torch.Tensor) -> None:
    out[0].index_add_(0, owner, losses)
    out[1].index_add_(0, owner, torch.ones_like(losses))


@torch.no_grad()
def grouped_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    groups: torch.Tensor,
    n_groups: int,
    chunk: int | None = None,
) -> torch.Tensor:
    """Summed cross-entropy and target count per group, [2, n_groups], through the head in chunks.

    Validation packs the examples of several tenants into one batch; `groups` [B, T] says whose each token
    is, so one forward gives every tenant's loss, the logits never whole in memory.
    """
    keep, targets, owner = _group_targets(labels, groups)
    rows = hidden[:, :-1].reshape(-1, hidden.shape[-1]).index_select(0, keep)
    out = torch.zeros(2, n_groups, dtype=torch.float32, device=hidden.device)
    w = weight.to(rows.dtype)
    size = chunk or loss_chunk_rows(weight.shape[0])
    for s in range(0, rows.shape[0], size):
        logits = (rows[s : s + size] @ w.t()).float()
        tc = targets[s : s + size]
        losses = torch.logsumexp(logits, dim=-1) - logits.gather(1, tc[:, None])[:, 0]
        _add_by_group(losses, owner[s : s + size], out)
    return out


@torch.no_grad()
def grouped_cross_entropy_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor, n_groups: int
) -> torch.Tensor:
    """The same sums from whole logits [B, T, V] (a model without the chunked head)."""
    keep, targets, owner = _group_targets(labels, groups)
    picked = logits[:, :-1].reshape(-1, logits.shape[-1]).index_select(0, keep).float()
    losses = torch.logsumexp(picked, dim=-1) - picked.gather(1, targets[:, None])[:, 0]
    out = torch.zeros(2, n_groups, dtype=torch.float32, device=logits.device)
    _add_by_group(losses, owner, out)
    return out


class ChunkedLossHead(nn.Linear):
    """An `nn.Linear` head that, given labels, returns the chunked loss instead of the logits (and, given
    `groups`, the summed loss and target count of each group)."""

    def forward(  # type: ignore[override]
        self,
        hidden: torch.Tensor,
        labels: torch.Tensor | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
        groups: torch.Tensor | None = None,
        n_groups: int = 0,
    ) -> torch.Tensor:
        if labels is None:
            return super().forward(hidden)
        if groups is not None:
            return grouped_cross_entropy(hidden, self.weight, labels, groups, n_groups)
        return linear_cross_entropy(hidden, self.weight, labels, num_items_in_batch)


def _forward_with_chunked_loss(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The causal LM's forward, with the loss through `ChunkedLossHead` when labels come in training, or
    with `loss_groups` (validation: the `loss` is then the per-group sums of `grouped_cross_entropy`)."""
    labels = kwargs.get("labels")
    groups = kwargs.pop("loss_groups", None)
    n_groups = kwargs.pop("n_groups", 0)
    if labels is None or (not torch.is_grad_enabled() and groups is None) or args:
        return self._cockpit_full_forward(*args, **kwargs)
    from transformers.modeling_outputs import CausalLMOutputWithPast

    kwargs.pop("labels")
    num_items = kwargs.pop("num_items_in_batch", None)
    kwargs.pop("logits_to_keep", None)
    outputs = self.model(**{k: v for k, v in kwargs.items() if v is not None})
    with torch.profiler.record_function("cockpit:head_loss"):
        loss = self.lm_head(
            outputs.last_hidden_state,
            labels=labels,
            num_items_in_batch=num_items,
            groups=groups,
            n_groups=n_groups,
        )
    return CausalLMOutputWithPast(loss=loss, logits=None)


def use_chunked_loss(model: nn.Module) -> bool:
    """Give a Transformers causal LM (with `.model` and an `nn.Linear` `.lm_head`) the chunked loss.

    Returns False, changing nothing, for a model of another shape or one that adds an auxiliary loss.
    """
    head = getattr(model, "lm_head", None)
    if type(head) is not nn.Linear or not hasattr(model, "model") or head.bias is not None:
        return False
    if getattr(getattr(model, "config", None), "output_router_logits", False):
        return False  # the MoE load-balancing loss is added by the model's own forward
    head.__class__ = ChunkedLossHead
    model._cockpit_full_forward = model.forward
    model.forward = types.MethodType(_forward_with_chunked_loss, model)
    return True
