"""The dequant path's weights kept from a checkpointed recompute for its backward
(`trainer.layers.frozen_experts.PackedGroupedMM`): the same outputs and gradients as the loop, with and
without checkpointing, one dequantization a weight fewer a step; and the profile's field deciding whether a
model's experts keep them."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils.checkpoint import checkpoint

if not torch.cuda.is_available():  # the Triton kernels run on the CPU only in Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

from test_experts4bit import rel, run_experts, small_experts

from cockpit.profiles import load_profile
from trainer.layers import frozen_experts
from trainer.layers.experts4bit import NF4Experts
from trainer.layers.experts_model import quantize_model_experts
from trainer.model import attach_lora


def _dequantizations(experts, monkeypatch, checkpointed: bool) -> tuple[int, tuple]:
    """(how many times a weight was dequantized, the run's outputs and gradients) on the dequant path."""
    count = {"n": 0}
    real = experts.dequantized

    def counted(*args, **kwargs):
        count["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(experts, "dequantized", counted)
    if checkpointed:
        plain_forward = experts.forward
        monkeypatch.setattr(experts, "forward", lambda *a: checkpoint(plain_forward, *a, use_reentrant=False))
    results = run_experts(experts, "dequant", monkeypatch)
    monkeypatch.undo()
    return count["n"], results


@pytest.mark.parametrize("checkpointed", [False, True])
def test_kept_weights_give_the_loops_gradients_with_one_dequantization_fewer(checkpointed, monkeypatch):
    pytest.importorskip("triton")
    experts = small_experts(lora=True)
    loop = run_experts(experts, "loop", monkeypatch)
    again, _ = _dequantizations(experts, monkeypatch, checkpointed)
    assert frozen_experts.keep_for_backward(torch.nn.Sequential(experts)) == 1
    kept, got = _dequantizations(experts, monkeypatch, checkpointed)
    forwards = 2 if checkpointed else 1  # the first forward and the recompute
    assert again == 2 * (forwards + 1) and kept == 2 * forwards
    for a, b in zip(loop[:3], got[:3], strict=True):
        assert rel(b, a) < 1e-5
    for name, g in loop[3].items():
        assert g.abs().sum() > 0 and rel(got[3][name], g) < 1e-5


@pytest.mark.parametrize("keep", [True, False])
def test_the_profile_chooses_whether_the_experts_keep_their_weights(tiny_dir, keep):
    """`training.keep_dequantized_experts` (under gradient checkpointing) sets every NF4 experts module."""
    from transformers import AutoModelForCausalLM

    profile, _ = load_profile("tiny-cpu", [f"training.keep_dequantized_experts={str(keep).lower()}"])
    assert profile.training.gradient_checkpointing
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    assert quantize_model_experts(model, torch.float32) > 0
    model = attach_lora(profile, model)
    flags = [m.keep_dequantized for m in model.modules() if isinstance(m, NF4Experts)]
    assert flags and all(flag == keep for flag in flags)
