"""Label scoring (`trainer/evaluation/scoring.py`): an example's labels scored behind one shared prefix give
the scores of one row a label, alone or batched over several examples and forwards, with sdpa and eager."""

from __future__ import annotations

import pytest
import torch
import transformers

from trainer.evaluation import scoring


class _Tok:
    """A byte-level stand-in tokenizer: ids are the bytes (+3), eos 1, pad 0."""

    eos_token, eos_token_id, pad_token_id = "</s>", 1, 0

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        ids = []
        for part in text.split(self.eos_token):
            ids += [b + 3 for b in part.encode()] + [1]
        return {"input_ids": ids[:-1]}


PREFIXES = ["classify: acme corp", "a longer prefix about a river bank", "x"]
LABELS = [["ORG", "PER"], ["LOC", "ORG", "MISCELLANEOUS"], ["PER"]]


def _dense() -> torch.nn.Module:
    config = transformers.AutoConfig.for_model(
        "qwen3", vocab_size=260, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, intermediate_size=64,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def _one_row_a_label(model, tok, prefix: str, labels: list[str]) -> dict[str, float]:
    """The reference: each label after the prefix in a forward of its own, no padding, no mask."""
    p = tok(prefix)["input_ids"]
    out = {}
    for label in labels:
        tail = tok(label + tok.eos_token)["input_ids"]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p + tail])).logits.float()
        logp = torch.log_softmax(logits[0], dim=-1)
        out[label] = sum(logp[len(p) - 1 + i, t].item() for i, t in enumerate(tail))
    return out


def _close(got: list[dict[str, float]], want: list[dict[str, float]]) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for label in w:
            assert g[label] == pytest.approx(w[label], abs=1e-4), label


@pytest.fixture(autouse=True)
def _no_refusal_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no forward having refused a shared row (the fallback is once a process)."""
    monkeypatch.setattr(scoring, "_refused", [])


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_shared_prefix_scores_equal_a_row_a_label(attention: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _dense()
    model.set_attn_implementation(attention)
    tok = _Tok()
    want = [_one_row_a_label(model, tok, p, ls) for p, ls in zip(PREFIXES, LABELS, strict=True)]
    assert scoring.shares_prefix(model)
    _close(scoring.score_many(model, tok, PREFIXES, LABELS), want)  # one forward, left padding
    _close(
        [scoring.score_many(model, tok, [p], [ls])[0] for p, ls in zip(PREFIXES, LABELS, strict=True)], want
    )
    monkeypatch.setattr(scoring, "SCORE_TOKENS", 120)  # rows 1 and 2 in a forward (2 x 56), row 3 alone
    assert [list(c) for c in scoring.chunks([27, 56, 5], [9, 23, 5])] == [[0, 1], [2]]
    _close(scoring.score_many(model, tok, PREFIXES, LABELS), want)
    monkeypatch.setattr(scoring, "SCORE_LOGITS", 20)  # the kept logits bound them too: a row a forward
    assert [list(c) for c in scoring.chunks([27, 56, 5], [9, 23, 5])] == [[0], [1], [2]]
    _close(scoring.score_many(model, tok, PREFIXES, LABELS), want)
    assert scoring.path() == "shared prefix" and not scoring._refused  # no fallback stood in for it


def test_a_model_without_a_4d_mask_scores_a_row_a_label(monkeypatch: pytest.MonkeyPatch) -> None:
    """An attention that takes no 4-D mask scores a row a label, with the same scores."""
    model = _dense()
    tok = _Tok()
    want = [_one_row_a_label(model, tok, p, ls) for p, ls in zip(PREFIXES, LABELS, strict=True)]
    model.set_attn_implementation("eager")
    monkeypatch.setattr(scoring, "SHARED_ATTENTION", ())
    assert not scoring.shares_prefix(model)
    _close(scoring.score_many(model, tok, PREFIXES, LABELS), want)
    assert scoring.path() == "a row a label: attention eager"


def test_a_forward_that_refuses_the_4d_mask_falls_back_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model whose forward raises on a 4-D mask (remote code) is scored a row a label from then on."""
    model = _dense()
    tok = _Tok()
    want = [_one_row_a_label(model, tok, p, ls) for p, ls in zip(PREFIXES, LABELS, strict=True)]
    forward = model.forward

    def no_4d_masks(*args, attention_mask=None, **kwargs):
        if attention_mask is not None and attention_mask.ndim == 4:
            raise ValueError("this model builds its own mask")
        return forward(*args, attention_mask=attention_mask, **kwargs)

    monkeypatch.setattr(model, "forward", no_4d_masks)
    _close(scoring.score_many(model, tok, PREFIXES, LABELS), want)
    assert scoring._refused and not scoring.shares_prefix(model)
    assert (
        scoring.path() == f"a row a label: {scoring._refused[0]}" and "builds its own mask" in scoring.path()
    )


