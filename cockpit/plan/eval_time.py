"""The wall time of evaluating the base and the tuned model on the held-out split
(`trainer/evaluation/evaluate.py`), shared by `cockpit plan` (modelled here) and the rehearsal's forecast
(measured on slices: `cockpit.rehearse.evaluation`).

Evaluation classifies the held-out examples `EVAL_BATCH_SIZE` at a time: the batch's prompts are
prefilled, each thinks greedily for up to `eval.max_think_tokens` tokens (one decode step a token for the
whole batch, until its longest row ends: counted to the limit, an upper bound), then every label of an
example is scored after its thinking: a row of the prompt, the thinking and each label's tokens (the
prefix once for all the labels, `trainer.evaluation.scoring`), several rows to a forward of at most
`SCORE_TOKENS` tokens. Two systems, the base model and the tuned one, each over the whole split:

    time = systems x [batches x (prefill + think tokens x decode step) + scoring forwards x a forward]

The plan models the three costs on its GPU (`modelled_costs`):
- a decode step is memory-bound: the bytes it reads (every stored weight but the embeddings, the experts
  the batch routes to, the KV cache at the mean context) over the share of one GPU's HBM bandwidth the
  decode path reaches (`DECODE_BANDWIDTH_SHARE`; the layers are in blocks over the GPUs and run one after
  another, so the GPUs' bandwidths do not add), plus a fixed cost a step (`DECODE_FIXED_S`); both measured
  by `benchmarks/eval_speed.py` (`tests/test_plan_eval_time.py` holds them to its committed results);
- the prefill and a scoring forward are compute-bound: their model FLOPs at the bf16 rate the plan's step
  model measured (`cockpit.plan.speed`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cockpit.contract import (
    EVAL_BATCH_MARGIN,
    EVAL_BATCH_SIZE,
    LABEL_TOKENS,
    PROMPT_FRACTION,
    SCORE_LOGITS,
    SCORE_TOKENS,
    kv_cache_bytes,
    score_logit_bytes,
)
from cockpit.plan.run_length import ASSUMED_LABELS, EvalSplit, from_data_file

SYSTEMS = 2  # the base model and the tuned one
# The decode step as `benchmarks/eval_speed.py` measured it on one H100 (the story's 2-, 8- and 16-layer
# slices, batch 64, the fast decode path with the decode layers of `trainer.model.configure_inference`):
# its line's per-layer time against the memory limit of the bytes a layer reads gives the share of the
# bandwidth it reaches; its fixed part a step (the head, sampling, the loop's own work) is kept as measured.
DECODE_BANDWIDTH_SHARE = 0.3828
DECODE_FIXED_S = 0.000722
DECODE_SOURCE = "benchmarks/results/eval_speed_h100.json (batch 64, one H100)"
# Where evaluation's model spans several GPUs, its decode step replays a CUDA graph on each
# (`trainer/evaluation/decode_blocks.py`); each graph past the first costs this much, as
# `benchmarks/decode_speed.py` measured on one H200: the story's 16-layer slice cut into 4 graphs, at batch
# 64, less it as one graph, over the 3 more. Within the noise: at 2 and 8 layers the 4 graphs were the faster.
# The copies between GPUs (a batch's hidden states, 0.5 MB at batch 64) are not in it.
GRAPH_BLOCK_S = 0.000038
GRAPH_BLOCK_SOURCE = (
    "benchmarks/results/decode_speed_h200_blocks.json (16 layers, batch 64: 4 graphs less 1, over 3)"
)
# HBM bandwidth of a GPU, GB/s (datasheets: H200 4.8 TB/s, H100 SXM 3.35 TB/s, A100 80GB 2.0 TB/s).
HBM_GBPS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0}


def hbm_gbps(gpu_name: str) -> float:
    """A GPU's HBM bandwidth by its name (`HBM_GBPS`); 0.0 for one not in the table."""
    upper = gpu_name.upper()
    return next((v for k, v in HBM_GBPS.items() if k in upper), 0.0)


def eval_split(profile: Any, size: Any = None) -> EvalSplit | None:
    """What evaluation scores: the held-out split, or its sample of `eval.examples`. The split is the data
    file's (from `size`, a `DataSize` counted there, else read now), the built-in tenants', else the
    profile's assumption (the held-out share of `data.examples`); None when nothing says how large."""
    split = _held_out(profile, size)
    n = profile.eval.examples
    if split is None or not n or n >= split.examples:
        return split
    least = min(split.least, n) if split.least is not None else None
    return replace(split, examples=float(n), least=least, how=f"{split.how}; a sample of {n} (eval.examples)")


