"""The fused RMSNorm forward equals Transformers' Qwen3-MoE RMSNorm, values and gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeRMSNorm

from trainer.layers.fused_norm import fuse_rms_norms, is_rms_norm


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_fused_norm_matches_transformers(dtype, tol):
    torch.manual_seed(0)
    reference = Qwen3MoeRMSNorm(64, eps=1e-6).to(dtype)
    with torch.no_grad():
        reference.weight.normal_(1.0, 0.2)
    fused = copy.deepcopy(reference)
    holder = torch.nn.Sequential(fused)
    assert fuse_rms_norms(holder) == 1
    x = (torch.randn(3, 5, 64) * 3).to(dtype)
    outs = []
    for module in (reference, fused):
        xi = x.clone().requires_grad_(True)
        y = module(xi)
        (y.float() * torch.linspace(-1, 1, 64)).sum().backward()
        outs.append((y.detach().float(), xi.grad.float(), module.weight.grad.float()))
    for a, b in zip(*outs, strict=True):
        assert (a - b).abs().max() <= tol * max(1.0, a.abs().max().item())


def test_only_rms_norms_are_fused():
    model = torch.nn.Sequential(Qwen3MoeRMSNorm(8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 8))
    assert [is_rms_norm(m) for m in model] == [True, False, False]
    assert fuse_rms_norms(model) == 1
    assert "forward" in vars(model[0]) and "forward" not in vars(model[1])
