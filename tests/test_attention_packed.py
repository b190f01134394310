"""Packed attention in one call (`trainer.layers.attention`): the segments it hands torch's `varlen_attn`, the
words it says them in for each torch, and its output against one SDPA call a document.

`varlen_attn` runs FlashAttention-2 and has no CPU kernel, so here it is stood in for by a plain
implementation of its documented contract (causal attention within each segment of the packed tokens);
what is tested is the cockpit's side: segments, padding, layouts, views and gradients through them.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from trainer.layers import attention


def _reference_varlen(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                      window_size=(-1, -1)):  # fmt: skip
    """torch 2.11's `varlen_attn` contract on the CPU: [T, H, D] packed, causal at window_size (-1, 0)."""
    assert window_size == (-1, 0), "the cockpit asks for causal attention"
    assert cu_seq_q.dtype == torch.int32 and torch.equal(cu_seq_q, cu_seq_k)
    bounds = cu_seq_q.tolist()
    assert max(b - a for a, b in itertools.pairwise(bounds)) == max_q == max_k
    parts = []
    for a, b in itertools.pairwise(bounds):
        qs, ks, vs = (x[a:b].transpose(0, 1)[None] for x in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)
        parts.append(o[0].transpose(0, 1))
    return torch.cat(parts)


def test_segments_are_the_documents_and_each_rows_padding(monkeypatch) -> None:
    assert attention.segments([[5, 4], [12], [3, 0, 7]], 12) == [0, 5, 9, 12, 24, 27, 34, 36]
    monkeypatch.setattr(attention, "PAD_SEGMENT", 4)  # long padding runs as short segments
    assert attention.segments([[3], [], [12]], 12) == [0, 3, 7, 11, 12, 16, 20, 24, 36]
    try:
        attention.segments([[8, 5]], 12)
    except ValueError as exc:
        assert "13 tokens in a row of 12" in str(exc)
    else:
        raise AssertionError("a row holding more than its length was accepted")


def test_one_call_equals_one_sdpa_call_a_document(monkeypatch) -> None:
    """On the documents' tokens, output and gradients of the packed call equal the per-document path's.
    The upstream gradient is zero on the padding, as the loss makes it (padding has no label)."""
    from torch.nn.attention import varlen

    monkeypatch.setattr(varlen, "varlen_attn", _reference_varlen)
    monkeypatch.setattr(attention, "_kernel_failed", False)
    monkeypatch.setattr(attention, "_SEGMENTS", {})
    monkeypatch.setattr(attention, "PAD_SEGMENT", 2)  # the first row's padding in two segments
    outs, grads, docs = packed_against_per_document()
    assert not attention._kernel_failed
    torch.testing.assert_close(outs[0], outs[1])
    assert outs[0].abs().min() == 0 and outs[0][docs.expand_as(outs[0])].abs().min() > 0
    for mine, theirs in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(mine, theirs)


def packed_against_per_document(checkpointed: bool = False):
    """Outputs (on the documents' tokens) and q/k/v gradients of the packed call, then of one SDPA call a
    document, on [B, H, T, D] views as Transformers hands them (transposes of [B, T, H, D] memory); and
    the documents' mask. The upstream gradient is zero on the padding, as the loss makes it."""
    torch.manual_seed(0)
    b, h, hkv, t, d = 2, 4, 2, 12, 8
    doc_lens = [[5, 4], [3, 7]]
    docs = torch.zeros(b, t, 1, 1, dtype=torch.bool)
    docs[0, :9] = docs[1, :10] = True
    q0, k0, v0 = (torch.randn(b, t, n, d) for n in (h, hkv, hkv))
    upstream = torch.linspace(-1, 1, b * t * h * d).view(b, t, h, d) * docs
    outs, grads = [], []
    for packed in (True, False):

        def run(q, k, v, packed=packed):
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            if packed:
                return attention.packed_attention(qt, kt, vt, doc_lens, d**-0.5)
            return attention.per_document_attention(qt, kt, vt, doc_lens, 0.0, d**-0.5)

        q, k, v = (x.clone().requires_grad_(True) for x in (q0, k0, v0))
        if checkpointed:
            out = torch.utils.checkpoint.checkpoint(run, q, k, v, use_reentrant=False)
        else:
            out = run(q, k, v)
        assert out.shape == (b, t, h, d) and out.is_contiguous()
        (out * upstream).sum().backward()
        outs.append(out.detach() * docs)
        grads.append([x.grad for x in (q, k, v)])
    return outs, grads, docs


def test_the_call_is_said_in_each_torchs_words() -> None:
    """2.10 takes `is_causal` and no scale, 2.11 `window_size` and `scale`, 2.12 also `enable_gqa`."""

    def v210(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None): ...

    def v211(
        q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1)
    ): ...

    def v212(
        q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False
    ): ...

    def other(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k): ...

    assert attention.varlen_kwargs(v210, 128**-0.5, True, 128) == {"is_causal": True}
    assert attention.varlen_kwargs(v210, 0.5, True, 128) is None  # a scale it cannot take
    assert attention.varlen_kwargs(v211, 0.5, True, 128) == {"window_size": (-1, 0), "scale": 0.5}
    assert attention.varlen_kwargs(v212, 0.5, True, 128) == {
        "window_size": (-1, 0), "scale": 0.5, "enable_gqa": True
    }  # fmt: skip
    assert attention.varlen_kwargs(v212, None, False, 128) == {"window_size": (-1, 0)}
    assert attention.varlen_kwargs(other, None, False, 128) is None
