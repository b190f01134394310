"""Evaluation's placement over several GPUs: accelerate's way against the hand-written equal blocks.

For a profile and GPU counts of a given memory, the evaluation's planning model
(`trainer/weights/placement.py`: the architecture on the meta device holding the bytes the loaded model holds,
and the evaluation's working memory: the scoring logits on the head, each layer's KV cache) is placed by
accelerate, as evaluation now does, and by the hand-written placement it replaced (`spread_devices`: equal
blocks of layers, everything else on the first GPU). Per GPU: its decoder layers, weights, working memory,
total and budget (the GPU's memory x `USABLE_FRACTION`). No weights and no GPU needed.

    python benchmarks/eval_placement.py                          # the story's profile, 2 and 4 H200s
    python benchmarks/eval_placement.py --profile tiny-cpu --gpus 2
    python benchmarks/eval_placement.py --gpus 4 --gpu-mem-gib 80  # the story's own 4 x H100-80GB

Writes eval_placement.md and .json under $OUT (else benchmarks/results/).

With `--run`, on the GPUs here (none: it says so and exits 2): the profile's model is loaded as
evaluation loads it (`load_base(spread=True)`), from its weights where `model.path` holds them, else with
random weights of its config sliced to `--layers`; then one scoring forward of SCORE_TOKENS tokens
(`trainer.evaluation.scoring.score_ids`) and one thinking batch (`generate`, EVAL_BATCH_SIZE prompts of
`--prompt-tokens`, `eval.max_think_tokens` new tokens each). Per GPU: the planned layers and bytes
against the allocated peak of the load, the scoring forward and the thinking; load time and tokens/s.
Writes eval_placement_run.md and .json.

    python benchmarks/eval_placement.py --run --layers 8
    CUDA_VISIBLE_DEVICES=0 python benchmarks/eval_placement.py --run --layers 8   # the one-GPU baseline
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STORY = "qwen3-235b-a22b-thinking-4xh100"
GiB = 2**30
# An H200 as torch sees it: 143,771 MiB.
H200_GIB = 140.4


def _gib(n: float) -> str:
    return f"{n / GiB:.1f}"


def _size(n: float, unit: str) -> str:
    return f"{n / GiB:.1f}" if unit == "GiB" else f"{n / 2**20:.1f}"


def layer_ranges(layer_devices: list[int]) -> dict[int, str]:
    """Each GPU's decoder layers as `first-last`."""
    seen: dict[int, list[int]] = {}
    for i, d in enumerate(layer_devices):
        seen.setdefault(d, []).append(i)
    return {d: f"{v[0]}-{v[-1]}" if len(v) > 1 else str(v[0]) for d, v in seen.items()}


def placement_rows(placement: Any) -> list[dict[str, Any]]:
    """One row a GPU: layers, weights, working memory, total and budget in bytes."""
    ranges = layer_ranges(placement.layer_devices)
    per = placement.layers_per_device()
    rows = []
    for d in sorted(placement.budgets):
        total, weights = placement.bytes_per_device[d], placement.weights_per_device[d]
        rows.append(
            {
                "gpu": d,
                "layers": per[d],
                "layer_range": ranges.get(d, "-"),
                "home": d == placement.home,
                "weights_bytes": weights,
                "working_bytes": total - weights,
                "total_bytes": total,
                "budget_bytes": placement.budgets[d],
            }
        )
    return rows


def compare(profile_name: str, gpu_counts: list[int], gpu_mem_gib: float) -> dict[str, Any]:
    """Both placements of the profile's planning model for each GPU count."""
    from cockpit.profiles import load_profile
    from trainer.weights.placement import (
        USABLE_FRACTION,
        PlacementError,
        WorkingMemory,
        model_config,
        place,
        place_by_hand,
        planning_model,
    )

    profile, _ = load_profile(profile_name)
    model_dir, _ = model_dir_of(profile)
    config = model_config(profile, model_dir)
    working = WorkingMemory.of(config, profile)
    model = planning_model(profile, config, working)
    result: dict[str, Any] = {
        "profile": profile_name,
        "gpu_mem_gib": gpu_mem_gib,
        "usable_fraction": USABLE_FRACTION,
        "layers": config.get_text_config().num_hidden_layers,
        "working_memory": {
            "logits_bytes": working.logits_bytes,
            "kv_bytes_per_layer": working.kv_bytes_per_layer,
        },
        "cases": [],
    }
    for n in gpu_counts:
        budgets = dict.fromkeys(range(n), int(gpu_mem_gib * GiB * USABLE_FRACTION))
        for way, fn in (("accelerate", place), ("hand-written", place_by_hand)):
            case: dict[str, Any] = {"gpus": n, "way": way}
            try:
                placement = fn(model, budgets)
            except PlacementError as exc:
                case["error"] = str(exc)
            else:
                rows = placement_rows(placement)
                case.update(
                    rows=rows,
                    notes=placement.notes,
                    max_total_bytes=max(r["total_bytes"] for r in rows),
                    min_total_bytes=min(r["total_bytes"] for r in rows),
                    over_budget=[r["gpu"] for r in rows if r["total_bytes"] > r["budget_bytes"]],
                )
            result["cases"].append(case)
    return result


