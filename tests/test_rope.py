"""Fused rotary embedding (`trainer.kernels.rope`, `trainer.layers.rope`): the kernel's forward and gradient
against autograd of Transformers' formula (under Triton's CPU interpreter when Triton imports), and the
swap of the modeling file's `apply_rotary_pos_emb`, which leaves CPU tensors to the original."""

from __future__ import annotations

import pytest
import torch
from triton_kernels import interpreted  # first: it sets TRITON_INTERPRET where no GPU is


@pytest.fixture(scope="module")
def kernel():
    return interpreted("rope")


@pytest.mark.parametrize("heads,batch_cos", [(5, 2), (20, 1), (16, 2)])
def test_forward_and_gradient_equal_autograd(kernel, heads: int, batch_cos: int) -> None:
    gen = torch.Generator().manual_seed(heads)
    b, t, d = 2, 7, 16
    x0 = torch.randn(b, t, heads, d, generator=gen)  # [B, T, H, D] memory, as a projection gives it
    angles = torch.randn(batch_cos, t, d // 2, generator=gen)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    cos[..., d // 2 :] *= 0.5  # halves that differ: the kernel must not assume they repeat
    sin[..., d // 2 :] *= 0.7
    grad = torch.randn(b, heads, t, d, generator=gen)
    results = []
    for fn in (kernel.rotate, lambda x, c, s: kernel.reference(x, c.expand(b, -1, -1), s.expand(b, -1, -1))):
        x = x0.clone().requires_grad_(True)
        out = fn(x.transpose(1, 2), cos, sin)
        out.backward(grad)
        results.append((out.detach(), x.grad))
    (out, dx), (out_ref, dx_ref) = results
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dx, dx_ref, rtol=1e-5, atol=1e-5)
    assert out.transpose(1, 2).is_contiguous(), "the output keeps the input's memory order"


def test_bad_shapes_are_refused(kernel) -> None:
    with pytest.raises(ValueError, match="rope"):
        kernel.rotate(torch.zeros(1, 2, 3, 8), torch.zeros(1, 4, 8), torch.zeros(1, 4, 8))


def test_install_swaps_the_modeling_files_function_once(monkeypatch) -> None:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    from transformers.models.qwen3_moe import modeling_qwen3_moe as modeling

    from trainer.layers import rope

    # Transformers' own, also where a model built earlier in this process swapped it in already
    original = getattr(modeling.apply_rotary_pos_emb, "cockpit_original", modeling.apply_rotary_pos_emb)
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", original)  # restored after the test
    config = Qwen3MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=32, moe_intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
    )  # fmt: skip
    model = Qwen3MoeForCausalLM(config)
    monkeypatch.setattr(rope, "ENABLED", False)
    assert not rope.install(model) and modeling.apply_rotary_pos_emb is original
    monkeypatch.setattr(rope, "ENABLED", True)
    assert rope.install(model) and rope.install(model)
    swapped = modeling.apply_rotary_pos_emb
    assert swapped is not original and swapped.cockpit_original is original  # once, not wrapped twice
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    cos, sin = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    assert not rope.fusable(q, k, cos, 1)  # CPU tensors: the original runs
    for mine, theirs in zip(swapped(q, k, cos, sin), original(q, k, cos, sin), strict=True):
        assert torch.equal(mine, theirs)
    ids = torch.arange(6)[None]
    assert torch.isfinite(model(input_ids=ids).logits).all()
    assert rope.uninstall(model) and modeling.apply_rotary_pos_emb is original
    assert not rope.uninstall(model)  # nothing swapped any more
