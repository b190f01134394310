"""Attention over packed rows, one document at a time: no mask, no work across an example's border.

With packing, Transformers' "sdpa" builds a dense block-diagonal mask, and a masked SDPA computes every
query against every key of the row: at 8,192 tokens of ~2,000-token documents that is four times the
FLOPs, on a slower masked kernel. Here the packed collator says where each document starts
(`doc_lens`, passed through the model's keyword arguments to every attention call), and each document
runs as its own causal segment. On a GPU that is one call for the whole micro-batch, with each row's
padding a segment of its own: FlashAttention-4 where it runs (`trainer/layers/flash4.py`: Hopper, the
`flash-attn-4` package), else torch's `varlen_attn` (FlashAttention-2), grouped key/value heads as they
are. Elsewhere (the CPU, dropout, an older torch) it is causal SDPA one document at a time. Without
`doc_lens` (no packing) it is Transformers' own SDPA.

COCKPIT_VARLEN_KERNEL picks the packed call: `auto` (the default; `1` says the same), `flash4` (tried on
any GPU, with a warning where it cannot run), `torch` (`varlen_attn` only), `0` (one SDPA call a
document: the speed benchmark's control row).

Registered with Transformers as the attention implementation `"varlen"` (with no mask of its own).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import os
from typing import Any

import torch
from torch.nn import functional as F

log = logging.getLogger(__name__)

NAME = "varlen"
_BACKENDS: list[Any] | None = None
CHOICES = ("auto", "flash4", "torch", "0")


def kernel_choice(value: str | None) -> str:
    """COCKPIT_VARLEN_KERNEL's value as one of `CHOICES` (unset and `1` are `auto`)."""
    value = "auto" if value in (None, "", "1") else value
    if value not in CHOICES:
        raise ValueError(f"COCKPIT_VARLEN_KERNEL={value}: expected one of {', '.join(CHOICES)}")
    return value


CHOICE = kernel_choice(os.environ.get("COCKPIT_VARLEN_KERNEL"))
KERNEL = CHOICE != "0"
_kernel_failed = False
_SEGMENTS: dict[tuple[Any, ...], tuple[torch.Tensor, int]] = {}  # the last micro-batches' offsets


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

    Returns [B, T, H, D] as Transformers' attention functions do. Padding (past a row's documents) attends
    only to itself: zeros on the per-document path, causal attention within its own segments on the
    packed one. No document reads it and the loss ignores it, so its gradient is zero, unless the model
    adds its MoE load-balancing loss (`output_router_logits`, off for the shipped models; the chunked
    loss is then off too), which counts every token's routing, padding included.
    """
    if doc_lens is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    p = dropout if module.training else 0.0
    if KERNEL and p == 0.0 and query.is_cuda and not _kernel_failed:
        out = packed_attention(query, key, value, doc_lens, scaling)
        if out is not None:
            return out, None
    return per_document_attention(query, key, value, doc_lens, p, scaling), None


PAD_SEGMENT = 128  # padding runs as segments of at most this many tokens: its attention costs next to nothing


def segments(doc_lens: list[list[int]], length: int) -> list[int]:
    """The packed micro-batch as segments over its `len(doc_lens) * length` tokens: the cumulative
    offsets, every document one segment and a row's padding more (`PAD_SEGMENT` tokens at most each)."""
    offsets, base = [0], 0
    for lens in doc_lens:
        for n in lens:
            if n:  # an empty document is no segment
                offsets.append(offsets[-1] + n)
        used = sum(lens)
        if used > length:
            raise ValueError(f"documents of {used} tokens in a row of {length}")
        offsets += range(base + used + PAD_SEGMENT, base + length, PAD_SEGMENT)
        if used < length:
            offsets.append(base + length)
        base += length
    return offsets


