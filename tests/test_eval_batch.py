"""Evaluation's batch from free memory: the shared row formula (`cockpit.contract`) and its choice."""

from __future__ import annotations

from cockpit.contract import (
    MAX_EVAL_BATCH,
    PREFILL_TOKENS,
    SCORE_TOKENS,
    eval_batch,
    eval_row_bytes,
    prefill_bytes,
    prefill_rows,
)

STORY = {"kv_heads": 4, "head_dim": 128}
EXPERTS = {"hidden": 4096, "expert_width": 1536, "top_k": 8, "q_dim": 64 * 128}


def test_a_row_holds_its_kv_cache_in_every_layer_it_runs() -> None:
    one = eval_row_bytes(1, **STORY, prompt_tokens=512, new_tokens=512)
    two = eval_row_bytes(2, **STORY, prompt_tokens=512, new_tokens=512)
    kv_layer = 2 * 4 * 128 * 1024 * 2  # keys and values, 1,024 positions, bf16
    assert one == kv_layer and two == 2 * kv_layer
    longer = eval_row_bytes(1, **STORY, prompt_tokens=512, new_tokens=1024)
    assert longer - one == kv_layer // 2  # new tokens add cache


def test_a_prefill_chunk_holds_as_many_rows_as_its_key_slots_allow() -> None:
    """The prefill's activations are one chunk's: the same for rows of 512 and of 1,500 key slots (fewer
    rows), and one row's where it is longer than a chunk; the chunk holds whole rows only."""
    assert prefill_rows(1024) == PREFILL_TOKENS // 1024 and prefill_rows(10 * PREFILL_TOKENS) == 1
    assert prefill_rows(1000) * 1000 <= PREFILL_TOKENS < (prefill_rows(1000) + 1) * 1000
    per_token = 2 * (6 * 4096 + 8 * (4096 + 2 * 1536) + 2 * 8192)  # activations, repeated keys and values
    assert prefill_bytes(**EXPERTS, row_tokens=512) == PREFILL_TOKENS * per_token
    assert prefill_bytes(**EXPERTS, row_tokens=1500) == prefill_bytes(**EXPERTS, row_tokens=512)
    assert prefill_bytes(**EXPERTS, row_tokens=2 * PREFILL_TOKENS) == 2 * PREFILL_TOKENS * per_token
    assert SCORE_TOKENS <= PREFILL_TOKENS  # a scoring forward fits in the room a prefill chunk keeps


def test_the_batch_is_what_the_fullest_gpu_holds_within_the_bounds() -> None:
    row = eval_row_bytes(24, **STORY, prompt_tokens=512, new_tokens=512)
    assert eval_batch([100 * row, 40 * row], [row, row], 1000) == 40
    assert eval_batch([10_000 * row], [row], 1000) == MAX_EVAL_BATCH
    assert eval_batch([10_000 * row], [row], 37) == 37  # never more rows than examples
    assert eval_batch([row // 2], [row], 37) == 1  # at least one, even where none fits
