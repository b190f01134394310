"""What the trainer does, stated once: the planner predicts it and the trainer does it, both from here.

Torch-free on purpose: `cockpit.plan` reads these numbers to count bytes and time, `trainer/` reads the
same numbers to lay out tensors and pick code paths, and `tests/test_contract.py` checks that the two
agree on real tensors. A trainer change that would make the plan drift changes this file instead.
"""

from __future__ import annotations

from typing import Any

# --- NF4 storage -------------------------------------------------------------------------------------
# 64 weights share one absmax scale (bitsandbytes' blocksize, for Linear4bit and our packed experts).
NF4_BLOCKSIZE = 64
# bitsandbytes' double quantization of Linear4bit scales: 8-bit blocks of 256 scales.
BNB_NESTED_BLOCKSIZE = 256
# The trainer's packed experts double-quantize per expert, with the first of these that divides an
# expert's number of blocks (blocks never straddle two experts).
PACKED_NESTED_BLOCKSIZES = (256, 128, 64)
# Experts are quantized at load and dequantized in training this many bytes of 16-bit weights at a time.
DEQUANT_CHUNK_BYTES = 512 * 1024**2
# On a GPU the NF4 experts take the dequant path (every expert dequantized at once, then torch's grouped
# GEMM) from this many token-expert pairs an expert on, the fused kernel below (`trainer.layers.experts4bit`;
# the faster of the two on an H200, benchmarks/results/nf4_kernels_h200.md). Under gradient checkpointing
# that path keeps the recompute's weights for the backward (`trainer.layers.frozen_experts`).
DEQUANT_MIN_ROWS = 384
# Float dtypes packed 4-bit bytes may be stored in (DeepSpeed moves float parameters' bytes untouched),
# with the bytes of one item.
PACKED_STORAGE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
PACKED_STORAGE_DTYPES = tuple(PACKED_STORAGE_BYTES)

# --- the loss ------------------------------------------------------------------------------------------
# The head's logits are computed this many bytes (fp32) at a time, never whole (trainer/layers/loss.py).
LOSS_CHUNK_BYTES = 256 * 1024**2

# --- ZeRO-3 gathers --------------------------------------------------------------------------------------
# ZeRO-3 gathers a decoder layer's weights this many times a micro-batch (with parameter offload, each
# gather crosses the host-to-device link): once for the forward, once for the recompute and the backward
# together (the layer is the unit gathered, `deepspeed.zero3_leaf`). Measured on the H200 with
# torch.profiler (benchmarks/results/step_speed_h200.md), 4 layers of 1.21 GB of experts each:
# - embeddings on the host, prefetch 1 layer: 12.73 GB a micro-batch = 7 layers (the last kept from its
#   forward to its backward) + the embedding twice (forward lookup, backward hook) + the lm_head once;
# - embeddings on the GPU (`deepspeed.embeddings_on_gpu`): 8.99 GB = 7 layers; with prefetch 2, 7.71 GB
#   = 6 layers (a larger live budget keeps one more across the turn). At the story's 94 layers the turn
#   is noise: two fetches a layer.
ZERO3_LAYER_FETCHES = 2
# Layers kept gathered in training beyond the computing one and those prefetched, on one rank with the
# overlapped fetch (`trainer/weights/zero3_fetch.py`): the host runs ahead to DeepSpeed's live-parameter
# budget, and a released layer's memory is held until the kernels that read it are done. Measured on the
# story's slice (one H200, prefetch 3, 4 rows x accumulation 2): the training peak grows by a whole layer
# up to about 6 layers (1.30 GiB a layer from 1 to 4, 0.75 from 4 to 8), then by 0.159 GiB a layer (8 to
# 48 layers) - the rehearsal's knee for the GPU peak (`cockpit.rehearse.figures.gathered_knee`). On one
# H100 with FlashAttention-4 (benchmarks/fit_memory.py's records), from 4 layers to 8: 2.55 GiB beyond the
# checkpoints at 4 rows x accumulation 2 (two 1.2 GiB layers), 0.14 to 0.65 GiB with one micro-batch a
# step (`GATHERED_BEYOND_PREFETCH_ONE`, a layer bounds it).
GATHERED_BEYOND_PREFETCH = 2
GATHERED_BEYOND_PREFETCH_ONE = 1


def overlapped_fetch(ranks: int, offload_param: str) -> bool:
    """Whether offloaded layers come by the trainer's overlapped fetch (`trainer/weights/zero3_fetch.py`):
    one rank, parameter offload to the CPU; several ranks use DeepSpeed's own."""
    return ranks == 1 and offload_param == "cpu"


