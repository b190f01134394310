"""Label scores batched over several examples equal each example's scores alone."""

from __future__ import annotations

import pytest
import torch
import transformers

from trainer import evaluate


class _Tok:
    """A byte-level stand-in tokenizer: ids are the bytes (+3), eos 1, pad 0."""

    eos_token, eos_token_id, pad_token_id = "</s>", 1, 0

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        ids = []
        for part in text.split(self.eos_token):
            ids += [b + 3 for b in part.encode()] + [1]
        return {"input_ids": ids[:-1]}


def test_scores_batched_over_examples_equal_scores_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    config = transformers.AutoConfig.for_model(
        "qwen3", vocab_size=260, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, intermediate_size=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    prefixes = ["classify: acme corp", "a longer prefix about a river bank", "x"]
    labels = [["ORG", "PER"], ["LOC", "ORG", "MISC"], ["PER"]]
    alone = [evaluate.score_many(model, _Tok(), [p], [ls])[0] for p, ls in zip(prefixes, labels, strict=True)]
    together = evaluate.score_many(model, _Tok(), prefixes, labels)
    monkeypatch.setattr(evaluate, "SCORE_TOKENS", 60)  # several forwards, each under the budget
    chunked = evaluate.score_many(model, _Tok(), prefixes, labels)
    for a, t, c in zip(alone, together, chunked, strict=True):
        assert a.keys() == t.keys() == c.keys()
        for label in a:
            assert t[label] == pytest.approx(a[label], abs=1e-4)
            assert c[label] == pytest.approx(a[label], abs=1e-4)
