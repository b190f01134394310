"""Examples to chat text to tokens.

An example is one JSON object a line:
`{"tenant", "id", "split": "train"|"eval", "system", "user", "labels": [...], "gold", "reasoning"}`.
The prompt is the tokenizer's own chat template over system and user; the answer is a thinking
section holding the reasoning trace, then the label. Loss is taken on the answer only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

IGNORE = -100  # the label of a position that is not a target (the prompt, padding)
REQUIRED_FIELDS = ("tenant", "id", "split", "system", "user", "labels", "gold", "reasoning")
THINK_OPEN = "<think>\n"
THINK_CLOSE = "\n</think>\n\n"


class DataError(ValueError):
    """A data file that cannot be used; the message names the line."""


def render_answer(reasoning: str, label: str) -> str:
    """The assistant's answer: a thinking section, then the label."""
    return f"{THINK_OPEN}{reasoning}{THINK_CLOSE}{label}"


def load_examples(path: Path) -> list[dict[str, Any]]:
    """Read and check a JSONL data file."""
    examples = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                example = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            missing = [k for k in REQUIRED_FIELDS if k not in example]
            if missing:
                raise DataError(f"{path}:{number}: missing field(s) {', '.join(missing)}")
            if example["gold"] not in example["labels"]:
                raise DataError(f"{path}:{number}: gold label {example['gold']!r} is not in its labels")
            examples.append(example)
    return examples


def prompt_text(tokenizer: Any, example: dict[str, Any]) -> str:
    """The chat prompt up to where the assistant starts (thinking opened if the template does so)."""
    messages = [
        {"role": "system", "content": example["system"]},
        {"role": "user", "content": example["user"]},
    ]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def answer_text(tokenizer: Any, prompt: str, example: dict[str, Any]) -> str:
    """The answer that follows `prompt`, ended by the end-of-turn token."""
    answer = render_answer(example["reasoning"], example["gold"]) + tokenizer.eos_token
    if prompt.endswith(THINK_OPEN):  # templates like Qwen3-Thinking open the thinking section themselves
        answer = answer[len(THINK_OPEN) :]
    return answer


@dataclass
class Tokenized:
    """Token ids with the prompt masked out of the labels."""

    input_ids: list[int]
    labels: list[int]


def tokenize_example(tokenizer: Any, example: dict[str, Any], seq_len: int) -> Tokenized:
    """Prompt and answer as ids; labels are IGNORE over the prompt; truncated from the left of the prompt."""
    prompt = prompt_text(tokenizer, example)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answer_text(tokenizer, prompt, example), add_special_tokens=False)["input_ids"]
    keep = max(0, seq_len - len(answer_ids))
    prompt_ids = prompt_ids[-keep:] if keep else []
    ids = (prompt_ids + answer_ids)[:seq_len]
    labels = ([IGNORE] * len(prompt_ids) + answer_ids)[:seq_len]
    return Tokenized(ids, labels)


def train_dataset(tokenizer: Any, examples: list[dict[str, Any]], seq_len: int) -> list[dict[str, list[int]]]:
    """The train split as tokenized rows; a list is all HF Trainer's data loader needs."""
    rows = []
    for ex in examples:
        if ex["split"] != "train":
            continue
        tok = tokenize_example(tokenizer, ex, seq_len)
        rows.append(
            {"input_ids": tok.input_ids, "labels": tok.labels, "attention_mask": [1] * len(tok.input_ids)}
        )
    return rows


def synthetic_rows(
    vocab_size: int,
    count: int,
    mean_tokens: int,
    seq_len: int,
    seed: int = 0,
    prompt_fraction: float = 0.5,
    spread: float = 0.5,
) -> list[dict[str, list[int]]]:
    """Random-token examples for a rehearsal where the real data is not at hand.

    Lengths are `cockpit.contract.example_lengths` (the forecast packs the same); the first
    `prompt_fraction` of each example is prompt (no target), as in chat data where the answer follows
    the question.
    """
    import random

    from cockpit.contract import example_lengths

    rng = random.Random(seed)
    rows = []
    for n in example_lengths(mean_tokens, seq_len, count, spread, seed):
        ids = rng.choices(range(vocab_size), k=n)
        cut = int(n * prompt_fraction)
        rows.append({"input_ids": ids, "labels": [IGNORE] * cut + ids[cut:], "attention_mask": [1] * n})
    return rows
