"""Evaluation's batch from free memory: the shared row formula (`cockpit.contract`) and its choice."""

from __future__ import annotations

from cockpit.contract import MAX_EVAL_BATCH, eval_batch, eval_row_bytes

STORY = {"kv_heads": 4, "head_dim": 128, "hidden": 4096, "expert_width": 1536, "top_k": 8}


def test_a_row_holds_its_kv_cache_in_every_layer_it_runs_and_one_layer_s_prefill() -> None:
    one = eval_row_bytes(1, **STORY, prompt_tokens=512, new_tokens=512)
    two = eval_row_bytes(2, **STORY, prompt_tokens=512, new_tokens=512)
    kv_layer = 2 * 4 * 128 * 1024 * 2  # keys and values, 1,024 positions, bf16
    assert two - one == kv_layer  # the prefill's activations are one layer's, whatever the depth
    longer = eval_row_bytes(1, **STORY, prompt_tokens=512, new_tokens=1024)
    assert longer - one == kv_layer // 2  # new tokens add cache, not prefill


def test_the_batch_is_what_the_fullest_gpu_holds_within_the_bounds() -> None:
    row = eval_row_bytes(24, **STORY, prompt_tokens=512, new_tokens=512)
    assert eval_batch([100 * row, 40 * row], [row, row], 1000) == 40
    assert eval_batch([10_000 * row], [row], 1000) == MAX_EVAL_BATCH
    assert eval_batch([10_000 * row], [row], 37) == 37  # never more rows than examples
    assert eval_batch([row // 2], [row], 37) == 1  # at least one, even where none fits