def gathered_beyond_prefetch(ranks: int, offload_param: str, grad_accum: int) -> int:
    """Layers held gathered beyond the computing one and those prefetched: only where the overlapped
    fetch runs, more with gradient accumulation."""
    if not overlapped_fetch(ranks, offload_param):
        return 0
    return GATHERED_BEYOND_PREFETCH if grad_accum > 1 else GATHERED_BEYOND_PREFETCH_ONE


def keeps_embeddings(embeddings_on_gpu: bool, stage: int, offload_param: str, gpus: int) -> bool:
    """Whether the embedding and lm_head stay on the GPUs (`deepspeed.embeddings_on_gpu`): under ZeRO-3
    with parameter offload to the CPU, on GPUs (NVMe partitions are swap-buffer placeholders between
    fetches; without offload every weight is on the GPU already)."""
    return embeddings_on_gpu and gpus > 0 and stage == 3 and offload_param == "cpu"


# --- evaluation ------------------------------------------------------------------------------------------
# Held-out examples whose thinking is generated together (trainer/evaluation/evaluate.py; the forecast's
# estimate). 64 rather than 16: `cockpit eval` of the tiny run took 50 s instead of 78 s on 2 cores, same F1;
# on the story's GPUs the KV cache of 64 sequences of ~2,000 tokens is about 25 GB spread over the layer
# blocks.
EVAL_BATCH_SIZE = 64
# On a GPU the batch is as large as the memory left after loading holds (`eval_batch`), up to this: at
# 64 prompts a decode step already reads nearly every expert of a layer (126 of 128 at top-8), so a larger
# batch adds rows at little more cost a step (benchmarks/results/decode_speed_h200.md); 512 holds the
# story's held-out 400 in one batch.
MAX_EVAL_BATCH = 512
# A thinking batch's prompts go through the model a chunk of rows at a time (`trainer/evaluation/decode.py`),
# at most this many of a row's key slots (its prompt and new tokens) a chunk, one row at least: the prefill's
# activations are a chunk's, not the batch's, so the batch is bounded by its KV cache alone. A scoring
# forward (`SCORE_TOKENS`) fits in the same room.
PREFILL_TOKENS = 32_768
# Bytes a token holds in a layer's activations while a prompt goes through it (the prefill), besides its
# KV cache: its hidden state a few times over (residual, norm, attention output), its query, and its
# top-k expert rows (the input spread to each expert and the gate/up output), in the compute dtype.
PREFILL_HIDDEN_COPIES = 6


def kv_cache_bytes(layers: int, kv_heads: int, head_dim: int, tokens: float, item: int = 2) -> int:
    """Bytes of the keys and values of `tokens` positions in `layers` decoder layers."""
    return int(layers * 2 * kv_heads * head_dim * tokens * item)


