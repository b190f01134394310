"""Attention over packed rows, one document at a time: no mask, no work across an example's border.

With packing, Transformers' "sdpa" builds a dense block-diagonal mask, and a masked SDPA computes every
query against every key of the row: at 8,192 tokens of ~2,000-token documents that is four times the
FLOPs, on a slower masked kernel. Here the packed collator says where each document starts
(`doc_lens`, passed through the model's keyword arguments to every attention call), and each document
runs through causal SDPA on its own (FlashAttention-2 where the device has it, no per-shape planning).
Without `doc_lens` (no packing) it is Transformers' own SDPA.

Registered with Transformers as the attention implementation `"varlen"` (with no mask of its own).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.nn import functional as F

NAME = "varlen"
_BACKENDS: list[Any] | None = None


def _backends() -> list[Any]:
    global _BACKENDS
    if _BACKENDS is None:
        from torch.nn.attention import SDPBackend

        _BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    return _BACKENDS


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    doc_lens: list[list[int]] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention within each document of each row; query [B, H, T, D], key/value [B, Hkv, T, D].

    Returns [B, T, H, D] as Transformers' attention functions do. Positions past a row's documents
    (padding) get zeros.
    """
    if doc_lens is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    from torch.nn.attention import sdpa_kernel

    p = dropout if module.training else 0.0
    gqa = key.shape[1] != query.shape[1]
    rows = []
    with sdpa_kernel(_backends()):
        for b, lens in enumerate(doc_lens):
            parts, start = [], 0
            for n in lens:
                q, k, v = (t[b : b + 1, :, start : start + n] for t in (query, key, value))
                parts.append(
                    F.scaled_dot_product_attention(
                        q, k, v, dropout_p=p, is_causal=True, scale=scaling, enable_gqa=gqa
                    )
                )
                start += n
            if start < query.shape[2]:
                parts.append(query.new_zeros(1, query.shape[1], query.shape[2] - start, query.shape[3]))
            rows.append(torch.cat(parts, dim=2) if len(parts) > 1 else parts[0])
    out = torch.cat(rows, dim=0) if len(rows) > 1 else rows[0]
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Make `"varlen"` a Transformers attention implementation (idempotent); returns its name.

    No mask function is registered with it: Transformers then builds no mask for it at all. With one
    registered (even one returning None) it first looks for packed rows in the position ids, and that
    check reads a GPU value on the host: a device synchronization at every forward, which with parameter
    offload made the host wait for the first layers' copies before it queued any kernel."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, varlen_attention_forward)
    # COCKPIT_VARLEN_MASK=1: the earlier registration, the speed benchmark's control
    if os.environ.get("COCKPIT_VARLEN_MASK") == "1":
        from transformers.masking_utils import AttentionMaskInterface

        AttentionMaskInterface.register(NAME, lambda *args, **kwargs: None)
    return NAME
