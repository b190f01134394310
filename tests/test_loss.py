"""The chunked head loss equals Transformers' own, in value and in gradient."""

from __future__ import annotations

import pytest
import torch
import transformers

from trainer.layers.loss import linear_cross_entropy, use_chunked_loss


def _model() -> transformers.PreTrainedModel:
    config = transformers.AutoConfig.for_model(
        "qwen3_moe",
        vocab_size=300,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 300, (3, 21), generator=g)
    labels = ids.clone()
    labels[:, :6] = -100
    labels[1, 15:] = -100
    return {"input_ids": ids, "labels": labels}


@pytest.mark.parametrize("num_items", [None, 37])
def test_chunked_loss_matches_transformers(num_items: int | None) -> None:
    reference, chunked = _model(), _model()
    assert use_chunked_loss(chunked)
    extra = {} if num_items is None else {"num_items_in_batch": torch.tensor(num_items)}
    batch = _batch()
    ref_loss = reference(**batch, **extra).loss
    loss = chunked(**batch, **extra).loss
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    ref_loss.backward()
    loss.backward()
    for (name, p_ref), (_, p) in zip(reference.named_parameters(), chunked.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_small_chunks_give_the_same_loss_and_gradient() -> None:
    torch.manual_seed(2)
    hidden = torch.randn(2, 9, 16, requires_grad=True)
    weight = torch.randn(50, 16)
    labels = torch.randint(0, 50, (2, 9))
    labels[0, :3] = -100
    whole = linear_cross_entropy(hidden, weight, labels, chunk=1000)
    (g_whole,) = torch.autograd.grad(whole, hidden)
    pieces = linear_cross_entropy(hidden, weight, labels, chunk=3)
    (g_pieces,) = torch.autograd.grad(pieces, hidden)
    torch.testing.assert_close(pieces, whole)
    torch.testing.assert_close(g_pieces, g_whole)


def test_eval_and_generation_keep_the_logits() -> None:
    model = _model()
    use_chunked_loss(model)
    with torch.no_grad():
        out = model(**_batch())
    assert out.logits is not None and out.logits.shape == (3, 21, 300)
