"""Evaluation's speed on the story's slices, and how well a rehearsal predicts it out of sample (GPU).

`cockpit rehearse --eval-only` of the profile (the story's by default) at three depths (2, 8 and 16
layers): each depth loads its slice of random weights as evaluation loads it and times, after a warm-up
of each shape, a scoring forward and thinking batches (`EVAL_BATCH_SIZE` prompts and one alone, for 3
and `--eval-tokens` new tokens: a decode step as the difference, and the rest of a call), through
evaluation's own functions (`trainer.evaluation.eval_timing`). No training steps.

Then each figure's line over the two shallower depths (`cockpit.rehearse.evaluation.fit_eval`) is read
at the deepest and set beside what it measured; and so is the whole evaluation of the held-out split on
that slice (`cockpit.plan.eval_time.eval_seconds`: both systems, every batch's prefill and thinking, the
scoring forwards) - the goal: within 10%. Beside the decode step a layer: the memory limit of the bytes
it reads (`cockpit.plan.eval_time.decode_bytes` at the GPU's HBM bandwidth). Last, the rehearsal's
forecast of the whole model's evaluation on the profile's machine, and serving priced from it.

    python benchmarks/eval_speed.py --out $OUT                     # one H200: the story, 2, 8, 16 layers
    python benchmarks/eval_speed.py --tiny --out /tmp/eval-speed   # its smoke test on the CPU: 1, 2, 4

Writes eval_speed_<gpu>.md and .json under --out (default benchmarks/results/), and the rehearsal's
record (its run.json and events) in eval_speed_<gpu>_record/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STORY = "qwen3-235b-a22b-thinking-4xh100"
GOAL = 0.10  # the deepest slice's evaluation predicted from the shallower ones, within this
FIGURES = (
    ("prefill_s", "prefill, batch", 1.0),
    ("decode_step_s", "decode step, batch (ms)", 1000.0),
    ("score_s", "scoring forward", 1.0),
    ("single_prefill_s", "prefill, one prompt", 1.0),
    ("single_decode_step_s", "decode step, one prompt (ms)", 1000.0),
    ("large_prefill_s", "prefill, the largest batch", 1.0),
    ("large_decode_step_s", "decode step, the largest batch (ms)", 1000.0),
)


def rehearse(profile: str, overrides: list[str], depths: list[int], tokens: int, gpus: int | None,
             runs: Path, timeout_s: float) -> Path:  # fmt: skip
    """`cockpit rehearse --eval-only` through the service, waited for (stopped past `timeout_s`)."""
    from cockpit.record import load_manifest
    from cockpit.service import lifecycle

    launch = lifecycle.start_rehearsal(
        runs, profile, overrides, depths, 0, gpus, sys.argv, eval_tokens=tokens
    )
    deadline = time.time() + timeout_s
    while load_manifest(launch.run_dir).get("status") in ("planned", "running"):
        if time.time() > deadline:
            lifecycle.stop(launch.run_dir, kill=True)
            break
        time.sleep(2.0)
    return launch.run_dir


def memory_limit_per_layer(profile: Any, batch: int, context: float, gpu: str) -> float | None:
    """Seconds a decode step's bytes of one decoder layer take at the GPU's HBM bandwidth (None: unknown)."""
    from cockpit.plan.eval_time import decode_bytes, hbm_gbps
    from cockpit.plan.inputs import inputs_for, resolve_geometry

    bandwidth = hbm_gbps(gpu)
    if not bandwidth:
        return None
    g = resolve_geometry(profile)
    one, two = (inputs_for(profile, g.with_layers(n)).weights for n in (1, 2))
    return (decode_bytes(two, batch, context) - decode_bytes(one, batch, context)) / (bandwidth * 1e9)


def analyse(run_dir: Path, profile: Any) -> dict[str, Any]:
    """Each figure measured per depth, the deepest predicted from the others, the slice's evaluation."""
    from cockpit.plan.eval_time import EvalCosts, EvalShape, eval_seconds, eval_split
    from cockpit.record import read_events
    from cockpit.rehearse.evaluation import fit_eval
    from cockpit.rehearse.measure import depth_measures
    from cockpit.rehearse.run import forecast_run

    timed = [m for m in depth_measures(read_events(run_dir)) if m.eval.get("decode_step_s") is not None]
    result: dict[str, Any] = {"run_dir": str(run_dir), "depths": [m.layers for m in timed]}
    result["timings"] = {str(m.layers): m.eval for m in timed}  # story_forecast.py reads them
    if len(timed) < 3:
        result["error"] = f"{len(timed)} depth(s) timed evaluation: three are needed ({run_dir}/output.log)"
        return result
    *fitted, deep = sorted(timed, key=lambda m: m.layers)
    fits, every = fit_eval(fitted), fit_eval(timed)
    first = deep.eval
    device = str(first.get("device") or "")
    rows = []
    for key, name, unit in FIGURES:
        predicted = fits[key].at(deep.layers) if fits[key] else None
        measured = deep.eval.get(key)
        line = every[key]
        rows.append({
            "figure": key, "name": name, "unit": unit,
            "by_depth": {m.layers: m.eval.get(key) for m in timed},
            "predicted": predicted, "measured": measured,
            "error": (predicted - measured) / measured if predicted is not None and measured else None,
            "fixed": line.fixed if line else None, "per_layer": line.per_layer if line else None,
        })  # fmt: skip
    split = eval_split(profile)
    shape = EvalShape(split, float(first.get("prompt_tokens") or 0), profile.eval.max_think_tokens)
    costs = {
        "predicted": EvalCosts(*(fits[k].at(deep.layers) for k in ("prefill_s", "decode_step_s", "score_s"))),
        "measured": EvalCosts(*(float(deep.eval[k]) for k in ("prefill_s", "decode_step_s", "score_s"))),
    }
    slice_s = {k: eval_seconds(shape, c) for k, c in costs.items()}
    context = shape.prompt_tokens + shape.think_tokens / 2
    forecast = forecast_run(run_dir).to_dict()
    result.update(
        device=device,
        gpus=first.get("gpus"),
        shape={
            "batch": shape.batch,
            "prompt_tokens": shape.prompt_tokens,
            "think_tokens": shape.think_tokens,
            "timed_new_tokens": first.get("new_tokens"),
            "large_batch": first.get("large_batch"),
            "large_new_tokens": first.get("large_new_tokens"),
            "score_labels": first.get("score_labels"),
            "examples": split.examples,
            "labels": split.labels,
            "examples_how": split.how,
        },
        fitted=[m.layers for m in fitted],
        checked=deep.layers,
        rows=rows,
        slice_eval_s=slice_s,
        slice_error=(slice_s["predicted"] - slice_s["measured"]) / slice_s["measured"],
        goal=GOAL,
        memory_limit_per_layer_s={
            "batch": memory_limit_per_layer(profile, shape.batch, context, device),
            "single": memory_limit_per_layer(profile, 1, context, device),
            "large": memory_limit_per_layer(profile, int(first.get("large_batch") or 0), context, device)
            if first.get("large_batch")
            else None,
        },
        forecast={k: forecast.get(k) for k in ("summary", "evaluation", "serving", "assumptions")},
    )
    return result