def test_the_tiny_moe_scores_a_label_the_same_behind_a_shared_prefix(tiny_dir: str) -> None:
    """The built-in model (MoE routing, its own tokenizer): the same scores either way."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    model.set_attn_implementation("sdpa")
    prefixes = ["entity: Acme Corp <think>it is a company</think>", "entity: the Nile <think></think>"]
    labels = [["organization", "person", "location"], ["location", "organization"]]
    want = [_one_row_a_label(model, tokenizer, p, ls) for p, ls in zip(prefixes, labels, strict=True)]
    _close(scoring.score_many(model, tokenizer, prefixes, labels), want)
    assert scoring.path() == "shared prefix"


def test_shared_rows_layout() -> None:
    """Left padding; a label's tokens see the prefix and their own label only, at positions after it; each
    scored token is predicted by the column before it, the first by the prefix's last."""
    b = scoring.shared_rows([[5, 6, 7], [8]], [[[1, 2], [3]], [[4]]], pad=0)
    allowed = b.allowed(torch.device("cpu"))
    assert b.ids.tolist() == [[5, 6, 7, 1, 2, 3], [0, 0, 0, 0, 8, 4]]
    assert b.positions[0].tolist() == [0, 1, 2, 3, 4, 3]
    assert b.positions[1, 4:].tolist() == [0, 1]
    assert b.keep == 4  # the prefix's last column and the longest run of labels
    seen = allowed[0].int().tolist()
    assert seen[5] == [1, 1, 1, 0, 0, 1]  # label 2 sees the prefix and itself, not label 1
    assert seen[4] == [1, 1, 1, 1, 1, 0]
    assert allowed[1, 4].tolist() == [False] * 4 + [True, False]  # padding is never seen
    assert allowed[1, 0].tolist() == [True] + [False] * 5  # a padding query sees itself only
    # Row 0 keeps columns 2..5: token 1 from col 0 (the prefix's 7), 2 from col 1, 3 from col 0 again.
    picks = zip(b.rows.tolist(), b.columns.tolist(), b.targets.tolist(), b.labels.tolist(), strict=True)
    assert list(picks) == [(0, 0, 1, 0), (0, 1, 2, 0), (0, 0, 3, 1), (1, 2, 4, 2)]
    assert b.shape == [2, 1]


def test_rows_without_labels_and_an_empty_prefix() -> None:
    """An example without labels scores nothing (and breaks no index); a prefix needs a token."""
    b = scoring.shared_rows([[5, 6]], [[]], pad=0)
    assert b.shape == [0] and b.rows.dtype == torch.long and b.rows.numel() == 0
    with pytest.raises(ValueError, match="needs a token"):
        scoring.shared_rows([[]], [[[1]]], pad=0)
    with pytest.raises(ValueError, match="needs a token"):  # refused before any forward, no fallback
        scoring.score_ids(_dense(), [[]], [[[1]]], pad=0)
    assert not scoring._refused
