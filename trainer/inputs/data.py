"""Examples to tokens, as the trainer trains on them.

Examples come from `cockpit.data` (any format `datasets` reads, mapped onto the cockpit's fields:
`{"tenant", "id", "split", "system", "user", "labels": [...], "gold", "reasoning"}`); their chat (the
prompt through the tokenizer's own chat template, the answer a thinking section holding the reasoning
trace, then the label) is `cockpit.data.chat`'s, the one `cockpit data` and the plan count. Loss is taken
on the answer only. Tokenization goes through `Dataset.map` with a cache file, so the main process
tokenizes once and the other ranks read its result. `datasets` is imported only where data is tokenized:
`synthetic_rows` (rehearsals) never needs it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cockpit.contract import PROMPT_FRACTION
from cockpit.data.chat import answer_text, chat_texts, prompt_text
from cockpit.data.examples import DataSet, load_examples
from cockpit.data.source import DataError

IGNORE = -100  # the label of a position that is not a target (the prompt, padding)
TOKENIZE_VERSION = 1  # bump when the tokenization below changes: cached tokenized data is keyed by it

__all__ = ["DataError", "DataSet", "load_examples"]


@dataclass
class Tokenized:
    """Token ids with the prompt masked out of the labels."""

    input_ids: list[int]
    labels: list[int]
    prompt_cut: int = 0  # prompt tokens cut from the left to fit seq_len
    answer_cut: int = 0  # answer tokens cut from the right (the label is lost)


def _fit(prompt_ids: list[int], answer_ids: list[int], seq_len: int) -> Tokenized:
    """Prompt and answer in `seq_len` tokens: the prompt cut from the left, then the answer from the right."""
    keep = max(0, seq_len - len(answer_ids))
    kept_prompt = prompt_ids[-keep:] if keep else []
    ids = (kept_prompt + answer_ids)[:seq_len]
    labels = ([IGNORE] * len(kept_prompt) + answer_ids)[:seq_len]
    answer_cut = max(0, len(kept_prompt) + len(answer_ids) - seq_len)
    return Tokenized(ids, labels, len(prompt_ids) - len(kept_prompt), answer_cut)


def tokenize_example(tokenizer: Any, example: dict[str, Any], seq_len: int) -> Tokenized:
    """Prompt and answer as ids; labels are IGNORE over the prompt; truncated from the left of the prompt."""
    prompt = prompt_text(tokenizer, example)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answer_text(tokenizer, prompt, example), add_special_tokens=False)["input_ids"]
    return _fit(prompt_ids, answer_ids, seq_len)


TEXT_FIELDS = ("system", "user", "reasoning", "gold")


def tokenize_batch(batch: dict[str, list[Any]], tokenizer: Any, seq_len: int) -> dict[str, list[Any]]:
    """`Dataset.map(batched=True)`'s function: columns of examples in, columns of tokenized rows out."""
    examples = [dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)]
    prompts, answers = chat_texts(tokenizer, examples)
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answers, add_special_tokens=False)["input_ids"]
    out: dict[str, list[Any]] = {"input_ids": [], "labels": [], "prompt_cut": [], "answer_cut": []}
    for p, a in zip(prompt_ids, answer_ids, strict=True):
        tok = _fit(p, a, seq_len)
        out["input_ids"].append(tok.input_ids)
        out["labels"].append(tok.labels)
        out["prompt_cut"].append(tok.prompt_cut)
        out["answer_cut"].append(tok.answer_cut)
    return out


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """What makes two tokenizers tokenize alike: their vocabulary and merges, chat template, end token."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    vocab = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    blob = json.dumps([type(tokenizer).__name__, vocab, tokenizer.chat_template, tokenizer.eos_token])
    return hashlib.sha256(blob.encode()).hexdigest()


def _texts_fingerprint(examples: Sequence[dict[str, Any]]) -> str:
    digest = hashlib.sha256()
    for e in examples:
        digest.update(json.dumps([e[k] for k in TEXT_FIELDS], ensure_ascii=False).encode() + b"\n")
    return digest.hexdigest()


@dataclass
class TokenizedSet:
    """Tokenized examples and how they were made: from `Dataset.map`'s cache file or built into it."""

    rows: list[dict[str, list[int]]]
    prompt_cut: list[int]
    answer_cut: list[int]
    seconds: float
    reused: bool
    cache_file: Path | None

    @property
    def over_seq_len(self) -> int:
        """Examples that did not fit `seq_len` whole."""
        return sum(1 for p, a in zip(self.prompt_cut, self.answer_cut, strict=True) if p or a)


