"""Benchmark: evaluation's decoding at the story's geometry, before and after, against the memory limit.

Two parts, one command:

1. **The expert GEMMs of one decode step** (E=128, gate_up [3072, 4096], down [4096, 1536], top-8 of
   each of `--batches` tokens): the fused NF4 kernel with the block config evaluation used before
   (`SMALL_GROUPS`), with the fused kernel's decode configs (`DECODE_GROUPS`, `DECODE_FEW`,
   `DECODE_WIDE` and `CANDIDATES`) and with the scale on the accumulator (`DECODE_ACC`,
   `_WIDE`, `_TALL` and `ACC_CANDIDATES`),
   each against the memory limit of the bytes it must read (the hit experts' codes, scales and states
   over the HBM bandwidth this script measures with a 4 GiB copy), and its numerics against a float32
   reference (dequantized weights, fp32 matmul).
2. **Whole decode steps** on the profile's architecture with random weights, loaded as evaluation loads it
   (`trainer.model.load_base(spread=True)`), sliced to `--layers` (default 16) and run at 2, 8 and 16 of
   them (`config.num_hidden_layers`), batches of 1, 8 and 64 prompts of `--prompt-tokens` (512):
     before    transformers' `generate` (dynamic cache) with the expert kernel's block config of before
     generate  the same with the decode tiles (`DECODE_GROUPS`, `DECODE_FEW`)
     static    `trainer.evaluation.decode.GreedyDecoder` without the graph (static cache, device-side step)
     graph     the same step captured as a CUDA graph and replayed (what evaluation now runs on one GPU)
     blocks    the step as evaluation runs it over several GPUs (`trainer/evaluation/decode_blocks.py`): a
               graph a quarter of the layers, here all on one GPU, so 4 copies-and-replays a step
     graph-prev  the graph with the layers of before `trainer.model.configure_inference`: Transformers'
               RMSNorm and RoPE, bitsandbytes' dequantize + matmul for the 4-bit projections
     graph-before  the graph with the expert GEMMs' configs of before the scale on the accumulator
               (`pick_before`: the fused kernel's decode tiles; `pick_config` now hands bf16 forwards of
               up to 32 rows an expert to `trainer.kernels.nf4_decode`)
   A step's time is (t(prefill + N2 tokens) - t(prefill + N1 tokens)) / (N2 - N1); per layer and fixed
   are the line through the depths. Beside each, the memory limit: the bytes one step reads (each layer's
   attention weights in NF4, the distinct experts the batch hits, its KV cache; the head in bf16) over the
   measured bandwidth. Tokens agree: how far (of 32 greedy tokens, averaged over rows) each path's tokens
   follow the path before (random weights give near-ties: a bf16 rounding apart flips one). Also the
   scoring forward (`trainer.evaluation.scoring.score_ids`, rows of a prefix and its labels, SCORE_TOKENS
   tokens) per depth.

    python benchmarks/decode_speed.py                       # on a GPU: the story's profile
    python benchmarks/decode_speed.py --profile tiny-cpu --layers 2 --batches 1,4 --depths 1,2  # CPU check

Writes decode_speed_<gpu>.md and .json under --out (default $OUT, else benchmarks/results/).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STORY = "qwen3-235b-a22b-thinking-4xh100"
# MMConfig kwargs tried at decode sizes (over DECODE_GROUPS).
BLOCKS = 4  # the `blocks` path: this many graphs a step, as a model over 4 GPUs has
CANDIDATES = [
    {"bm": 16, "bn": 256, "bk": 64, "warps": 4, "stages": 4, "programs_per_sm": 2},
    {"bm": 16, "bn": 128, "bk": 128, "warps": 4, "stages": 3, "programs_per_sm": 3},
]


def _acc(bm: int, bn: int, warps: int, stages: int, per_sm: int, **flags: bool) -> dict[str, Any]:
    """A scale-on-accumulator candidate: its tile, Triton's warps and stages, programs an SM, and flags."""
    return {"bm": bm, "bn": bn, "warps": warps, "stages": stages, "programs_per_sm": per_sm, **flags}