def render(result: dict[str, Any]) -> str:
    """The result as Markdown."""
    if "error" in result:
        return f"# Evaluation's speed\n\n{result['error']}\n"
    deep, fitted = result["checked"], result["fitted"]
    s = result["shape"]
    depths = result["depths"]
    lines = [
        f"# Evaluation's speed on {result['device']} ({result['gpus']} GPU(s)), depths "
        f"{', '.join(map(str, depths))}",
        "",
        f"Random weights, loaded as evaluation loads them; a thinking batch of {s['batch']} prompts of "
        f"{s['prompt_tokens']:.0f} tokens (and of one"
        + (f", and of {s['large_batch']}" if s.get("large_batch") else "")
        + "), timed for 3 and "
        f"{s['timed_new_tokens']} new "
        + (f"tokens ({s['large_new_tokens']} at the largest); " if s.get("large_new_tokens") else "tokens; ")
        + f"a scoring forward of rows of prompt + {s['think_tokens']} thinking tokens + "
        + (f"{s['score_labels']} labels behind them" if s.get("score_labels") else "a label")
        + ". Each after a "
        f"warm-up of its shape. The {deep}-layer figures predicted from the line through "
        f"{' and '.join(map(str, fitted))} layers.",
        "",
        "| figure | " + " | ".join(f"{d} layers" for d in depths) + f" | {deep}: predicted | error | "
        "a layer (all depths) | fixed |",
        "|---|" + "---|" * len(depths) + "---|---|---|---|",
    ]  # fmt: skip
    for r in result["rows"]:
        u = r["unit"]

        def fig(v: Any, u: float = u) -> str:
            return "-" if v is None else f"{v * u:.4g}"

        err = "-" if r["error"] is None else f"{r['error']:+.1%}"
        lines.append(
            f"| {r['name']} | " + " | ".join(fig(r["by_depth"].get(d)) for d in depths)
            + f" | {fig(r['predicted'])} | {err} | {fig(r['per_layer'])} | {fig(r['fixed'])} |"
        )  # fmt: skip
    limit = result["memory_limit_per_layer_s"]
    decode = {r["figure"]: r for r in result["rows"]}
    sizes = {"batch": s["batch"], "single": 1, "large": s.get("large_batch")}
    for key, which in (
        ("decode_step_s", "batch"),
        ("single_decode_step_s", "single"),
        ("large_decode_step_s", "large"),
    ):
        if limit.get(which) and decode[key]["per_layer"]:
            per = decode[key]["per_layer"]
            lines.append(
                f"\nDecode step at batch {sizes[which]}: "
                f"{per * 1000:.3f} ms a layer against the memory limit of {limit[which] * 1000:.3f} ms (the "
                f"bytes it reads at the GPU's HBM bandwidth): {per / limit[which]:.1f}x."
            )
    ev = result["slice_eval_s"]
    verdict = "within" if abs(result["slice_error"]) <= result["goal"] else "NOT within"
    lines += [
        "",
        f"**The {deep}-layer slice's evaluation** of the held-out split ({s['examples']:.0f} examples, both "
        f"systems): predicted {ev['predicted']:.1f} s from {' and '.join(map(str, fitted))} layers, measured "
        f"{ev['measured']:.1f} s: {result['slice_error']:+.1%}, {verdict} the goal of {result['goal']:.0%}.",
        "",
        f"Forecast of the whole model: {result['forecast']['summary']}",
    ]
    evaluation = result["forecast"].get("evaluation") or {}
    if evaluation.get("how"):
        lines.append(f"\n{evaluation['how']}")
    from cockpit.rehearse.serving import serving_lines

    lines += [f"\n{line}" for line in serving_lines(result["forecast"].get("serving"))]
    lines += ["", "Assumptions:", *(f"- {a}" for a in result["forecast"].get("assumptions") or [])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", default=STORY, help=f"a profile name or file (default {STORY})")
    parser.add_argument("--tiny", action="store_true", help="the CPU smoke test: tiny-cpu at 1, 2, 4 layers")
    parser.add_argument("--layers", help="three depths or more, the deepest checked (default 2,8,16)")
    parser.add_argument("--eval-tokens", type=int, default=32, help="new tokens of each timed thinking call")
    parser.add_argument("--gpus", type=int, help="GPUs to rehearse on (default: one, or none on the CPU)")
    parser.add_argument("--set", action="append", default=[], dest="overrides", help="a profile override")
    parser.add_argument("--runs-dir", type=Path, default=Path("/tmp/eval-speed-runs"))
    parser.add_argument("--timeout-s", type=float, default=540.0, help="the rehearsal's limit")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    args = parser.parse_args(argv)
    from cockpit.hostinfo import gpu_inventory
    from cockpit.profiles import load_profile

    profile_name = "tiny-cpu" if args.tiny else args.profile
    depths = [int(d) for d in (args.layers or ("1,2,4" if args.tiny else "2,8,16")).split(",")]
    if len(depths) < 3:
        print(
            "eval_speed: --layers needs three depths or more (two to fit, the deepest to check)",
            file=sys.stderr,
        )
        return 2
    gpus = args.gpus if args.gpus is not None else (1 if gpu_inventory() else 0)
    tokens = 8 if args.tiny and args.eval_tokens == 32 else args.eval_tokens
    run_dir = rehearse(profile_name, args.overrides, depths, tokens, gpus, args.runs_dir, args.timeout_s)
    profile, _ = load_profile(profile_name, args.overrides)
    result = analyse(run_dir, profile)
    text = render(result)
    print(text)
    from benchmarks.cards import card_tag

    name = card_tag(result.get("device"))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"eval_speed_{name}.md").write_text(text)
    (args.out / f"eval_speed_{name}.json").write_text(json.dumps(result, indent=1, default=str))
    keep = args.out / f"eval_speed_{name}_record"  # the rehearsal's record without its log, to keep
    (keep / "events").mkdir(parents=True, exist_ok=True)
    for path in [run_dir / "run.json", *sorted((run_dir / "events").glob("*.jsonl"))]:
        if path.is_file():
            (keep / path.relative_to(run_dir)).write_bytes(path.read_bytes())
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