def tokenize_examples(
    tokenizer: Any, examples: Sequence[dict[str, Any]], seq_len: int, cache_dir: Path | None
) -> TokenizedSet:
    """Tokenize with `Dataset.map` (batched), its result cached in `cache_dir` under a key of the texts,
    the tokenizer, `seq_len` and this code's version: a second call (another rank, the next run) reads
    the cache file instead of tokenizing again."""
    import datasets

    datasets.disable_progress_bars()
    t0 = time.perf_counter()
    key = hashlib.sha256(
        json.dumps(
            [TOKENIZE_VERSION, _texts_fingerprint(examples), tokenizer_fingerprint(tokenizer), seq_len]
        ).encode()
    ).hexdigest()[:20]
    cache_file = None
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        cache_file = cache_dir / f"tokenized-{key}.arrow"
    reused = cache_file is not None and cache_file.is_file()
    table = datasets.Dataset.from_dict({k: [e[k] for e in examples] for k in TEXT_FIELDS})
    mapped = table.map(
        tokenize_batch,
        batched=True,
        fn_kwargs={"tokenizer": tokenizer, "seq_len": seq_len},
        remove_columns=list(TEXT_FIELDS),
        cache_file_name=str(cache_file) if cache_file is not None else None,
        load_from_cache_file=True,
        new_fingerprint=key,
        keep_in_memory=cache_file is None,
    )
    columns = mapped.to_dict()
    rows = [
        {"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids)}
        for ids, labels in zip(columns["input_ids"], columns["labels"], strict=True)
    ]
    return TokenizedSet(
        rows, columns["prompt_cut"], columns["answer_cut"], time.perf_counter() - t0, reused, cache_file
    )


def train_dataset(tokenizer: Any, examples: list[dict[str, Any]], seq_len: int) -> list[dict[str, list[int]]]:
    """The train split as tokenized rows (no cache); a list is all HF Trainer's data loader needs."""
    train = [e for e in examples if e["split"] == "train"]
    return tokenize_examples(tokenizer, train, seq_len, None).rows if train else []


def rows_fingerprint(rows: Sequence[dict[str, list[int]]]) -> str:
    """A hash of training rows (ids and labels, in order): equal rows, equal batches, equal losses."""
    digest = hashlib.sha256()
    for r in rows:
        digest.update(json.dumps([r["input_ids"], r["labels"]]).encode() + b"\n")
    return digest.hexdigest()


def synthetic_rows(
    vocab_size: int,
    count: int,
    mean_tokens: int,
    seq_len: int,
    seed: int = 0,
    prompt_fraction: float = PROMPT_FRACTION,
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


@dataclass
class PreparedData:
    """A profile's data, ready to train on: the checked examples, the tokenized train split and the
    tokenized validation sample (with each example's tenant)."""

    dataset: DataSet
    train: TokenizedSet
    val: TokenizedSet | None
    val_tenants: list[str]  # the tenant of each validation row, in order
    val_source: str  # the split the validation sample was drawn from


def prepare_data(
    tokenizer: Any, path: Path, data_spec: Any, seq_len: int, val_per_tenant: int, cache_dir: Path | None
) -> PreparedData:
    """Read and check the data (`DataError` on the first blocking problem), tokenize its train split and a
    validation sample of `val_per_tenant` examples a tenant (none when 0)."""
    from cockpit.data.examples import validation_sample

    ds = load_examples(path, data_spec, strict=True, cache_dir=cache_dir)
    train = tokenize_examples(tokenizer, ds.split("train"), seq_len, cache_dir)
    val, tenants, source = None, [], ""
    if val_per_tenant:
        examples, source = validation_sample(ds, val_per_tenant)
        if examples:
            val = tokenize_examples(tokenizer, examples, seq_len, cache_dir)
            tenants = [e["tenant"] for e in examples]
    return PreparedData(ds, train, val, tenants, source)


def data_facts(prepared: PreparedData) -> dict[str, Any]:
    """The data event's fields about the user's data: format, splits, cuts, tokenization."""
    train, ds = prepared.train, prepared.dataset
    return {
        "format": ds.format,
        "split_from": ds.split_from,
        "eval_examples": len(ds.split("eval")),
        "val_examples": len(prepared.val_tenants),
        "val_split": prepared.val_source or None,
        "over_seq_len": train.over_seq_len,
        "answer_cut": sum(1 for a in train.answer_cut if a),
        "tokenize_s": round(train.seconds, 3),
        "tokenize_cache": "reused" if train.reused else "built",
        "data_sha256": ds.fingerprint(),
    }


def over_seq_len_words(count: int, total: int, answer_cut: int, seq_len: int) -> str:
    """What happens to examples longer than `seq_len`, in one sentence."""
    lost = f"; {answer_cut:,} of them lose answer tokens, their label among them" if answer_cut else ""
    return (
        f"{count:,} of {total:,} training examples are longer than training.seq_len {seq_len}: the start "
        f"of their prompt is cut to fit{lost} (`cockpit data` shows the lengths)"
    )