def prefill_rows(row_tokens: int) -> int:
    """Rows of a thinking batch prefilled together: as many rows of `row_tokens` key slots (a prompt and
    its new tokens) as `PREFILL_TOKENS` holds, one at least."""
    return max(1, PREFILL_TOKENS // max(1, row_tokens))


def eval_row_bytes(
    layers: int, kv_heads: int, head_dim: int, prompt_tokens: int, new_tokens: int, item: int = 2
) -> int:
    """Device bytes one evaluation row holds on a GPU that runs `layers` decoder layers: its KV cache for
    the prompt and the new tokens in every one of them."""
    return kv_cache_bytes(layers, kv_heads, head_dim, prompt_tokens + new_tokens, item)


def prefill_bytes(
    hidden: int, expert_width: int, top_k: int, q_dim: int, row_tokens: int, item: int = 2
) -> int:  # fmt: skip
    """Device bytes a prefill chunk takes in the layer it runs, on every GPU that runs decoder layers,
    beside the batch's rows: `PREFILL_TOKENS` tokens (or one longer row of `row_tokens`), each with
    `PREFILL_HIDDEN_COPIES` hidden states, the top-k experts' input row and gate/up output, and its key
    and value repeated for every query head (sdpa with a mask attends over the whole row's slots)."""
    per_token = PREFILL_HIDDEN_COPIES * hidden + top_k * (hidden + 2 * expert_width) + 2 * q_dim
    return item * max(PREFILL_TOKENS, row_tokens) * per_token


def eval_batch(free_bytes: list[int], row_bytes: list[int], examples: int) -> int:
    """Evaluation's batch on GPUs with `free_bytes` left after loading (each less what it must keep for
    the scoring forward), each holding `row_bytes` a row: the most rows every GPU holds, at most
    `MAX_EVAL_BATCH` and the examples to score, at least 1."""
    fits = min((free // row for free, row in zip(free_bytes, row_bytes, strict=True) if row), default=0)
    return max(1, min(fits, MAX_EVAL_BATCH, max(examples, 1)))


# Of each GPU's memory free once the model is loaded, the share evaluation's rows may take (fragmentation
# and kernels' workspaces keep the rest): `trainer/evaluation/eval_batch.py` measures the free memory, the
# plan models it (`cockpit/plan/eval_time.py`).
EVAL_BATCH_MARGIN = 0.9
# Bytes a logit of the scoring forward (`trainer.evaluation.scoring`) holds: the fp32 copy of the kept logits
# (4) and its log-softmax (4) are alive together; the compute-dtype logits are freed before the second.
SCORE_LOGIT_BYTES = 8
# Positions whose logits a scoring forward keeps, at most (`trainer.evaluation.scoring.chunks`): a row's
# prefix last and its labels' tokens (at the story's 4 labels of a few tokens, about 20 a row, 21 rows a
# forward).
SCORE_LOGITS = 1_024


def score_logit_bytes(vocab: int) -> int:
    """Bytes a scoring forward's kept logits take on the head's device (placement, the batch and the
    plan keep room for them there)."""
    return SCORE_LOGITS * vocab * SCORE_LOGIT_BYTES


# A scored row's tail: the label and its end of turn (assumed: a few tokens), after prompt and thinking.
LABEL_TOKENS = 4
# The share of an example before its answer where no data says so: the rehearsal's random rows
# (`trainer.inputs.data.synthetic_rows`) are made so, and the plan and the rehearsal's prompts assume it.
PROMPT_FRACTION = 0.5
# The shorter thinking call a timed decode step is the difference from (`trainer.evaluation.eval_timing`):
# past 2 tokens, so that every decode path sets itself up (the fast path's CUDA graph) as for a whole
# thinking.
EVAL_FIRST_TOKENS = 3
# Label scoring runs rows of an example's prefix and its labels (`trainer.evaluation.scoring`), several
# examples a forward, at most this many tokens a forward.
SCORE_TOKENS = 32_768

# --- the loader --------------------------------------------------------------------------------------
LOADERS = ("layerwise", "transformers")


def load_builder(unit: int, ranks: int) -> int:
    """The rank that reads and quantizes unit `unit` of a layer-by-layer load over `ranks` ranks (decoder
    layer i is unit i, embeddings, final norm and head together the unit after the last layer); it
    broadcasts the unit to the others (`trainer/weights/load_share.py`), in rounds of one unit a rank."""
    return unit % ranks


# --- the built-in tiny model (trainer/inputs/tiny.py builds it; the planner plans it) ------------------
TINY_MODEL: dict[str, Any] = {
    "vocab_size": 1024,
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 256,
    "moe_intermediate_size": 256,
    "num_experts": 16,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 512,
    "norm_topk_prob": True,
    "tie_word_embeddings": False,
}


def best_fit_decreasing(lengths: list[int], seq_len: int, seed: int = 0) -> list[list[int]]:
    """How the trainer packs examples: indices of `lengths`, longest first, each into the fullest row of
    `seq_len` tokens that still has room for it, then the rows in a seeded random order (empty examples
    dropped; ValueError for one longer than a row).

    Longest-first packing leaves little room unused (about 1% for the story's 3,600 examples of 1,000 to
    3,000 tokens in rows of 4,096, against 4% for first-fit in random order); the shuffle keeps the
    training order random.
    """
    import bisect
    import random

    bins: list[list[int]] = []
    rooms: list[tuple[int, int]] = []  # (free tokens, bin index), sorted
    for i in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        n = lengths[i]
        if n == 0:
            continue
        if n > seq_len:
            raise ValueError(f"example of {n} tokens is longer than seq_len {seq_len}")
        at = bisect.bisect_left(rooms, (n, -1))
        if at < len(rooms):
            free, b = rooms.pop(at)
            bins[b].append(i)
        else:
            free, b = seq_len, len(bins)
            bins.append([i])
        bisect.insort(rooms, (free - n, b))
    random.Random(seed).shuffle(bins)
    return bins


def example_lengths(
    mean_tokens: int, seq_len: int, count: int, spread: float = 0.5, seed: int = 0
) -> list[int]:
    """Lengths of assumed examples, as a rehearsal without the data draws them: uniform within ±`spread`
    of `mean_tokens`, at least 2 tokens, at most `seq_len`."""
    import random

    rng = random.Random(seed)
    return [
        max(2, min(seq_len, round(mean_tokens * rng.uniform(1 - spread, 1 + spread)))) for _ in range(count)
    ]


def packed_fill(
    mean_tokens: int, seq_len: int, spread: float = 0.5, count: int = 2000, seed: int = 0
) -> float:
    """The share of packed slots holding a token for `example_lengths`, as `best_fit_decreasing` packs
    them: the fill a run of that data would get."""
    lengths = example_lengths(mean_tokens, seq_len, count, spread, seed)
    rows = best_fit_decreasing(lengths, seq_len, seed)
    return sum(lengths) / (len(rows) * seq_len)


def packed_nested_blocksize(blocks: int) -> int:
    """The nested block size of one expert's `blocks` scales; ValueError when none divides them."""
    for size in PACKED_NESTED_BLOCKSIZES:
        if blocks % size == 0:
            return size
    raise ValueError(
        f"{blocks} blocks an expert: no nested block size in {PACKED_NESTED_BLOCKSIZES} divides it"
    )


def packed_expert_problem(out: int, inp: int, storage_dtype: str) -> str | None:
    """Why the trainer cannot pack one expert's [out, in] weight in NF4 stored as `storage_dtype` (None:
    it can). The one rule the loader refuses a layout by, and plan and doctor with it: the weights fill
    whole NF4 blocks, the blocks a nested block size (`packed_nested_blocksize`), and the codes, scales
    and state whole items of the storage dtype."""
    numel = out * inp
    if numel % NF4_BLOCKSIZE:
        return f"expert weight {out}x{inp} is not a whole number of {NF4_BLOCKSIZE}-blocks"
    blocks = numel // NF4_BLOCKSIZE
    try:
        nested = packed_nested_blocksize(blocks)
    except ValueError as exc:
        return f"expert weight {out}x{inp}: {exc}"
    itemsize = PACKED_STORAGE_BYTES[storage_dtype]
    for what, nbytes in (("codes", numel // 2), ("scales", blocks), ("state", 4 * (blocks // nested + 1))):
        if nbytes % itemsize:
            return (
                f"expert weight {out}x{inp}: {what} of {nbytes} bytes do not fill whole {storage_dtype} items"
            )
    return None


def dequant_chunk_experts(num_experts: int, numel_per_expert: int) -> int:
    """Experts dequantized at once when each holds `numel_per_expert` 16-bit weights."""
    return max(1, min(num_experts, DEQUANT_CHUNK_BYTES // (2 * numel_per_expert)))


def dequant_rows(rows_per_expert: float) -> bool:
    """Whether NF4 experts given this many token-expert pairs an expert take the dequant path on a GPU."""
    return rows_per_expert >= DEQUANT_MIN_ROWS


def dequant_path(tokens: int, top_k: int, experts: int) -> bool:
    """Whether a micro-batch of `tokens` takes the NF4 experts' dequant path on a GPU."""
    return experts > 0 and dequant_rows(tokens * top_k / experts)


def loss_chunk_rows(vocab_size: int) -> int:
    """Target rows whose fp32 logits are alive at once in the chunked loss."""
    return max(64, LOSS_CHUNK_BYTES // (4 * vocab_size))


def experts_storage_dtype(bf16: bool, storage_dtype: str) -> str:
    """The float dtype packed NF4 experts are stored in: the training dtype under bf16, else the profile's.

    DeepSpeed casts float parameters that are not yet ZeRO parameters to the training dtype; packed bytes
    survive only a cast to the dtype they already have.
    """
    if bf16:
        return "bfloat16"
    return storage_dtype if storage_dtype in PACKED_STORAGE_DTYPES else "float32"


def loader_of(loader: str, trust_remote_code: bool) -> str:
    """The loader the trainer uses: `model.loader`, except that remote code goes through from_pretrained."""
    return "transformers" if trust_remote_code else loader


def kind_of(name: str) -> str:
    """The kind of a parameter, by name: the plan's groups and the trainer's audit count with these rules."""
    n = name.lower()
    if "lora_" in n:
        return "lora"
    if "embed_tokens" in n or "wte" in n:
        return "embeddings"
    if "lm_head" in n:
        return "lm_head"
    if "experts" in n:
        return "experts"
    if ".gate." in n or n.endswith(".gate.weight") or "router" in n:
        return "router"
    if "norm" in n:
        return "norms"
    if "self_attn" in n or "attention" in n:
        return "attention"
    if "mlp" in n:
        return "dense_mlp"
    return "other"