# The same with the scale on the accumulator (`trainer.kernels.nf4_decode`: K steps of one scale block).
ACC_CANDIDATES = [
    _acc(16, 64, 4, 4, 2), _acc(16, 64, 4, 4, 4), _acc(16, 128, 4, 3, 3), _acc(16, 128, 4, 6, 2),
    _acc(16, 128, 8, 4, 2), _acc(16, 256, 4, 4, 1), _acc(16, 256, 8, 4, 2), _acc(32, 128, 4, 4, 2),
    _acc(32, 128, 4, 3, 3), _acc(32, 256, 8, 3, 2), _acc(64, 128, 4, 3, 2), _acc(64, 128, 8, 3, 2),
    _acc(64, 256, 8, 3, 1),
    # each K step's scales loaded a step ahead (`prefetch`), on the picked tiles
    _acc(16, 128, 4, 3, 3, prefetch=True), _acc(32, 128, 4, 3, 3, prefetch=True),
    _acc(64, 128, 4, 3, 2, prefetch=True),
    # the codes read as 32-bit words, K reordered so a thread's bytes lie together (`words`); two words a
    # PTX call (decode_speed_h200_words2's "words2") gave the same machine code and was dropped
    _acc(16, 128, 4, 3, 3, words=True), _acc(32, 128, 4, 3, 3, words=True),
    _acc(64, 128, 4, 3, 2, words=True),
    _acc(16, 128, 4, 4, 3, words=True), _acc(16, 256, 8, 3, 2, words=True),
    # both (DECODE_ACC since decode_speed_h200_words2)
    _acc(16, 128, 4, 4, 3, words=True, prefetch=True),
    # the rows put in that K order by one gather before the kernel (`rows_in_order`, DECODE_ACC_WIDE and
    # _TALL since decode_speed_h200_rows), not by each tile's loads
    _acc(16, 128, 4, 4, 3, words=True, prefetch=True, rows_in_order=True),
    _acc(32, 128, 4, 3, 3, words=True, rows_in_order=True),
    _acc(64, 128, 4, 3, 2, words=True, rows_in_order=True),
    _acc(32, 128, 4, 3, 3, words=True, prefetch=True, rows_in_order=True),
    _acc(64, 128, 4, 3, 2, words=True, prefetch=True, rows_in_order=True),
    _acc(32, 128, 4, 3, 3, prefetch=True),
    # the byte permutes' table loaded into registers once ("table", decode_speed_h200_table) ran 20-30%
    # slower than the immediates and was dropped
]  # fmt: skip


def log(msg: str) -> None:
    print(f"[decode] {msg}", flush=True)