def _segments_on(doc_lens: list[list[int]], length: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """`segments` as the kernel takes them, made once a micro-batch (every layer, its recompute and its
    backward see the same `doc_lens`): int32 offsets on `device`, copied from pinned memory so that the
    host never waits for the GPU, and the longest segment."""
    key = (tuple(map(tuple, doc_lens)), length, device)
    found = _SEGMENTS.get(key)
    if found is None:
        offsets = segments(doc_lens, length)
        cu = torch.tensor(offsets, dtype=torch.int32)
        cu = (cu.pin_memory() if torch.cuda.is_available() else cu).to(device, non_blocking=True)
        if len(_SEGMENTS) >= 8:
            _SEGMENTS.clear()
        found = _SEGMENTS[key] = (cu, max(b - a for a, b in itertools.pairwise(offsets)))
    return found


@functools.lru_cache(maxsize=16)
def varlen_kwargs(fn: Any, scaling: float | None, gqa: bool, head_dim: int) -> dict[str, Any] | None:
    """Causal, with grouped key/value heads and the scale, in the words of this torch's `varlen_attn`
    (2.10 says `is_causal`, 2.11 `window_size`, 2.12 adds `enable_gqa`); None where it cannot say them."""
    params = inspect.signature(fn).parameters
    if scaling is not None and "scale" not in params and abs(scaling - head_dim**-0.5) < 1e-9:
        scaling = None  # the default scale: nothing to say
    kwargs: dict[str, Any] = {}
    if "window_size" in params:
        kwargs["window_size"] = (-1, 0)
    elif "is_causal" in params:
        kwargs["is_causal"] = True
    else:
        return None
    if scaling is not None:
        if "scale" not in params:
            return None
        kwargs["scale"] = scaling
    if gqa and "enable_gqa" in params:
        kwargs["enable_gqa"] = True
    return kwargs


def packed_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    doc_lens: list[list[int]],
    scaling: float | None,
) -> torch.Tensor | None:
    """Every document of the micro-batch in one call, FlashAttention-4's where `trainer.layers.flash4` finds
    it, else torch's `varlen_attn`; [B, T, H, D], or None (and the per-document path from then on) where this
    torch has no such call or it fails here."""
    global _kernel_failed
    from trainer.layers import flash4
    from trainer.pass_through import PASS_THROUGH

    b, h, t, d = query.shape
    cu, longest = _segments_on(doc_lens, t, query.device)  # a row longer than its length: ValueError

    def packed(x: torch.Tensor) -> torch.Tensor:  # [B, H, T, D] -> [B*T, H, D] (a view after RoPE)
        return x.transpose(1, 2).reshape(b * t, x.shape[1], d)

    fa4 = _flash4(query.device, h, key.shape[1], d, query.dtype)
    if fa4 is not None:
        out = flash4.call(fa4, packed(query), packed(key), packed(value), cu, longest,
                          d**-0.5 if scaling is None else scaling)  # fmt: skip
        return out.view(b, t, h, d)
    try:
        from torch.nn.attention.varlen import varlen_attn

        kwargs = varlen_kwargs(varlen_attn, scaling, key.shape[1] != h, d)
        if kwargs is None:
            raise RuntimeError("this torch's varlen_attn takes no causal flag or scale")
        out = varlen_attn(packed(query), packed(key), packed(value), cu, cu, longest, longest, **kwargs)
    except PASS_THROUGH:  # out of memory is no reason to change paths (nor is checkpointing's own stop)
        raise
    except (ImportError, RuntimeError, TypeError, ValueError, NotImplementedError) as exc:
        _kernel_failed = True
        log.warning("packed attention: varlen_attn unavailable (%s: %s); one SDPA call a document",
                    type(exc).__name__, exc)  # fmt: skip
        return None
    return out.view(b, t, h, d).contiguous()  # a no-op but where q itself was [B, H, T, D]-contiguous


def per_document_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    doc_lens: list[list[int]],
    p: float,
    scaling: float | None,
) -> torch.Tensor:
    """Causal SDPA one document at a time (FlashAttention-2 where the device has it); [B, T, H, D]."""
    from torch.nn.attention import sdpa_kernel

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
    return out.transpose(1, 2).contiguous()


def prepare(config: Any, dtype: torch.dtype, on_gpu: bool) -> str:
    """The packed call this process will make for `config`'s attention in training: `flash4`,
    `varlen_attn` or `per-document` (not on a GPU, attention dropout, or COCKPIT_VARLEN_KERNEL=0). On a
    GPU, FlashAttention-4 is found and probed here, its kernels compiled before the first step."""
    if not KERNEL or not on_gpu or not torch.cuda.is_available() or getattr(config, "attention_dropout", 0.0):
        return "per-document"
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    device = torch.device("cuda", torch.cuda.current_device())
    return "varlen_attn" if _flash4(device, heads, kv_heads, head_dim, dtype) is None else "flash4"


def _flash4(device: torch.device, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> Any:
    """FlashAttention-4's call where COCKPIT_VARLEN_KERNEL lets it run and `trainer.layers.flash4` finds
    it."""
    if CHOICE not in ("auto", "flash4"):
        return None
    from trainer.layers import flash4

    return flash4.find(device, heads, kv_heads, head_dim, dtype, forced=CHOICE == "flash4")


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