def model_dir_of(profile: Any) -> tuple[str, bool]:
    """Where the profile's model config is, and whether its weights are there too (else only its
    `model.config` folder is: enough for a plan, and for random weights)."""
    if profile.model.path.startswith("builtin:"):
        from trainer.inputs import tiny

        return str(tiny.model_path(seed=0)), True
    if (Path(profile.model.path) / "config.json").is_file() or not profile.model.config:
        return profile.model.path, True
    return str(Path(profile.model.config).parent), False


def render_comparison(result: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    wm = result["working_memory"]
    console.print(
        f"{result['profile']}: {result['layers']} decoder layers; GPUs of {result['gpu_mem_gib']} GiB, "
        f"budget {result['usable_fraction']:.0%} of it; working memory: scoring logits "
        f"{_gib(wm['logits_bytes'])} GiB on the head's GPU, KV cache {wm['kv_bytes_per_layer'] / 2**20:.0f} "
        "MiB a layer"
    )
    largest = max((c["max_total_bytes"] for c in result["cases"] if "error" not in c), default=GiB)
    unit = "GiB" if largest >= 10 * GiB else "MiB"
    for n in sorted({c["gpus"] for c in result["cases"]}):
        table = Table(title=f"{n} GPUs")
        for col in ("way", "GPU", "layers", "which", f"weights {unit}", f"working {unit}",
                    f"total {unit}", "budget GiB"):  # fmt: skip
            table.add_column(col, justify="left" if col in ("way", "which") else "right")
        for case in (c for c in result["cases"] if c["gpus"] == n):
            if "error" in case:
                table.add_row(case["way"], "-", "-", case["error"], "", "", "", "")
                continue
            for r in case["rows"]:
                over = " over" if r["total_bytes"] > r["budget_bytes"] else ""
                table.add_row(
                    case["way"],
                    f"cuda:{r['gpu']}",
                    str(r["layers"]),
                    r["layer_range"] + (" + embed, norm, head" if r["home"] else ""),
                    _size(r["weights_bytes"], unit),
                    _size(r["working_bytes"], unit),
                    _size(r["total_bytes"], unit) + over,
                    _gib(r["budget_bytes"]),
                )
            table.add_section()
        console.print(table)
        for case in (c for c in result["cases"] if c["gpus"] == n and "error" not in c):
            console.print(
                f"  {case['way']}: fullest GPU {_size(case['max_total_bytes'], unit)} {unit}, emptiest "
                f"{_size(case['min_total_bytes'], unit)} {unit}"
                + (f"; over budget: {case['over_budget']}" if case["over_budget"] else "")
                + (f"; {'; '.join(case['notes'])}" if case["notes"] else "")
            )


# --- a real evaluation forward on the GPUs here ---------------------------------------------------
def run_on_gpus(profile_name: str, layers: int | None, prompt_tokens: int) -> dict[str, Any]:
    """Load as evaluation does over the GPUs here, run a scoring forward and a thinking batch."""
    import torch

    from cockpit.contract import EVAL_BATCH_SIZE, LABEL_TOKENS, SCORE_TOKENS
    from cockpit.plan.run_length import ASSUMED_LABELS
    from cockpit.profiles import load_profile
    from trainer.evaluation.eval_timing import scoring_rows
    from trainer.evaluation.scoring import score_ids
    from trainer.model import load_base

    profile, _ = load_profile(profile_name)
    model_dir, here = model_dir_of(profile)
    random_layers = None if here and layers is None else layers
    if not here and random_layers is None:
        raise SystemExit(f"{profile_name}: model.path is not here; give --layers for random weights")
    gpus = torch.cuda.device_count()
    t0 = time.perf_counter()

    def progress(done: int, total: int) -> None:
        if done == total or done % 10 == 0:
            print(f"loaded {done}/{total} decoder layers, {time.perf_counter() - t0:.0f} s", flush=True)

    model = load_base(profile, str(model_dir), spread=True, random_layers=random_layers, progress=progress)
    load_s = time.perf_counter() - t0
    facts = model.cockpit_load_facts
    loaded = [torch.cuda.max_memory_allocated(i) for i in range(gpus)]
    vocab = model.config.vocab_size

    def peaks(fn: Any) -> tuple[float, list[int]]:
        for i in range(gpus):
            torch.cuda.synchronize(i)
            torch.cuda.reset_peak_memory_stats(i)
        t = time.perf_counter()
        fn()
        for i in range(gpus):
            torch.cuda.synchronize(i)
        return time.perf_counter() - t, [torch.cuda.max_memory_allocated(i) for i in range(gpus)]

    g = torch.Generator().manual_seed(0)
    width = min(profile.training.seq_len, SCORE_TOKENS)
    prefixes, tails = scoring_rows(vocab, width - ASSUMED_LABELS * LABEL_TOKENS, ASSUMED_LABELS)
    score_ids(model, prefixes[:1], tails[:1], 0)  # warm-up: kernels, caches
    score_s, score_peak = peaks(lambda: score_ids(model, prefixes, tails, 0))
    think_tokens = profile.eval.max_think_tokens
    prompts = torch.randint(1, vocab, (EVAL_BATCH_SIZE, prompt_tokens), generator=g).to(model.device)

    def think() -> None:
        with torch.no_grad():
            model.generate(
                input_ids=prompts,
                attention_mask=torch.ones_like(prompts),
                max_new_tokens=think_tokens,
                min_new_tokens=think_tokens,
                do_sample=False,
                pad_token_id=0,
            )

    think_s, think_peak = peaks(think)
    return {
        "profile": profile_name,
        "gpus": gpus,
        "device": torch.cuda.get_device_name(0),
        "weights": "checkpoint" if random_layers is None else f"random, {random_layers} layers",
        "load_s": round(load_s, 1),
        "placement": facts.get("placement"),
        "layer_devices": facts.get("layer_devices"),
        "load_peak_bytes": loaded,
        "score": {
            "tokens": len(prefixes) * width,
            "seconds": round(score_s, 3),
            "peak_bytes": score_peak,
            "tokens_per_s": round(len(prefixes) * width / score_s, 1),
        },
        "think": {
            "batch": EVAL_BATCH_SIZE,
            "prompt_tokens": prompt_tokens,
            "new_tokens": think_tokens,
            "seconds": round(think_s, 2),
            "peak_bytes": think_peak,
            "tokens_per_s": round(EVAL_BATCH_SIZE * think_tokens / think_s, 1),
        },
    }


def render_run(result: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    placement = result["placement"] or {}
    console.print(
        f"{result['profile']} on {result['gpus']} x {result['device']}, weights {result['weights']}: load "
        f"{result['load_s']} s; scoring forward {result['score']['tokens']} tokens in "
        f"{result['score']['seconds']} s ({result['score']['tokens_per_s']:,} tokens/s); thinking "
        f"{result['think']['batch']} x ({result['think']['prompt_tokens']} + {result['think']['new_tokens']})"
        f" tokens in {result['think']['seconds']} s ({result['think']['tokens_per_s']:,} new tokens/s)"
    )
    table = Table(title="planned against measured, GiB a GPU")
    for col in ("GPU", "layers", "planned weights", "planned total", "load peak", "scoring peak",
                "thinking peak"):  # fmt: skip
        table.add_column(col, justify="right")
    for i in range(result["gpus"]):
        key = str(i)
        table.add_row(
            f"cuda:{i}",
            str((placement.get("layers_per_device") or {}).get(key, "all" if result["gpus"] == 1 else "-")),
            _gib(placement["weights_per_device"][key]) if placement else "-",
            _gib(placement["bytes_per_device"][key]) if placement else "-",
            _gib(result["load_peak_bytes"][i]),
            _gib(result["score"]["peak_bytes"][i]),
            _gib(result["think"]["peak_bytes"][i]),
        )
    console.print(table)
    if not placement:
        console.print("one GPU: nothing placed (the one-GPU baseline)")


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", default=STORY, help=f"a profile name or file (default: {STORY})")
    parser.add_argument("--gpus", type=int, nargs="+", default=[2, 4], help="GPU counts (default: 2 4)")
    parser.add_argument("--gpu-mem-gib", type=float, default=H200_GIB, help="memory of each GPU, GiB")
    parser.add_argument("--run", action="store_true", help="load and run an evaluation on the GPUs here")
    parser.add_argument("--layers", type=int, help="--run: random weights, the config sliced to N layers")
    parser.add_argument("--prompt-tokens", type=int, default=512, help="--run: tokens of each prompt")
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.gpus) or args.gpu_mem_gib <= 0:
        print("eval_placement: --gpus and --gpu-mem-gib must be positive", file=sys.stderr)
        return 2
    console = Console(record=True, width=120)
    out = Path(os.environ.get("OUT") or ROOT / "benchmarks/results")
    if args.run:
        import torch

        if not torch.cuda.is_available():
            print("eval_placement --run: no GPU here; the placement alone needs none (leave out --run)")
            return 2
        result = run_on_gpus(args.profile, args.layers, args.prompt_tokens)
        render_run(result, console)
        name = "eval_placement_run"
    else:
        result = compare(args.profile, args.gpus, args.gpu_mem_gib)
        render_comparison(result, console)
        name = "eval_placement"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text("```\n" + console.export_text() + "```\n")
    (out / f"{name}.json").write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
