"""Sample packing: whole examples, restarting positions, and attention that never crosses a border."""

from __future__ import annotations

import random

import pytest
import torch
import transformers

from trainer.inputs.packing import IGNORE, PackedCollator, pack_rows, packing_efficiency


def _rows(lengths: list[int], seed: int = 0) -> list[dict[str, list[int]]]:
    rng = random.Random(seed)
    rows = []
    for n in lengths:
        ids = [rng.randrange(3, 200) for _ in range(n)]
        cut = n // 3
        rows.append({"input_ids": ids, "labels": [IGNORE] * cut + ids[cut:]})
    return rows


def test_every_example_whole_once_with_restarting_positions() -> None:
    rows = _rows([5, 17, 3, 30, 12, 8, 29, 1, 16])
    packed = pack_rows(rows, seq_len=32, seed=3)
    assert all(len(r["input_ids"]) <= 32 for r in packed)
    pieces = []
    for r in packed:
        start = 0
        for n in r["lengths"]:
            assert r["position_ids"][start : start + n] == list(range(n))
            assert r["labels"][start] == IGNORE  # the predecessor belongs to another example
            pieces.append(tuple(r["input_ids"][start : start + n]))
            start += n
        assert start == len(r["input_ids"])
    assert sorted(pieces) == sorted(tuple(r["input_ids"]) for r in rows)
    assert len(packed) < len(rows)
    assert 0.5 < packing_efficiency(packed, 32) <= 1.0


def test_best_fit_decreasing_fills_rows_and_shuffles_them() -> None:
    from cockpit.contract import best_fit_decreasing, example_lengths

    # Pairs that fit exactly: longest-first finds them, random-order first-fit does not.
    lengths = [3, 1, 2, 2, 3, 1, 2, 2]
    bins = best_fit_decreasing(lengths, 4, seed=0)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert len(bins) == sum(lengths) // 4
    # The story's mix in rows of 4,096: at least 98% of slots hold a token.
    story = example_lengths(2000, 4096, 3600)
    rows = best_fit_decreasing(story, 4096, seed=0)
    assert all(sum(story[i] for i in b) <= 4096 for b in rows)
    assert sum(story) / (len(rows) * 4096) > 0.98
    # Seeded: the same order for a seed, another for another seed (longest-first is not the order).
    assert rows == best_fit_decreasing(story, 4096, seed=0)
    other = best_fit_decreasing(story, 4096, seed=1)
    assert other != rows and sorted(map(sorted, other)) == sorted(map(sorted, rows))
    assert [story[b[0]] for b in rows[:50]] != sorted((story[b[0]] for b in rows[:50]), reverse=True)


def test_an_example_longer_than_the_row_is_refused() -> None:
    with pytest.raises(ValueError, match="longer than seq_len"):
        pack_rows(_rows([40]), seq_len=32)


def test_collator_pads_as_a_separate_example_without_attention_mask() -> None:
    packed = pack_rows(_rows([5, 6, 20]), seq_len=24)
    batch = PackedCollator(pad_token_id=0, multiple=8)(packed)
    assert "attention_mask" not in batch
    width = batch["input_ids"].shape[1]
    assert width % 8 == 0
    for i, r in enumerate(packed):
        n = len(r["input_ids"])
        assert batch["labels"][i, n:].eq(IGNORE).all()
        assert batch["position_ids"][i, n:].tolist() == list(range(width - n))


def _tiny_model(attn: str) -> transformers.PreTrainedModel:
    config = transformers.AutoConfig.for_model(
        "qwen3_moe",
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.set_attn_implementation(attn)
    model.config.use_cache = False  # as the trainer sets it: with a KV cache Transformers ignores packing
    return model.eval()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_attention_never_crosses_an_example(attn: str) -> None:
    """Each example's logits inside a packed row equal its logits alone: nothing leaks across the border."""
    model = _tiny_model(attn)
    rows = _rows([7, 11, 5], seed=1)
    packed = pack_rows(rows, seq_len=32)
    assert len(packed) == 1
    batch = PackedCollator(pad_token_id=0)(packed)
    with torch.no_grad():
        together = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits[0]
        start = 0
        for n in packed[0]["lengths"]:
            ids = batch["input_ids"][:, start : start + n]
            alone = model(input_ids=ids).logits[0]
            torch.testing.assert_close(together[start : start + n], alone, rtol=1e-4, atol=1e-4)
            start += n


def test_packed_loss_equals_the_examples_loss() -> None:
    """One packed row's loss is the token-weighted mean of its examples' own losses."""
    model = _tiny_model("sdpa")
    rows = _rows([9, 14, 6], seed=2)
    packed = pack_rows(rows, seq_len=32)
    batch = PackedCollator(pad_token_id=0)(packed)
    with torch.no_grad():
        loss = model(**batch).loss
        total, count = 0.0, 0
        for r in rows:
            labels = torch.tensor([r["labels"]])
            n = int(labels[:, 1:].ne(IGNORE).sum())
            total += float(model(input_ids=torch.tensor([r["input_ids"]]), labels=labels).loss) * n
            count += n
    assert float(loss) == pytest.approx(total / count, rel=1e-5)


def test_varlen_attention_matches_each_example_alone() -> None:
    """The varlen attention (one document at a time) gives each example its logits alone, like the mask."""
    from trainer.layers.attention import register

    model = _tiny_model("sdpa")
    model.set_attn_implementation(register())
    rows = _rows([7, 11, 5], seed=1)
    packed = pack_rows(rows, seq_len=32)
    batch = PackedCollator(pad_token_id=0, doc_lens=True)(packed)
    assert batch["doc_lens"] == [packed[0]["lengths"]]
    with torch.no_grad():
        together = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[0]
        start = 0
        for n in packed[0]["lengths"]:
            alone = model(input_ids=batch["input_ids"][:, start : start + n]).logits[0]
            torch.testing.assert_close(together[start : start + n], alone, rtol=1e-4, atol=1e-4)
            start += n


def test_varlen_gradients_match_the_masked_sdpa() -> None:
    """Loss and gradients through the varlen attention equal those through Transformers' masked SDPA."""
    from trainer.layers.attention import register

    rows = _rows([9, 4, 12], seed=4) + _rows([20, 6], seed=5)
    packed = pack_rows(rows, seq_len=32)
    grads = []
    for attn in ("sdpa", register()):
        model = _tiny_model(attn)
        model.train()
        batch = PackedCollator(pad_token_id=0, doc_lens=attn != "sdpa")(packed)
        model(**batch).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-5, msg=name)


def test_varlen_builds_no_mask_and_reads_no_position_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Transformers builds no mask for the varlen attention: with a mask function registered it first
    looks for packed rows in the position ids, a read of a GPU value on the host (a device
    synchronization) at every forward, which with parameter offload held the host until the first
    layers' copies had landed."""
    from transformers import masking_utils

    from trainer.layers.attention import register

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the position ids were searched for packed rows: a host sync on a GPU")

    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", refuse)
    model = _tiny_model("sdpa")
    model.set_attn_implementation(register())
    packed = pack_rows(_rows([7, 11, 5], seed=3), seq_len=32)
    batch = PackedCollator(pad_token_id=0, doc_lens=True)(packed)
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    assert logits.shape[:2] == batch["input_ids"].shape
    with pytest.raises(AssertionError, match="host sync"):  # the check this test guards is live
        model.set_attn_implementation("sdpa")
        with torch.no_grad():
            model(input_ids=batch["input_ids"], position_ids=batch["position_ids"])
