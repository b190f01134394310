"""Evaluation timed on a rehearsal's slice (`trainer.rehearsal`): the slice loaded as evaluation loads it
(`trainer.model.load_base(spread=True)`: no ZeRO, spread over the GPUs here), then, each after a warm-up,
a scoring forward at evaluation's shape and thinking batches, through evaluation's own functions
(`trainer.evaluation.evaluate.think` and `trainer.evaluation.scoring.score_ids`): the rehearsal measures
whatever evaluation runs.

- a scoring forward: rows of a prompt, the thinking and `ASSUMED_LABELS` labels behind them
  (`cockpit.plan.eval_time`), as many as a forward holds (`SCORE_TOKENS` tokens, `SCORE_LOGITS` kept);
- thinking at `EVAL_BATCH_SIZE` prompts, at `MAX_EVAL_BATCH` (evaluation chooses its batch up to it
  from the memory free once loaded: `trainer.evaluation.eval_batch`) and at batch 1 (a request served alone):
  once for `EVAL_FIRST_TOKENS` new tokens and once for N (the largest batch: `large_new_tokens(N)`, its
  prefill being long and varied); a decode step is `(time(N) - time(3)) / (N - 3)`, and
  what a call costs beyond its decode steps (the prefill, the first token, the decode path's set-up: the
  fast path captures its step as a CUDA graph only past 2 tokens) is `time(3) - 2 x step`. The prefill's
  keys span the whole cache (prompt + new tokens), so a longer call's prefill is a little longer too:
  the difference books that as decode time (a few percent at most, an over-estimate);
- and thinking at `EVAL_BATCH_SIZE` prompts with the steps launched one by one (`eager_*`): what a step
  costs where its graphs cannot be captured (over several GPUs evaluation replays a graph on each,
  `trainer.evaluation.decode_blocks`; the forecast counts that, and keeps these as the fallback's cost).

The prompts are random tokens, as a rehearsal's weights are random: `IdsTokenizer` stands for the
model's tokenizer (a text is its token ids written out), and its end of text is an id past the
vocabulary, which the model never emits, so every row thinks the full count.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from cockpit.contract import (
    EVAL_BATCH_SIZE,
    EVAL_FIRST_TOKENS,
    LABEL_TOKENS,
    MAX_EVAL_BATCH,
    SCORE_LOGITS,
    SCORE_TOKENS,
)
from cockpit.plan.run_length import ASSUMED_LABELS
from trainer.evaluation import decode

REPEATS = 2  # timed calls of each shape after its warm-up (the median is kept, their spread too)
# The largest batch's prefill is long (12 s at 16 layers: 512 prompts of 1,000 tokens) and varied by 0.09 s
# between repeats on an H200, about 3 ms over 29 steps, as much as a 2-layer step: its thinking runs this
# many times the steps, so the steps outweigh that spread (benchmarks/results/eval_speed_h200.md, the
# largest batch's figures).
LARGE_STEPS = 4


def large_new_tokens(new_tokens: int) -> int:
    """New tokens of the largest batch's longer call: `LARGE_STEPS` times the steps of the others."""
    return EVAL_FIRST_TOKENS + LARGE_STEPS * (new_tokens - EVAL_FIRST_TOKENS)


