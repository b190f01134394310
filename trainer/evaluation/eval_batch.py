"""Evaluation's batch from the memory that is free once the model is loaded.

A decode step reads each layer's weights once for the whole batch, so the larger the batch, the more
tokens each read pays for. The batch is the most rows every GPU holding decoder layers can take: its
free memory (the driver's, plus what torch's allocator holds unused), less a margin, a prefill chunk's
activations (`cockpit.contract.prefill_bytes`: the prompts go through a chunk of rows at a time) and, on
the head's GPU, the scoring forward's kept logits, over one row's KV cache for the layers it runs
(`cockpit.contract.eval_row_bytes`; the plan counts the same). Without a GPU it is `EVAL_BATCH_SIZE`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from cockpit.contract import (
    EVAL_BATCH_MARGIN,
    EVAL_BATCH_SIZE,
    eval_batch,
    eval_row_bytes,
    prefill_bytes,
    score_logit_bytes,
)
from trainer.weights.placement import attention_shape


def layers_by_device(model: Any) -> Counter[torch.device]:
    """How many decoder layers run on each device."""
    from trainer.weights.loader import decoder_layers

    return Counter(next(layer.parameters()).device for layer in decoder_layers(model))


def free_bytes(device: torch.device) -> int:
    """Bytes a new allocation can still get on `device`: the driver's free memory and the allocator's
    reserved but unused blocks."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def choose(model: Any, prompt_tokens: Callable[[], int], new_tokens: int, examples: int) -> int:
    """The batch for thinking `new_tokens` after prompts of at most `prompt_tokens()` tokens (asked only
    where the model runs on GPUs; see the module)."""
    try:
        layers = layers_by_device(model) if torch.cuda.is_available() else {}
    except (ValueError, AttributeError, StopIteration):  # no decoder layers to place rows by
        layers = {}
    if not layers or any(d.type != "cuda" for d in layers):
        return min(EVAL_BATCH_SIZE, max(examples, 1))
    longest = prompt_tokens()
    text, kv_heads, head_dim = attention_shape(model.config)
    item = next(p for p in model.parameters() if p.is_floating_point()).element_size()
    head = model.get_output_embeddings().weight.device
    logits = score_logit_bytes(text.vocab_size)
    expert_width = getattr(text, "moe_intermediate_size", None) or text.intermediate_size
    q_dim = text.num_attention_heads * head_dim
    top_k = getattr(text, "num_experts_per_tok", 1)
    prefill = prefill_bytes(text.hidden_size, expert_width, top_k, q_dim, longest + new_tokens, item)
    free, rows = [], []
    for device, count in layers.items():
        keep = prefill + (logits if device == head else 0)
        free.append(max(0, int(free_bytes(device) * EVAL_BATCH_MARGIN) - keep))
        rows.append(eval_row_bytes(count, kv_heads, head_dim, longest, new_tokens, item))
    return eval_batch(free, rows, examples)
