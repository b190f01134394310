"""FlashAttention-4 for the packed attention call, where it runs: found, probed once, then called.

FlashAttention-4 (`flash_attn.cute`, the `flash-attn-4` package, written in CUTLASS's Python DSL) has
Hopper kernels for causal attention over packed segments with grouped key/value heads, forward and
backward: warp-specialized, wgmma and TMA, which torch's `varlen_attn` (FlashAttention-2) does not use.
It is optional: where the package is missing, or its kernels fail to compile or to match float32 math on
a small problem the first time a head shape is seen, `trainer.layers.attention` keeps torch's call, with a
warning. The probe also compiles the kernels (a JIT), so that cost falls before the first step's
attention, not inside it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F

log = logging.getLogger(__name__)

ARCHS = (9,)  # compute capabilities measured (H100, H200); COCKPIT_VARLEN_KERNEL=flash4 tries any GPU
TOLERANCE = 2e-2  # largest relative error of output or gradient against float32 (bf16 gives ~3e-3)
# The probe's problems, each a list of documents: one past a 128-token tile and one inside it (the kernels
# for several blocks), then every document inside one tile (the backward's single-block kernels).
PROBES = ((200, 56), (48, 16))
_FOUND: dict[tuple[Any, ...], Callable[..., Any] | None] = {}


def find(
    device: torch.device, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, *, forced: bool
) -> Callable[..., Any] | None:
    """FlashAttention-4's varlen call for this device and head shape, or None where it is not to be used.

    Decided once a shape (the probe runs then); `forced` tries it on any device and warns where it is absent.
    """
    key = (device, heads, kv_heads, head_dim, dtype)
    if key not in _FOUND:
        _FOUND[key] = _load(device, heads, kv_heads, head_dim, dtype, forced)
    return _FOUND[key]


def _load(
    device: torch.device, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, forced: bool
) -> Callable[..., Any] | None:
    from trainer.pass_through import PASS_THROUGH

    if not forced and (device.type != "cuda" or torch.cuda.get_device_capability(device)[0] not in ARCHS):
        return None
    try:
        from flash_attn.cute.interface import flash_attn_varlen_func
    except Exception as exc:  # absent, or its compiler's libraries do not load here
        (log.warning if forced else log.debug)("packed attention: no FlashAttention-4 (%s: %s)",
                                               type(exc).__name__, exc)  # fmt: skip
        return None
    try:
        err = probe(flash_attn_varlen_func, device, heads, kv_heads, head_dim, dtype)
    except PASS_THROUGH:
        raise
    except Exception as exc:  # a kernel that does not compile or launch for this shape
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # a fault that broke the GPU's state raises here: no fallback
        log.warning("packed attention: FlashAttention-4 failed its probe (%s: %s); torch's varlen_attn",
                    type(exc).__name__, exc)  # fmt: skip
        return None
    if not err <= TOLERANCE:
        log.warning("packed attention: FlashAttention-4 is %.1e from float32 on its probe (over %.0e); "
                    "torch's varlen_attn", err, TOLERANCE)  # fmt: skip
        return None
    log.info("packed attention: FlashAttention-4 (probe: %.1e from float32)", err)
    return flash_attn_varlen_func


def call(
    fn: Callable[..., Any], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, longest: int,
    scale: float,
) -> torch.Tensor:  # fmt: skip
    """Causal attention within each segment of packed [tokens, heads, head_dim] q, k, v (`cu`: int32
    offsets, `longest`: the longest segment); [tokens, heads, head_dim]."""
    out = fn(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest,
             softmax_scale=scale, causal=True)  # fmt: skip
    return out[0] if isinstance(out, tuple) else out


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: list[int], scale: float
) -> torch.Tensor:
    """Causal SDPA one document at a time on packed [tokens, heads, head_dim] tensors (any dtype)."""
    parts, start = [], 0
    for n in lens:
        qs, ks, vs = (x[start : start + n].transpose(0, 1)[None] for x in (q, k, v))
        out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)
        parts.append(out[0].transpose(0, 1))
        start += n
    return torch.cat(parts)


def probe(
    fn: Callable[..., Any], device: torch.device, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> float:
    """Forward and backward of each of `PROBES` through `fn` against float32 math: the largest relative
    error (norm of the difference over the reference's) of an output or gradient."""
    return max(_probe_one(fn, docs, device, heads, kv_heads, head_dim, dtype) for docs in PROBES)


def _probe_one(
    fn: Callable[..., Any], docs: tuple[int, ...], device: torch.device, heads: int, kv_heads: int,
    head_dim: int, dtype: torch.dtype,
) -> float:  # fmt: skip
    """One problem of the probe. Its own graph, outside any caller's saved-tensor hooks (non-reentrant
    checkpointing counts the tensors a forward saves, and its recompute, which runs no probe, must save as
    many) and outside autocast (the reference stays float32)."""
    scale = head_dim**-0.5
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v, grad = (torch.randn(sum(docs), n, head_dim, generator=gen).to(device, dtype)
                     for n in (heads, kv_heads, kv_heads, heads))  # fmt: skip
    cu = torch.tensor([sum(docs[:i]) for i in range(len(docs) + 1)], dtype=torch.int32, device=device)
    hooks = torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
    with hooks, torch.enable_grad(), torch.autocast(device.type, enabled=False):
        mine = [x.clone().requires_grad_(True) for x in (q, k, v)]
        out = call(fn, *mine, cu, max(docs), scale)
        out.backward(grad)
        ref = [x.float().requires_grad_(True) for x in (q, k, v)]
        expected = reference(*ref, list(docs), scale)
        expected.backward(grad.float())
    pairs = [(out, expected)] + [(a.grad, b.grad) for a, b in zip(mine, ref, strict=True)]
    with torch.no_grad():  # no graph from here: the caller's hooks would count what it saved
        return max(float((a.float() - b).norm() / b.norm()) for a, b in pairs)