class IdsTokenizer:
    """The part of a tokenizer `trainer.evaluation.evaluate.think` uses, over texts that are token ids."""

    padding_side = "left"
    pad_token_id = 0
    eos_token = ""

    def __init__(self, vocab: int) -> None:
        self.eos_token_id = vocab  # past the vocabulary: never generated, so no row ends early

    @staticmethod
    def text(ids: list[int]) -> str:
        return " ".join(map(str, ids))

    def __call__(self, texts: list[str], **_: Any) -> Any:
        """Left-padded `input_ids` and `attention_mask` of the texts (as `return_tensors="pt"`)."""
        from transformers import BatchEncoding

        rows = [[int(x) for x in t.split()] for t in texts]
        width = max(len(r) for r in rows)
        ids = [[self.pad_token_id] * (width - len(r)) + r for r in rows]
        mask = [[0] * (width - len(r)) + [1] * len(r) for r in rows]
        return BatchEncoding({"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)})

    def convert_tokens_to_ids(self, _token: str) -> None:
        return None  # no end-of-thinking token: the thinking runs its full length

    def batch_decode(self, rows: list[list[int]], **_: Any) -> list[str]:
        return [self.text(r) for r in rows]


def prompt_tokens(rows: list[dict[str, list[int]]]) -> float:
    """The mean prompt of training rows (unpacked): the tokens before the first target."""
    from trainer.inputs.data import IGNORE

    lengths = [next((i for i, x in enumerate(r["labels"]) if x != IGNORE), len(r["labels"])) for r in rows]
    return statistics.fmean(lengths) if lengths else 0.0


def release_training(recipe: Any) -> None:
    """Free what training holds (the DeepSpeed engine, its optimizer, the model) before evaluation's slice
    loads, and forget the DeepSpeed config Transformers keeps (evaluation runs without it); every rank
    waits for the others to have freed theirs."""
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    trainer = recipe.trainer
    if trainer is not None:
        engine = getattr(trainer, "model_wrapped", None)
        if engine is not None and hasattr(engine, "destroy"):
            engine.destroy()
        trainer.accelerator.free_memory()
        for name in ("model", "model_wrapped", "deepspeed", "optimizer", "lr_scheduler"):
            setattr(trainer, name, None)
    recipe.model = None
    unset_hf_deepspeed_config()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def _sync() -> None:
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            torch.cuda.synchronize(i)


def _timed(fn: Callable[[], Any], repeats: int) -> list[float]:
    """Seconds of `repeats` calls of `fn`, after one untimed call (kernels, caches, the allocator)."""
    fn()
    times = []
    for _ in range(repeats):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return times


def _sd(values: list[float]) -> float | None:
    return statistics.stdev(values) if len(values) >= 2 else None


def time_thinking(
    model: Any, prompts: list[str], vocab: int, new_tokens: int, repeats: int
) -> dict[str, Any]:
    """A thinking batch of `prompts` timed for `EVAL_FIRST_TOKENS` and for `new_tokens` new tokens: its decode
    step and what it costs beyond its steps (module docstring), each with the spread of its repeats."""
    from trainer.evaluation.evaluate import think

    tokenizer = IdsTokenizer(vocab)
    first = _timed(lambda: think(model, tokenizer, prompts, EVAL_FIRST_TOKENS), repeats)
    full = _timed(lambda: think(model, tokenizer, prompts, new_tokens), repeats)
    steps = [max(0.0, b - a) / (new_tokens - EVAL_FIRST_TOKENS) for a, b in zip(first, full, strict=True)]
    fixed = [max(0.0, a - (EVAL_FIRST_TOKENS - 1) * step) for a, step in zip(first, steps, strict=True)]
    return {
        "prefill_s": statistics.median(fixed),
        "prefill_sd_s": _sd(fixed),
        "decode_step_s": statistics.median(steps),
        "decode_step_sd_s": _sd(steps),
        "first_s": statistics.median(first),
        "think_s": statistics.median(full),
    }


def scoring_rows(
    vocab: int, prefix: int, labels: int, seed: int = 1
) -> tuple[list[list[int]], list[list[list[int]]]]:
    """Random rows for a scoring forward: prefixes of `prefix` tokens, each with `labels` labels of
    `LABEL_TOKENS` tokens behind it, as many as `SCORE_TOKENS` holds (one at least)."""
    g = torch.Generator().manual_seed(seed)
    prefix = max(1, min(prefix, SCORE_TOKENS - labels * LABEL_TOKENS))
    kept = 1 + labels * LABEL_TOKENS
    n = max(1, min(SCORE_TOKENS // (prefix + labels * LABEL_TOKENS), SCORE_LOGITS // kept))
    prefixes = [torch.randint(1, vocab, (prefix,), generator=g).tolist() for _ in range(n)]
    tails = [[torch.randint(1, vocab, (LABEL_TOKENS,), generator=g).tolist() for _ in range(labels)]] * n
    return prefixes, tails


def time_scoring(model: Any, vocab: int, prefix: int, labels: int, repeats: int) -> dict[str, Any]:
    """One scoring forward (`trainer.evaluation.scoring.score_ids`) of `scoring_rows`, and the path it
    took."""
    from trainer.evaluation import scoring

    prefixes, tails = scoring_rows(vocab, prefix, labels)
    times = _timed(lambda: scoring.score_ids(model, prefixes, tails, 0), repeats)
    return {
        "score_path": scoring.path(),
        "score_rows": len(prefixes),
        "score_labels": labels,
        "score_tokens": sum(len(p) + labels * LABEL_TOKENS for p in prefixes),
        "score_s": statistics.median(times),
        "score_sd_s": _sd(times),
    }


def time_evaluation(
    profile: Any,
    model_dir: str,
    layers: int,
    prompt_len: int,
    new_tokens: int,
    repeats: int = REPEATS,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """The `layers`-deep slice of random weights loaded as evaluation loads it, then a scoring forward
    and thinking batches timed (module docstring): the `rehearse_eval` event's fields."""
    from trainer.model import load_base

    new_tokens = max(EVAL_FIRST_TOKENS + 1, new_tokens)
    t0 = time.perf_counter()
    model = load_base(profile, model_dir, spread=True, random_layers=layers, progress=progress)
    load_s = time.perf_counter() - t0
    model.eval()
    vocab = int(model.config.get_text_config().vocab_size)
    g = torch.Generator().manual_seed(0)
    prompt_len = max(1, prompt_len)
    prompts = [
        IdsTokenizer.text(torch.randint(1, vocab, (prompt_len,), generator=g).tolist())
        for _ in range(MAX_EVAL_BATCH if torch.cuda.is_available() else EVAL_BATCH_SIZE)
    ]
    batch = time_thinking(model, prompts[:EVAL_BATCH_SIZE], vocab, new_tokens, repeats)
    single = time_thinking(model, prompts[:1], vocab, new_tokens, repeats)
    graph_path = decode.path()  # how the batches above decoded (a graph on one GPU)
    large: dict[str, Any] = {}
    large_new = 0
    # On the CPU evaluation's batch is EVAL_BATCH_SIZE: nothing larger to time. Out of memory (more than
    # this slice leaves room for): the shorter call, then none; the batches timed stay.
    for large_new in (large_new_tokens(new_tokens), new_tokens) if torch.cuda.is_available() else ():
        try:
            large = time_thinking(model, prompts, vocab, large_new, repeats)
            break
        except torch.OutOfMemoryError:
            gc.collect()
            torch.cuda.empty_cache()
    with decode.graphs_off():  # what a step costs where its graphs cannot be captured
        eager = time_thinking(model, prompts[:EVAL_BATCH_SIZE], vocab, new_tokens, repeats)
    scoring = time_scoring(model, vocab, prompt_len + profile.eval.max_think_tokens, ASSUMED_LABELS, repeats)
    devices = model.cockpit_load_facts.get("layer_devices") or []
    fields = {
        "layers": layers,
        "load_s": round(load_s, 3),
        "gpus": len(set(devices)) or (1 if torch.cuda.is_available() else 0),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "batch": EVAL_BATCH_SIZE,
        "prompt_tokens": prompt_len,
        "new_tokens": new_tokens,
        "think_tokens": profile.eval.max_think_tokens,
        "repeats": repeats,
        **batch,
        **{f"single_{k}": v for k, v in single.items()},
        **({"large_batch": MAX_EVAL_BATCH, "large_new_tokens": large_new} if large else {}),
        **{f"large_{k}": v for k, v in large.items()},
        "decode_path": graph_path,
        **{f"eager_{k}": v for k, v in eager.items()},
        **scoring,
    }
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return fields