def bandwidth(torch: Any, device: Any) -> float:
    """Bytes/s of a 4 GiB device-to-device copy (read + write), median of 5."""
    n = 2**30 if device.type == "cuda" else 2**24
    a = torch.empty(n, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    times = []
    for _ in range(6):
        sync(torch, device)
        t = time.perf_counter()
        b.copy_(a)
        sync(torch, device)
        times.append(time.perf_counter() - t)
    return 2 * a.numel() * 4 / statistics.median(times[1:])


def sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(torch: Any, device: Any, fn: Any, repeat: int = 5) -> float:
    """Median seconds of fn() after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        sync(torch, device)
        t = time.perf_counter()
        fn()
        sync(torch, device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


# --- part 1: the expert GEMMs --------------------------------------------------------------------


def kernel_rows(
    torch: Any, device: Any, geometry: dict[str, int], bw: float, batches: list[int], only: str = ""
) -> list[dict]:
    from trainer.kernels import nf4_triton as k
    from trainer.nf4_pack import PackedLayout, quantize_experts_nf4

    e_n, hidden, width, topk = geometry["experts"], geometry["hidden"], geometry["width"], geometry["topk"]
    gen = torch.Generator(device=device).manual_seed(0)
    layouts = {
        "gate_up": PackedLayout(e_n, 2 * width, hidden, torch.bfloat16),
        "down": PackedLayout(e_n, hidden, width, torch.bfloat16),
    }
    packed = {
        name: quantize_experts_nf4(
            lambda e, lay=lay: torch.randn(lay.out, lay.inp, generator=gen, device=device) * 0.02, lay, device
        )
        for name, lay in layouts.items()
    }
    dense = {
        name: k.nf4_dequantize(packed[name], lay, torch.arange(e_n, device=device), torch.float32)
        for name, lay in layouts.items()
    }
    per_expert = {name: lay.nbytes / e_n for name, lay in layouts.items()}
    configs = [
        ("before: SMALL_GROUPS", k.SMALL_GROUPS),
        ("DECODE_GROUPS", k.DECODE_GROUPS),
        ("DECODE_FEW", k.DECODE_FEW),
        ("DECODE_WIDE", k.DECODE_WIDE),
        ("DECODE_ACC", k.DECODE_ACC),
        ("DECODE_ACC_WIDE", k.DECODE_ACC_WIDE),
        ("DECODE_ACC_TALL", k.DECODE_ACC_TALL),
    ]
    configs += [
        (
            f"bm{c['bm']} bn{c['bn']} bk{c['bk']} w{c['warps']} s{c['stages']} {c['programs_per_sm']}/SM",
            k.MMConfig(**{**k.DECODE_GROUPS.__dict__, **c}),
        )
        for c in CANDIDATES
    ]
    plain = replace(k.DECODE_ACC_WIDE, prefetch=False, words=False, rows_in_order=False)
    configs += [
        (
            f"acc bm{c['bm']} bn{c['bn']} w{c['warps']} s{c['stages']} {c['programs_per_sm']}/SM"
            + (" prefetch" if c.get("prefetch") else "")
            + (" words" if c.get("words") else "")
            + (" rows-in-order" if c.get("rows_in_order") else ""),
            k.MMConfig(**{**plain.__dict__, **c}),
        )
        for c in ACC_CANDIDATES
    ]
    if device.type != "cuda":
        cpu = ("before: SMALL_GROUPS", "DECODE_GROUPS", "DECODE_ACC", "DECODE_ACC_WIDE")
        configs = [(label, replace(cfg, decode=k.TREE)) for label, cfg in configs if label in cpu]
    if only:  # --configs: labels holding one of the comma-separated words
        configs = [(label, cfg) for label, cfg in configs if any(w in label for w in only.split(","))]
    rows = []
    for tokens in batches:
        scores = torch.rand(tokens, e_n, generator=gen, device=device)
        top = scores.topk(topk, dim=-1).indices.reshape(-1)
        sorted_e, _ = top.sort()
        counts = torch.bincount(sorted_e, minlength=e_n)
        offs = counts.cumsum(0).to(torch.int32)
        ids = torch.arange(e_n, device=device, dtype=torch.int32)
        hit = int((counts > 0).sum())
        m = top.numel()
        x = torch.randn(m, hidden, generator=gen, device=device).to(torch.bfloat16)
        h = torch.randn(m, width, generator=gen, device=device).to(torch.bfloat16)
        bytes_read = hit * (per_expert["gate_up"] + per_expert["down"])
        limit_ms = bytes_read / bw * 1e3
        refs = {
            "gate_up": _ref(torch, x, dense["gate_up"], sorted_e),
            "down": _ref(torch, h, dense["down"], sorted_e),
        }
        for label, cfg in configs:

            def run(
                cfg: Any = cfg, x: Any = x, h: Any = h, ids: Any = ids, offs: Any = offs
            ) -> tuple[Any, Any]:
                a = k.nf4_grouped_mm(x, packed["gate_up"], layouts["gate_up"], ids, offs, config=cfg)
                b = k.nf4_grouped_mm(h, packed["down"], layouts["down"], ids, offs, config=cfg)
                return a, b

            try:
                a, b = run()
                rel = max(_rel(torch, a, refs["gate_up"]), _rel(torch, b, refs["down"]))
                ms = timed(torch, device, run, repeat=20) * 1e3
            except Exception as exc:  # a config that does not compile here: a row that says so
                rows.append({"tokens": tokens, "config": label, "status": f"failed: {type(exc).__name__}"})
                log(f"kernel {label} @{tokens}: failed {exc}")
                continue
            row = {
                "tokens": tokens,
                "rows": m,
                "experts_hit": hit,
                "config": label,
                "ms": round(ms, 4),
                "bytes_read": int(bytes_read),
                "limit_ms": round(limit_ms, 4),
                "x_limit": round(ms / limit_ms, 2),
                "rel_err": float(f"{rel:.2e}"),
                "status": "ok",
            }
            rows.append(row)
            log(
                f"kernel {label:>36} @{tokens:>3} tokens: {ms:.3f} ms, {row['x_limit']}x limit, rel {rel:.1e}"
            )
    return rows


def pick_before(rows: int, groups: int, trans: bool = False, bf16: bool = True) -> Any:
    """`pick_config` before the scale on the accumulator: the fused kernel's decode tiles only."""
    from trainer.kernels import nf4_triton as k

    per_group = rows / max(groups, 1)
    if per_group <= 0.25:
        return k.DECODE_FEW
    if per_group <= 8:
        return k.DECODE_GROUPS
    if per_group <= 16:
        return k.DECODE_GROUPS if trans else k.DECODE_WIDE
    return k.SMALL_GROUPS if per_group <= k.SMALL_GROUP_ROWS else k.LARGE_GROUPS


@contextlib.contextmanager
def picked_by(pick: Any) -> Iterator[None]:
    """The expert GEMMs' configs chosen by `pick` instead of `pick_config`."""
    from trainer.kernels import nf4_triton as k

    saved = k.pick_config
    k.pick_config = pick
    try:
        yield
    finally:
        k.pick_config = saved


@contextlib.contextmanager
def layers_of_before(model: Any) -> Iterator[None]:
    """The model with the layers evaluation ran before `trainer.model.configure_inference`: Transformers'
    RMSNorm and RoPE, bitsandbytes' own 4-bit projections."""
    from trainer.fast_path import restore_forwards
    from trainer.layers import linear4bit_rows, rope
    from trainer.layers.fused_norm import is_rms_norm
    from trainer.model import configure_inference

    restore_forwards(model, is_rms_norm)
    restore_forwards(model, linear4bit_rows.is_linear4bit)
    rope.uninstall(model)
    try:
        yield
    finally:
        configure_inference(model)


def _ref(torch: Any, x: Any, weights: Any, experts: Any) -> Any:
    """Each row times its expert's dequantized weight, in float32, one expert at a time."""
    out = torch.empty(x.shape[0], weights.shape[1], device=x.device)
    for e in experts.unique().tolist():
        rows = experts == e
        out[rows] = x[rows].float() @ weights[e].t()
    return out


def _rel(torch: Any, got: Any, want: Any) -> float:
    return float((got.float() - want).norm() / want.norm())


# --- part 2: whole decode steps ------------------------------------------------------------------


def step_bytes(config: Any, layout_bytes: dict[str, float], batch: int, context: int) -> dict[str, float]:
    """Bytes one decode step reads: per layer (attention in NF4, the experts the batch hits, the KV cache)
    and fixed (the head in bf16)."""
    h, heads, kv, d = (
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    )
    attention_params = h * heads * d + 2 * h * kv * d + heads * d * h
    experts = config.num_experts
    hit = experts * (1 - (1 - config.num_experts_per_tok / experts) ** batch)
    per_layer = (
        attention_params * (0.5 + 1 / 64) + hit * layout_bytes["expert"] + batch * context * 2 * kv * d * 2
    )
    return {"per_layer": per_layer, "fixed": config.vocab_size * h * 2, "experts_hit": hit}


def decode_rows(args: argparse.Namespace, bw: float) -> tuple[list[dict], list[dict], dict]:
    import torch

    from cockpit.contract import LABEL_TOKENS, SCORE_TOKENS
    from cockpit.plan.run_length import ASSUMED_LABELS
    from cockpit.profiles import load_profile
    from trainer.evaluation import decode, decode_blocks, eval_batch
    from trainer.evaluation.eval_timing import scoring_rows
    from trainer.evaluation.scoring import score_ids
    from trainer.model import load_base
    from trainer.nf4_pack import PackedLayout

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from eval_placement import model_dir_of

    profile, _ = load_profile(args.profile)
    model_dir, _ = model_dir_of(profile)
    t0 = time.perf_counter()
    model = load_base(profile, model_dir, spread=True, random_layers=args.layers)
    log(f"loaded {args.layers} layers in {time.perf_counter() - t0:.0f} s")
    device = model.device
    config = model.config
    expert = sum(
        PackedLayout(1, o, i, torch.bfloat16).nbytes
        for o, i in (
            (2 * config.moe_intermediate_size, config.hidden_size),
            (config.hidden_size, config.moe_intermediate_size),
        )
    )
    gen = torch.Generator().manual_seed(0)
    vocab = config.vocab_size
    n1, n2 = args.tokens
    rows, scoring = [], []

    def run_generate(ids: Any, new: int) -> Any:
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
            )
        return out[:, ids.shape[1] :]

    ran: dict[str, str] = {}

    def run_fast(ids: Any, new: int, graph: bool) -> Any:
        with torch.no_grad():
            dec = decode.GreedyDecoder(model, ids, torch.ones_like(ids), new)
            tokens = dec.run(ids, set(), graph=graph)
            ran["last"] = dec.ran
            return tokens

    def run_blocks(ids: Any, new: int) -> Any:
        """A graph for each quarter of the layers, as on 4 GPUs (`trainer/evaluation/decode_blocks.py`), on
        one."""
        saved = decode_blocks.SPLIT_EVERY
        decode_blocks.SPLIT_EVERY = -(-config.num_hidden_layers // BLOCKS)  # ceil: BLOCKS graphs at most
        try:
            return run_fast(ids, new, True)
        finally:
            decode_blocks.SPLIT_EVERY = saved

    def run_before(ids: Any, new: int) -> Any:
        """generate with the expert kernel's block config of before (no decode tile)."""
        try:
            from trainer.kernels import nf4_triton
        except ImportError:  # no Triton (a CPU without it): no kernel, nothing else to undo
            return run_generate(ids, new)

        def training_tiles(rows: int, groups: int, trans: bool = False, bf16: bool = True) -> Any:
            per_group = rows / max(groups, 1)
            return nf4_triton.SMALL_GROUPS if per_group <= 128 else nf4_triton.LARGE_GROUPS

        with picked_by(training_tiles):
            return run_generate(ids, new)

    def run_graph_before(ids: Any, new: int) -> Any:
        with picked_by(pick_before):
            return run_fast(ids, new, True)

    def run_graph_prev(ids: Any, new: int) -> Any:
        with layers_of_before(model):
            return run_fast(ids, new, True)

    paths = {
        "before": run_before,
        "generate": run_generate,
        "static": lambda ids, new: run_fast(ids, new, False),
        "graph": lambda ids, new: run_fast(ids, new, True),
        "blocks": run_blocks,
        "graph-before": run_graph_before,
        "graph-prev": run_graph_prev,
    }
    if device.type != "cuda":
        del paths["graph"], paths["blocks"], paths["graph-before"], paths["graph-prev"]
    paths = {name: fn for name, fn in paths.items() if name in args.paths}
    chosen = eval_batch.choose(model, lambda: args.prompt_tokens, 512, 10_000)
    log(f"evaluation's batch from free memory with {args.layers} layers loaded: {chosen}")
    for depth in args.depths:
        config.num_hidden_layers = depth
        width = min(profile.training.seq_len, SCORE_TOKENS)
        prefixes, tails = scoring_rows(vocab, width - ASSUMED_LABELS * LABEL_TOKENS, ASSUMED_LABELS)
        score_s = timed(torch, device, lambda p=prefixes, t=tails: score_ids(model, p, t, 0), repeat=3)
        scoring.append({"layers": depth, "tokens": len(prefixes) * width, "seconds": round(score_s, 4)})
        log(f"scoring forward at {depth} layers: {score_s:.3f} s")
        for batch in args.batches:
            ids = torch.randint(1, vocab, (batch, args.prompt_tokens), generator=gen).to(device)
            limit = step_bytes(config, {"expert": expert}, batch, args.prompt_tokens + n2)
            reference = None
            for name, fn in paths.items():
                try:
                    fn(ids, 4)  # warm-up: kernels compiled, caches made
                    t1 = timed(torch, device, lambda fn=fn, ids=ids: fn(ids, n1), repeat=args.repeat)
                    t2 = timed(torch, device, lambda fn=fn, ids=ids: fn(ids, n2), repeat=args.repeat)
                    tokens = fn(ids, 32).tolist()
                except Exception as exc:  # a path that fails here: a row that says so, the others go on
                    log(f"{depth} layers batch {batch} {name}: failed: {type(exc).__name__}: {exc}")
                    rows.append(
                        {"layers": depth, "batch": batch, "path": name, "failed": f"{type(exc).__name__}"}
                    )
                    continue
                step = (t2 - t1) / (n2 - n1)
                if reference is None:
                    reference = tokens
                agree = statistics.fmean(
                    _common(a, b) / len(b) for a, b in zip(tokens, reference, strict=True)
                )
                bytes_step = limit["per_layer"] * depth + limit["fixed"]
                row = {
                    "layers": depth,
                    "batch": batch,
                    "path": name,
                    "step_ms": round(step * 1e3, 3),
                    "prefill_and_first_s": round(t1 - n1 * step, 4),
                    "tokens_per_s": round(batch / step, 1),
                    "bytes_per_step": int(bytes_step),
                    "limit_ms": round(bytes_step / bw * 1e3, 3),
                    "x_limit": round(step / (bytes_step / bw), 2),
                    "tokens_agree_with_before": round(agree, 3),
                    "ran": ran.pop("last", name),
                }
                rows.append(row)
                log(
                    f"{depth:>2} layers batch {batch:>2} {name:>8}: {row['step_ms']} ms a step "
                    f"({row['x_limit']}x the memory limit), tokens agree {agree:.0%} of the way"
                )
    profiled = []
    if args.profile_step:
        profiled = [{**r, "with": "now"} for r in profile_steps(model, device, gen, args)]
        if "graph-before" in paths:
            with picked_by(pick_before):
                profiled += [{**r, "with": "before"} for r in profile_steps(model, device, gen, args)]
    load = {"load_s": round(time.perf_counter() - t0, 1), "device": str(device), "eval_batch_chosen": chosen}
    return rows, scoring, load, profiled


def profile_steps(model: Any, device: Any, gen: Any, args: argparse.Namespace) -> list[dict]:
    """Device time a step by kernel: 8 static steps (no graph) at the deepest slice, at each batch; a
    row `all kernels` a batch gives their sum and count (a graph's step less that sum: the gaps)."""
    rows = []
    for batch in args.batches:
        rows += _profile_batch(model, device, gen, args, batch)
    return rows


def _profile_batch(model: Any, device: Any, gen: Any, args: argparse.Namespace, batch: int) -> list[dict]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from trainer.evaluation import decode

    model.config.num_hidden_layers = max(args.depths)
    ids = torch.randint(1, model.config.vocab_size, (batch, args.prompt_tokens), generator=gen).to(device)
    steps = 8
    with torch.no_grad(), decode.grouped_steps(model):
        dec = decode.GreedyDecoder(model, ids, torch.ones_like(ids), steps + 2)
        dec.prefill(ids)
        dec._step()
        sync(torch, device)
        activities = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
        with profile(activities=activities) as prof:
            for _ in range(steps):
                dec._step()
            sync(torch, device)
    rows = []
    attr = "device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    for event in prof.key_averages():
        total = getattr(event, attr, 0) or 0
        if total and (device.type != "cuda" or event.device_type.name == "CUDA"):
            rows.append(
                {
                    "batch": batch,
                    "kernel": event.key[:90],
                    "calls_a_step": event.count / steps,
                    "ms_a_step": total / 1e3 / steps,
                }
            )
    rows.sort(key=lambda r: -r["ms_a_step"])
    every = {
        "batch": batch,
        "kernel": "all kernels",
        "calls_a_step": sum(r["calls_a_step"] for r in rows),
        "ms_a_step": sum(r["ms_a_step"] for r in rows),
    }
    for r in [every, *rows[:15]]:
        log(f"profile batch {batch} {r['ms_a_step']:8.3f} ms {r['calls_a_step']:6.1f}x {r['kernel']}")
    return [every, *rows[:25]]


def _common(a: list[int], b: list[int]) -> int:
    """How many first tokens two rows share."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(b))


def fits(rows: list[dict], depths: list[int]) -> list[dict]:
    """Per path and batch: the line through the depths (per layer, fixed), and 16 predicted from 2 and 8."""
    from cockpit.rehearse.fit import Point, least_squares

    out = []
    rows = [r for r in rows if "failed" not in r]
    for key in sorted({(r["batch"], r["path"]) for r in rows}):
        pts = {r["layers"]: r["step_ms"] for r in rows if (r["batch"], r["path"]) == key}
        if len(pts) < 2:
            continue
        xs = sorted(pts)
        fixed, slope = least_squares([Point(x, pts[x]) for x in xs])
        row = {"batch": key[0], "path": key[1], "per_layer_ms": round(slope, 3), "fixed_ms": round(fixed, 2)}
        if len(xs) >= 3:
            f2, s2 = least_squares([Point(x, pts[x]) for x in xs[:-1]])
            predicted = f2 + s2 * xs[-1]
            row.update(
                {
                    "predicted_deepest_ms": round(predicted, 2),
                    "measured_deepest_ms": pts[xs[-1]],
                    "error": round(predicted / pts[xs[-1]] - 1, 4),
                }
            )
        out.append(row)
    return out


def render(result: dict[str, Any]) -> str:
    lines = [
        "# Decoding at the story's geometry (benchmarks/decode_speed.py)",
        "",
        f"{result['meta']['device']}; HBM copy bandwidth measured {result['meta']['bandwidth_tb_s']} TB/s. "
        "Memory limit = the bytes a step must read / that bandwidth.",
        "",
        "## Expert GEMMs of one decode step (gate_up then down, top-8)",
        "",
        "| tokens | rows | experts hit | config | ms | memory limit ms | x limit | rel err |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["kernels"]:
        if r["status"] != "ok":
            lines.append(f"| {r['tokens']} | | | {r['config']} | {r['status']} | | | |")
            continue
        lines.append(
            f"| {r['tokens']} | {r['rows']} | {r['experts_hit']} | {r['config']} | {r['ms']} | "
            f"{r['limit_ms']} | {r['x_limit']} | {r['rel_err']:.1e} |"
        )
    lines += [
        "",
        "## Whole decode steps",
        "",
        "| layers | batch | path | ran as | step ms | memory limit ms | x limit | tokens/s "
        "| agrees with before |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["steps"]:
        if "failed" in r:
            lines.append(f"| {r['layers']} | {r['batch']} | {r['path']} | failed: {r['failed']} | | | | | |")
            continue
        lines.append(
            f"| {r['layers']} | {r['batch']} | {r['path']} | {r.get('ran', r['path'])} | {r['step_ms']} "
            f"| {r['limit_ms']} | {r['x_limit']} | {r['tokens_per_s']:,} "
            f"| {r['tokens_agree_with_before']:.0%} |"
        )
    lines += [
        "",
        "## Per layer and fixed (a line through the depths; the deepest predicted from the others)",
        "",
        "| batch | path | per layer ms | fixed ms | deepest predicted ms | measured | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["fits"]:
        lines.append(
            f"| {r['batch']} | {r['path']} | {r['per_layer_ms']} | {r['fixed_ms']} | "
            f"{r.get('predicted_deepest_ms', '')} | {r.get('measured_deepest_ms', '')} | "
            f"{'' if 'error' not in r else format(r['error'], '+.1%')} |"
        )
    if result.get("profile"):
        lines += [
            "",
            "## Where a step's device time goes (static path, deepest slice, each batch)",
            "",
            "| expert GEMMs | batch | kernel | calls a step | ms a step |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {r.get('with', '')} | {r.get('batch', '')} | `{r['kernel']}` | {r['calls_a_step']:.0f} "
            f"| {r['ms_a_step']:.3f} |"
            for r in result["profile"]
        ]
    lines += ["", "## Scoring forward", "", "| layers | tokens | seconds |", "|---|---|---|"]
    lines += [f"| {r['layers']} | {r['tokens']} | {r['seconds']} |" for r in result["scoring"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", default=STORY)
    parser.add_argument("--layers", type=int, default=16, help="decoder layers loaded (the deepest slice)")
    parser.add_argument("--depths", default="2,8,16", help="slices timed, comma-separated, <= --layers")
    parser.add_argument("--batches", default="1,8,64", help="decode batch sizes, comma-separated")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--tokens", default="9,41", help="N1,N2: new tokens of the two timed calls")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--paths", default="before,generate,static,graph,blocks", help="decode paths timed")
    parser.add_argument("--no-kernels", action="store_true", help="skip part 1")
    parser.add_argument("--no-steps", action="store_true", help="skip part 2")
    parser.add_argument("--configs", default="", help="part 1: only configs whose label holds one of these")
    parser.add_argument("--name", default="", help="a suffix for the results' file names")
    parser.add_argument("--profile-step", action="store_true", help="profile 8 steps by kernel at the end")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks/results"))
    args = parser.parse_args(argv)
    args.depths = [int(x) for x in args.depths.split(",")]
    args.batches = [int(x) for x in args.batches.split(",")]
    args.tokens = [int(x) for x in args.tokens.split(",")]
    args.paths = args.paths.split(",")
    if max(args.depths) > args.layers:
        parser.error("--depths beyond --layers")
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bw = bandwidth(torch, device)
    log(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    result: dict[str, Any] = {
        "meta": {"device": name, "bandwidth_tb_s": round(bw / 1e12, 3), "argv": sys.argv[1:]}
    }
    geometry = {"experts": 128, "hidden": 4096, "width": 1536, "topk": 8}
    if device.type != "cuda":
        geometry = {"experts": 8, "hidden": 128, "width": 64, "topk": 2}
        os.environ.setdefault("TRITON_INTERPRET", "1")
    result["kernels"] = (
        [] if args.no_kernels else kernel_rows(torch, device, geometry, bw, args.batches, args.configs)
    )
    result["steps"], result["scoring"], result["profile"] = [], [], []
    if not args.no_steps:
        result["steps"], result["scoring"], load, result["profile"] = decode_rows(args, bw)
        result["meta"].update(load)
    result["fits"] = fits(result["steps"], args.depths)
    text = render(result)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from benchmarks.cards import card_tag

    tag = card_tag(name)
    (out / f"decode_speed_{tag}{args.name}.md").write_text(text)
    (out / f"decode_speed_{tag}{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