def budgeted(profile: Any, seconds: float) -> float:
    """Evaluation's seconds within `eval.time_budget_s` (its scoring stops after the batch that uses the
    budget up: a batch more at most, not counted); as they are without a budget."""
    budget = profile.eval.time_budget_s
    return min(seconds, budget) if budget else seconds


def _held_out(profile: Any, size: Any) -> EvalSplit | None:
    d = profile.data
    if size is not None and getattr(size, "held_out", None) is not None:
        return size.held_out
    if str(d.source).startswith("builtin:"):
        from cockpit.data.tenants import TENANTS

        mean = sum(len(t.labels) for t in TENANTS) / len(TENANTS)
        how = f"{d.source}: {len(TENANTS)} tenants x {d.eval_examples_per_tenant} held out"
        return EvalSplit(float(len(TENANTS) * d.eval_examples_per_tenant), mean, how)
    if Path(str(d.source)).expanduser().exists():
        here = from_data_file(profile)
        if here is not None and here.held_out is not None:
            return here.held_out
    if not d.examples:
        return None
    f = d.eval_fraction
    return EvalSplit(
        float(math.floor(d.examples * f / (1 - f))),
        float(ASSUMED_LABELS),
        f"assumed: the held-out {f:g} beside data.examples {d.examples} (fewer, "
        f"{math.floor(d.examples * f)}, if they count every example); {ASSUMED_LABELS} labels an example",
        least=float(math.floor(d.examples * f)),
    )


