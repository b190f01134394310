"""FlashAttention-4 in the packed attention call (`trainer.layers.flash4`, `trainer.layers.attention`): found,
probed, called with the packed layout, and refused where its probe is wrong.

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

from tests.test_attention_packed import _reference_varlen, packed_against_per_document
from trainer.layers import attention, flash4


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


def _agree(checkpointed: bool = False) -> None:
    """The packed call's output and gradients equal one SDPA call a document's."""
    outs, grads, _ = packed_against_per_document(checkpointed)
    torch.testing.assert_close(outs[0], outs[1])
    for mine, theirs in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(mine, theirs)


def test_the_packed_call_through_flash4_equals_one_sdpa_call_a_document(fa4) -> None:
    _agree()
    assert len(flash4._FOUND) == 1 and next(iter(flash4._FOUND.values())) is _contract


def test_the_probe_runs_inside_a_checkpointed_forward(fa4) -> None:
    """The first call probes FlashAttention-4 inside non-reentrant checkpointing's forward; the recompute
    (no probe) must save as many tensors, or backward fails."""
    _agree(checkpointed=True)
    assert next(iter(flash4._FOUND.values())) is _contract


def test_a_kernel_wrong_on_its_probe_is_refused_and_torchs_call_runs(fa4, monkeypatch, caplog) -> None:
    from torch.nn.attention import varlen

    fa4.flash_attn_varlen_func = lambda *a, **kw: _contract(*a, **kw, wrong=True)
    monkeypatch.setattr(varlen, "varlen_attn", _reference_varlen)
    monkeypatch.setattr(attention, "_kernel_failed", False)
    _agree()
    assert list(flash4._FOUND.values()) == [None]
    assert "FlashAttention-4 is" in caplog.text and "from float32 on its probe" in caplog.text
    assert not attention._kernel_failed


def test_probe_measures_the_error_of_output_and_gradients() -> None:
    """Every problem of the probe counts: a kernel wrong only on one-tile documents is caught."""
    cpu = torch.device("cpu")
    assert flash4.probe(_contract, cpu, 4, 2, 16, torch.float32) < 1e-5
    wrong = flash4.probe(lambda *a, **kw: _contract(*a, **kw, wrong=True), cpu, 4, 2, 16, torch.float32)
    assert wrong > flash4.TOLERANCE

    def wrong_when_short(*args, **kwargs):
        return _contract(*args, **kwargs, wrong=kwargs["max_seqlen_q"] <= 64)

    assert flash4.probe(wrong_when_short, cpu, 4, 2, 16, torch.float32) > flash4.TOLERANCE


def test_absent_package_leaves_torchs_call(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", None)  # import fails
    monkeypatch.setattr(flash4, "_FOUND", {})
    assert flash4.find(torch.device("cpu"), 4, 2, 16, torch.float32, forced=True) is None


def test_kernel_choice_reads_the_environment_words() -> None:
    assert [attention.kernel_choice(v) for v in (None, "", "1", "flash4", "torch", "0")] == [
        "auto", "auto", "auto", "flash4", "torch", "0",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="COCKPIT_VARLEN_KERNEL=fa4"):
        attention.kernel_choice("fa4")


def test_only_the_measured_gpus_try_it_unless_forced(fa4, monkeypatch) -> None:
    """Not forced, FlashAttention-4 is tried on compute capability 9 alone (the H100 and H200 measured)."""
    monkeypatch.setattr(flash4, "probe", lambda *args: 0.0)  # a GPU's probe; here no GPU runs it
    cuda = torch.device("cuda", 0)
    for capability, expected in (((8, 0), None), ((10, 0), None), ((9, 0), _contract)):
        monkeypatch.setattr(flash4, "_FOUND", {})
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device, c=capability: c)
        assert flash4.find(cuda, 8, 2, 16, torch.bfloat16, forced=False) is expected
    monkeypatch.setattr(flash4, "_FOUND", {})
    assert flash4.find(cuda, 8, 2, 16, torch.bfloat16, forced=True) is _contract  # on (10, 0) too


def test_prepare_probes_the_models_head_shape_on_a_gpu_run_only(monkeypatch) -> None:
    from transformers import Qwen3MoeConfig

    config = Qwen3MoeConfig(hidden_size=4096, num_attention_heads=64, num_key_value_heads=4, head_dim=128)
    asked = []

    def find(device, heads, kv_heads, head_dim, dtype, *, forced):
        asked.append((heads, kv_heads, head_dim, dtype, forced))
        return _contract if found else None

    monkeypatch.setattr(flash4, "find", find)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(attention, "CHOICE", "auto")
    found = True
    assert attention.prepare(config, torch.bfloat16, on_gpu=True) == "flash4"
    assert asked == [(64, 4, 128, torch.bfloat16, False)]
    found = False
    assert attention.prepare(config, torch.bfloat16, on_gpu=True) == "varlen_attn"
    asked.clear()
    assert attention.prepare(config, torch.bfloat16, on_gpu=False) == "per-document"  # a CPU profile
    config.attention_dropout = 0.1  # dropout: one SDPA call a document
    assert attention.prepare(config, torch.bfloat16, on_gpu=True) == "per-document"
    config.attention_dropout = 0.0
    monkeypatch.setattr(attention, "CHOICE", "torch")
    assert attention.prepare(config, torch.bfloat16, on_gpu=True) == "varlen_attn"
    assert asked == []
