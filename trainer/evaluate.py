"""Label scoring on the held-out split, and predictions files.

Each example is classified by the model's own scores: it first writes its thinking section (greedy,
at most `max_think_tokens`), then every label of the example's tenant is scored by the
log-probability of `label<end of turn>` after that thinking; the best one is the prediction. The same
code scores a base model and a fine-tuned adapter, so their numbers are comparable.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.data import THINK_CLOSE, THINK_OPEN, prompt_text

THINK_END = "</think>"


@dataclass
class Prediction:
    """One classified example."""

    tenant: str
    id: str
    gold: str
    pred: str
    scores: dict[str, float]
    thinking: str

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "id": self.id,
            "gold": self.gold,
            "pred": self.pred,
            "scores": {k: round(v, 4) for k, v in self.scores.items()},
            "thinking": self.thinking,
        }


def _batches(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _close_thinking(prompt: str, generated: str) -> str:
    """The answer prefix up to where the label goes: thinking cut at its end tag, or closed by force."""
    opened = "" if prompt.endswith(THINK_OPEN) else THINK_OPEN
    text = generated
    if text.startswith(THINK_OPEN):
        text = text[len(THINK_OPEN) :]
    elif text.startswith("<think>"):
        text = text[len("<think>") :]
    end = text.find(THINK_END)
    reasoning = (text[:end] if end >= 0 else text).strip()
    return f"{opened}{reasoning}{THINK_CLOSE}"


@torch.no_grad()
def think(model: Any, tokenizer: Any, prompts: list[str], max_new_tokens: int) -> list[str]:
    """Greedy thinking sections for a batch of prompts (left-padded)."""
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    stop = [tokenizer.convert_tokens_to_ids(THINK_END), tokenizer.eos_token_id]
    out = model.generate(
        **enc,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=[s for s in stop if s is not None],
        pad_token_id=tokenizer.pad_token_id,
    )
    new = out[:, enc["input_ids"].shape[1] :]
    return tokenizer.batch_decode(new, skip_special_tokens=False)


@torch.no_grad()
def score_labels(model: Any, tokenizer: Any, prefix: str, labels: list[str]) -> dict[str, float]:
    """Log-probability of each `label<eos>` after `prefix`, in one right-padded batch."""
    prefix_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    rows = [prefix_ids + tokenizer(label + tokenizer.eos_token, add_special_tokens=False)["input_ids"] for label in labels]
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=model.device)
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=model.device)
    logits = model(input_ids=ids, attention_mask=mask).logits.float()
    logprobs = torch.log_softmax(logits[:, :-1], dim=-1)
    targets = ids[:, 1:]
    picked = logprobs.gather(2, targets.unsqueeze(-1)).squeeze(-1)
    scores = {}
    for i, (label, row) in enumerate(zip(labels, rows, strict=True)):
        start = len(prefix_ids) - 1
        scores[label] = picked[i, start : len(row) - 1].sum().item()
    return scores


def classify(
    model: Any,
    tokenizer: Any,
    examples: list[dict[str, Any]],
    max_think_tokens: int,
    batch_size: int = 16,
    progress: Callable[[int, int], None] | None = None,
) -> list[Prediction]:
    """Predictions for `examples` (the eval split) by thinking then label scoring."""
    model.eval()
    predictions: list[Prediction] = []
    for batch in _batches(examples, batch_size):
        prompts = [prompt_text(tokenizer, ex) for ex in batch]
        thoughts = think(model, tokenizer, prompts, max_think_tokens)
        for ex, prompt, thought in zip(batch, prompts, thoughts, strict=True):
            answer_prefix = _close_thinking(prompt, thought)
            scores = score_labels(model, tokenizer, prompt + answer_prefix, list(ex["labels"]))
            pred = max(scores, key=scores.__getitem__)
            predictions.append(
                Prediction(ex["tenant"], ex["id"], ex["gold"], pred, scores, answer_prefix.strip())
            )
        if progress is not None:
            progress(len(predictions), len(examples))
    return predictions


def write_predictions(path: Path, predictions: list[Prediction], meta: dict[str, Any]) -> None:
    """One JSON line per example; a first line `{"meta": ...}` says which system made them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps({"meta": meta}) + "\n")
        for p in predictions:
            f.write(json.dumps(p.to_json()) + "\n")
    tmp.replace(path)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0