@dataclass(frozen=True)
class EvalShape:
    """What evaluation runs: the split, the prompts' and the thinking's tokens, the batch."""

    split: EvalSplit
    prompt_tokens: float
    think_tokens: int
    batch: int = EVAL_BATCH_SIZE
    systems: int = SYSTEMS

    @property
    def width(self) -> int:
        """Tokens of a scored row: the prompt, the thinking and every label of the example."""
        labels = math.ceil(self.split.labels)
        return math.ceil(self.prompt_tokens) + self.think_tokens + labels * LABEL_TOKENS

    @property
    def rows_per_forward(self) -> int:
        """Scored rows a forward holds (`trainer.evaluation.scoring.chunks`: at most `SCORE_TOKENS` tokens and
        `SCORE_LOGITS` kept positions, one row at least)."""
        kept = 1 + math.ceil(self.split.labels) * LABEL_TOKENS
        return max(1, min(SCORE_TOKENS // self.width, SCORE_LOGITS // kept))

    def batches(self, examples: float) -> int:
        return math.ceil(examples / self.batch)

    def batches_words(self, examples: float) -> str:
        """`1 batch`, `3 batches`."""
        n = self.batches(examples)
        return f"{n} batch" if n == 1 else f"{n} batches"

    def forwards(self, examples: float) -> int:
        """Scoring forwards of one system: a row an example, `rows_per_forward` rows each."""
        return math.ceil(examples / self.rows_per_forward)


@dataclass(frozen=True)
class EvalCosts:
    """What a batch's parts cost on one machine, seconds."""

    prefill_s: float  # a batch's prompts
    decode_step_s: float  # a decode step of the whole batch
    score_s: float  # a scoring forward of `rows_per_forward` rows


def eval_seconds(shape: EvalShape, costs: EvalCosts, examples: float | None = None) -> float:
    """Every system over the split: `systems x [batches x (prefill + think tokens x decode step) +
    scoring forwards x a forward]`."""
    n = shape.split.examples if examples is None else examples
    think = shape.batches(n) * (costs.prefill_s + shape.think_tokens * costs.decode_step_s)
    return shape.systems * (think + shape.forwards(n) * costs.score_s)


@dataclass(frozen=True)
class EvalTime:
    """Evaluation's wall time, its range, its parts, and how it was found."""

    shape: EvalShape
    costs: EvalCosts
    total_s: float
    range_s: tuple[float, float]
    how: str  # "modelled: ..." or "measured ..."
    measured: bool = False

    def to_dict(self) -> dict[str, Any]:
        s = self.shape
        return {
            "total_s": self.total_s,
            "range_s": list(self.range_s),
            "measured": self.measured,
            "how": self.how,
            "examples": s.split.examples,
            "examples_how": s.split.how,
            "labels": s.split.labels,
            "systems": s.systems,
            "batch": s.batch,
            "batches": s.batches(s.split.examples),
            "prompt_tokens": s.prompt_tokens,
            "think_tokens": s.think_tokens,
            "scoring_forwards": s.forwards(s.split.examples),
            "rows_per_forward": s.rows_per_forward,
            **vars(self.costs),
        }

    def words(self) -> str:
        """One line: `2 systems x 400 examples (7 batches of 64: prefill 1.2 s + 512 thinking tokens x
        0.26 s; 100 scoring forwards x 3.1 s) = 0.52 h (modelled: ...)`."""
        s, c = self.shape, self.costs
        n = s.split.examples
        lo, hi = self.range_s
        span = f" ({lo / 3600:.2f}-{hi / 3600:.2f} h)" if hi > lo else ""
        return (
            f"{s.systems} systems x {n:,.0f} examples ({s.batches_words(n)} of {s.batch}: prefill "
            f"{c.prefill_s:.2f} s + {s.think_tokens} thinking tokens x {c.decode_step_s * 1000:.1f} ms a "
            f"step; {s.forwards(n)} scoring forwards x {c.score_s:.2f} s) = {self.total_s / 3600:.2f} h"
            f"{span} ({self.how}); examples: {s.split.how}"
        )


def touched_experts(experts: int, top_k: int, batch: int) -> float:
    """The share of an MoE layer's experts a decode step of `batch` tokens routes to (each token picks
    `top_k` of `experts`, uniformly: 1 - (1 - k/E)^batch)."""
    if not experts:
        return 1.0
    return 1.0 - (1.0 - min(top_k, experts) / experts) ** batch


def decode_bytes(weights: Any, batch: int, context: float) -> float:
    """Bytes a decode step of `batch` rows at `context` tokens reads: every stored weight but the
    embeddings (a lookup), the experts only as far as the batch routes to them, and the KV cache."""
    g = weights.geometry
    share = touched_experts(g.experts, g.top_k, batch)
    read = 0.0
    for t, s in weights.items:
        if t.kind == "embeddings":
            continue
        read += (s.data_bytes + s.state_bytes) * (share if t.kind == "experts" else 1.0)
    return read + kv_cache_bytes(
        g.layers, g.kv_heads, g.head_dim, batch * context, weights.precision.act_bytes
    )


def forward_flops(geometry: Any, tokens: float, context: float) -> float:
    """Model FLOPs of a forward over `tokens` tokens whose causal attention sees `context` on average."""
    return tokens * (2 * geometry.active_matmul_params() + 4 * context * geometry.q_dim * geometry.layers)


def spread_overhead(gpus: int) -> float:
    """Seconds a decode step costs beyond one replayed graph where evaluation spans `gpus` GPUs (a graph
    a GPU: `GRAPH_BLOCK_S` for each past the first); nothing on one GPU."""
    return GRAPH_BLOCK_S * (gpus - 1) if gpus > 1 else 0.0


def modelled_costs(
    inputs: Any, gpu_name: str, shape: EvalShape, gpus: int = 1
) -> tuple[EvalCosts, str] | None:
    """The three costs on `gpus` GPUs of `gpu_name` (module docstring), and how; None where its bandwidth
    is not known (the CPU, a GPU not in `HBM_GBPS`)."""
    from cockpit.plan.inputs import datasheet_tflops

    bandwidth = hbm_gbps(gpu_name)
    if not bandwidth:
        return None
    a, g = inputs.assumptions, inputs.geometry
    speed = a.speed
    rate = speed.measured_tflops * a.tflops(gpu_name) / (datasheet_tflops(speed.gpu) or a.tflops(""))
    flops_s = rate * 1e12 * speed.efficiency
    prompt = max(1.0, shape.prompt_tokens)
    context = prompt + shape.think_tokens / 2
    read = decode_bytes(inputs.weights, shape.batch, context)
    spread = spread_overhead(gpus)
    step = DECODE_FIXED_S + read / (bandwidth * 1e9 * DECODE_BANDWIDTH_SHARE) + spread
    prefill = forward_flops(g, shape.batch * prompt, (prompt + 1) / 2) / flops_s
    rows = shape.rows_per_forward
    score = forward_flops(g, rows * shape.width, (shape.width + 1) / 2) / flops_s
    how = (
        f"modelled: a decode step reads its bytes (the experts "
        f"{touched_experts(g.experts, g.top_k, shape.batch):.0%} touched at batch {shape.batch}, the KV "
        f"cache) at {DECODE_BANDWIDTH_SHARE:.0%} of one GPU's {bandwidth:,.0f} GB/s, plus "
        f"{DECODE_FIXED_S * 1000:.1f} ms (both as measured: {DECODE_SOURCE})"
        + (
            f", plus {spread * 1000:.2f} ms for replaying a CUDA graph on each of {gpus} GPUs "
            f"({GRAPH_BLOCK_SOURCE})"
            if spread
            else ""
        )
        + "; prefill and scoring at "
        f"{rate * speed.efficiency:,.0f} TFLOP/s (the step model's bf16 rate, cockpit.plan.speed)"
    )
    return EvalCosts(prefill, step, score), how


def target_batch(inputs: Any, hw: Any, prompt: float, think: int, examples: float) -> tuple[int, str]:
    """Evaluation's batch on the plan's GPUs, as `trainer.evaluation.eval_batch` chooses it once loaded: the
    rows (`cockpit.contract.eval_row_bytes`) a GPU holds in what is left free, at most `MAX_EVAL_BATCH`. The
    placement balances the weights and the scoring logits over the GPUs (`trainer.weights.placement`: the
    first GPU, which keeps the embeddings, the head and the logits, gets fewer layers), so each GPU is left
    about the same; each also keeps room for a prefill chunk's activations (`cockpit.contract.prefill_bytes`).
    Without GPU memory known, `EVAL_BATCH_SIZE`, as on the CPU."""
    from cockpit.contract import eval_batch, eval_row_bytes, prefill_bytes

    g, w = inputs.geometry, inputs.weights
    gpus = hw.gpus  # evaluation is one process over one host's GPUs (trainer/weights/placement.py)
    if not gpus or not hw.gpu_mem_gib:
        return EVAL_BATCH_SIZE, f"{EVAL_BATCH_SIZE} (no GPU memory known)"
    item, tokens = inputs.precision.act_bytes, math.ceil(prompt)
    held = w.stored_bytes + score_logit_bytes(g.vocab)
    width = g.moe_intermediate or g.intermediate
    prefill = prefill_bytes(g.hidden, width, g.top_k or 1, g.q_dim, tokens + think, item)
    free = EVAL_BATCH_MARGIN * (hw.gpu_mem_gib * 1024**3 - held / gpus) - prefill
    layers = math.ceil(g.layers / gpus)
    row = eval_row_bytes(layers, g.kv_heads, g.head_dim, tokens, think, item)
    batch = eval_batch([max(0, int(free))], [row], math.ceil(examples))
    return batch, (
        f"{batch}: the rows of {tokens:,} + {think} tokens ({row / 2**20:,.0f} MiB of KV cache each on a "
        f"GPU of {layers} layers) that {hw.gpu_mem_gib:g} GiB hold beside its share of the weights, the "
        f"scoring logits and a prefill chunk's activations ({prefill / 2**30:.1f} GiB), as evaluation chooses"
    )


def eval_time(profile: Any, inputs: Any, hw: Any, size: Any = None) -> EvalTime | None:
    """The plan's evaluation on its GPUs (`hw`, modelled); None when the profile does not evaluate, the
    split's size is unknown, or the GPU's bandwidth is (the CPU)."""
    if not profile.eval.enabled or not hw.gpus:
        return None
    split = eval_split(profile, size)
    if split is None or not split.examples:
        return None
    seq_len = profile.training.seq_len
    mean = size.tokens / size.examples if size is not None and size.examples else profile.data.mean_tokens
    prompt = float(min(seq_len, mean or seq_len)) * PROMPT_FRACTION
    think = profile.eval.max_think_tokens
    batch, batch_how = target_batch(inputs, hw, prompt, think, split.examples)
    shape = EvalShape(split, prompt, think, batch)
    modelled = modelled_costs(inputs, hw.gpu_name, shape, hw.gpus)
    if modelled is None:
        return None
    costs, how = modelled
    total = budgeted(profile, eval_seconds(shape, costs))
    least = budgeted(profile, eval_seconds(shape, costs, split.least)) if split.least is not None else total
    prompt_how = f"{PROMPT_FRACTION:g} of an example's mean, as a rehearsal's random tokens make them"
    how += f"; prompts of {prompt:,.0f} tokens ({prompt_how}); batch {batch_how}"
    if profile.eval.time_budget_s:
        how += f"; at most eval.time_budget_s {profile.eval.time_budget_s:g} s"
    return EvalTime(shape, costs, total, (least, total), how)


def evaluation_words(evaluation: EvalTime | None, measured: Any = None) -> str:
    """The plan's line on evaluation: measured where a rehearsal of the configuration timed it on its
    slices (`measured`: its `cockpit.plan.measured.Measured`), else modelled; empty when neither knows."""
    timed = getattr(measured, "eval_s", None)
    if timed is not None:
        lo, hi = getattr(measured, "eval_range", None) or (timed, timed)
        beside = f"; modelled {evaluation.total_s / 3600:.2f} h" if evaluation is not None else ""
        return (
            f"{timed / 3600:.2f} h ({lo / 3600:.2f}-{hi / 3600:.2f} h), measured by {measured.source} "
            f"(its slices' prefill, decode steps and scoring forwards, scaled){beside}"
        )
    return "" if evaluation is None else evaluation.words()
