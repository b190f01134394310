"""FlashAttention-4 in the packed attention call (`trainer.flash4`, `trainer.attention`): found, probed,
called with the packed layout, and refused where its probe is wrong.

FlashAttention-4 has no CPU kernel, so here `flash_attn.cute.interface` is stood in for by a module whose
`flash_attn_varlen_func` implements the documented contract (causal attention within each segment of
packed [tokens, heads, head_dim] tensors, `cu_seqlens` int32 offsets, returning output and LSE); what is
tested is the cockpit's side: the probe, the choice, the layouts and gradients through them.
"""

from __future__ import annotations

import itertools
import sys
import types

import pytest
import torch

from trainer import attention, flash4


def _contract(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
              wrong=False):  # fmt: skip
    assert causal and torch.equal(cu_seqlens_q, cu_seqlens_k) and cu_seqlens_q.dtype == torch.int32
    bounds = cu_seqlens_q.tolist()
    lens = [b - a for a, b in itertools.pairwise(bounds)]
    assert max(lens) == max_seqlen_q == max_seqlen_k
    if wrong:  # the whole packed batch as one causal document: reads across documents' borders
        lens = [sum(lens)]
    out = flash4.reference(q, k, v, lens, softmax_scale)
    return out, torch.zeros(q.shape[1], q.shape[0])


@pytest.fixture
def fa4(monkeypatch):
    """A stand-in `flash_attn.cute.interface` module; returns it to set its function."""
    module = types.ModuleType("flash_attn.cute.interface")
    module.flash_attn_varlen_func = _contract
    for name in ("flash_attn", "flash_attn.cute"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", module)
    monkeypatch.setattr(flash4, "_FOUND", {})
    monkeypatch.setattr(attention, "CHOICE", "flash4")
    monkeypatch.setattr(attention, "_SEGMENTS", {})
    monkeypatch.setattr(attention, "PAD_SEGMENT", 2)
    return module


def _both_paths(checkpointed: bool = False):
    """Output (on the documents' tokens) and q/k/v gradients of the packed call and of one SDPA call a
    document, on transposed [B, H, T, D] views as Transformers hands them."""
    torch.manual_seed(0)
    b, h, hkv, t, d = 2, 4, 2, 12, 8
    doc_lens = [[5, 4], [3, 7]]
    docs = torch.zeros(b, t, 1, 1, dtype=torch.bool)
    docs[0, :9] = docs[1, :10] = True
    q0, k0, v0 = (torch.randn(b, t, n, d) for n in (h, hkv, hkv))
    upstream = torch.linspace(-1, 1, b * t * h * d).view(b, t, h, d) * docs
    results = []
    for packed in (True, False):
        q, k, v = (x.clone().requires_grad_(True) for x in (q0, k0, v0))

        def run(q, k, v, packed=packed):
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            if packed:
                return attention.packed_attention(qt, kt, vt, doc_lens, d**-0.5)
            return attention.per_document_attention(qt, kt, vt, doc_lens, 0.0, d**-0.5)

        if checkpointed:
            out = torch.utils.checkpoint.checkpoint(run, q, k, v, use_reentrant=False)
        else:
            out = run(q, k, v)
        assert out.shape == (b, t, h, d)
        (out * upstream).sum().backward()
        results.append((out.detach() * docs, [x.grad for x in (q, k, v)]))
    return results


def test_the_packed_call_through_flash4_equals_one_sdpa_call_a_document(fa4) -> None:
    (out, grads), (ref_out, ref_grads) = _both_paths()
    assert len(flash4._FOUND) == 1 and next(iter(flash4._FOUND.values())) is _contract
    torch.testing.assert_close(out, ref_out)
    for mine, theirs in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(mine, theirs)


def test_the_probe_runs_inside_a_checkpointed_forward(fa4) -> None:
    """The first call probes FlashAttention-4 inside non-reentrant checkpointing's forward; the recompute
    (no probe) must save as many tensors, or backward fails."""
    (out, grads), (ref_out, ref_grads) = _both_paths(checkpointed=True)
    assert next(iter(flash4._FOUND.values())) is _contract
    torch.testing.assert_close(out, ref_out)
    for mine, theirs in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(mine, theirs)


def test_a_kernel_wrong_on_its_probe_is_refused_and_torchs_call_runs(fa4, monkeypatch, caplog) -> None:
    from torch.nn.attention import varlen

    from tests.test_attention_packed import _reference_varlen

    fa4.flash_attn_varlen_func = lambda *a, **kw: _contract(*a, **kw, wrong=True)
    monkeypatch.setattr(varlen, "varlen_attn", _reference_varlen)
    monkeypatch.setattr(attention, "_kernel_failed", False)
    (out, grads), (ref_out, ref_grads) = _both_paths()
    assert list(flash4._FOUND.values()) == [None]
    assert "FlashAttention-4 is" in caplog.text and "from float32 on its probe" in caplog.text
    assert not attention._kernel_failed
    torch.testing.assert_close(out, ref_out)
    for mine, theirs in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(mine, theirs)


def test_probe_measures_the_error_of_output_and_gradients() -> None:
    cpu = torch.device("cpu")
    assert flash4.probe(_contract, cpu, 4, 2, 16, torch.float32) < 1e-5
    wrong = flash4.probe(lambda *a, **kw: _contract(*a, **kw, wrong=True), cpu, 4, 2, 16, torch.float32)
    assert wrong > flash4.TOLERANCE


def test_absent_package_leaves_torchs_call(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", None)  # import fails
    monkeypatch.setattr(flash4, "_FOUND", {})
    assert flash4.find(torch.device("cpu"), 4, 2, 16, torch.float32, forced=True) is None
    # not forced: a CPU device is never tried
    assert flash4.find(torch.device("cpu"), 8, 2, 16, torch.float32, forced=False) is None


def test_kernel_choice_reads_the_environment_words() -> None:
    assert [attention.kernel_choice(v) for v in (None, "", "1", "flash4", "torch", "0")] == [
        "auto", "auto", "auto", "flash4", "torch", "0",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="COCKPIT_VARLEN_KERNEL=fa4"):
        attention.kernel_choice("fa4")
