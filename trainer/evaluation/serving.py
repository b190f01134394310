"""Serving speed of a model as loaded for evaluation: time to first token, per-token time, tokens/s.

Measured with plain `generate` calls on the hardware at hand: one with a single new token (prefill
plus first token), one with N forced new tokens; the difference gives the per-token decode time.
A batched call gives throughput, which is what a serving bill depends on.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@torch.no_grad()
def _generate_s(model: Any, tokenizer: Any, prompts: list[str], new_tokens: int) -> float:
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    _sync()
    t0 = time.perf_counter()
    model.generate(
        **enc,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
    )
    _sync()
    return time.perf_counter() - t0


def measure(
    model: Any, tokenizer: Any, prompts: list[str], new_tokens: int = 32, batch: int = 8
) -> dict[str, Any]:
    """Latency and throughput over up to 8 prompts (after one warm-up call)."""
    model.eval()
    sample = prompts[:8]
    _generate_s(model, tokenizer, sample[:1], 2)  # warm-up: kernels, caches
    ttft, per_token = [], []
    for prompt in sample:
        first = _generate_s(model, tokenizer, [prompt], 1)
        full = _generate_s(model, tokenizer, [prompt], new_tokens)
        ttft.append(first)
        per_token.append(max(0.0, full - first) / (new_tokens - 1))
    batched = sample[:batch]
    batch_s = _generate_s(model, tokenizer, batched, new_tokens)
    prompt_tokens = statistics.fmean(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in sample)
    return {
        "ttft_ms": round(statistics.median(ttft) * 1000, 2),
        "per_token_ms": round(statistics.median(per_token) * 1000, 3),
        "stream_tokens_per_s": round(1.0 / statistics.median(per_token), 1)
        if statistics.median(per_token)
        else None,
        "batch_size": len(batched),
        "batch_tokens_per_s": round(len(batched) * new_tokens / batch_s, 1),
        "new_tokens": new_tokens,
        "prompt_tokens_mean": round(prompt_tokens, 1),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
