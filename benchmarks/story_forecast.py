"""The story's whole run predicted from depths measured on one GPU: rehearsal figures, scaled to 4 x H100.

Reads the story's rehearsal records (`benchmarks/results/forecast/records/`, `RECORDS`, made by
`benchmarks/rehearsal_accuracy.py`: the story's architecture at 4, 8 and 16 layers with parameter and
optimizer offload, the same without, random weights, one H100, the story profile as shipped: 8 packed
rows of 4096 tokens in one micro-batch a step, 3 layers prefetched with offload) and
predicts the whole 94-layer run on the story profile's own machine (4 x H100-80GB) with
`cockpit.rehearse.forecast.forecast`, every assumption printed, each figure with its range. The step
count comes from the profile's data (3,600 examples of about 2,000 tokens, one epoch, as the story ran:
an assumption, the data file is not here). Evaluation after training (the base and the tuned model on
the held-out split) is in the wall clock: timed on the story's slices where `benchmarks/eval_speed.py`
left its timings (`results/eval_speed_h100.json`, set on the depths it timed), else the plan's modelled
term, and the output says which. Beside it: what `cockpit plan` says for the same profile, and the story's
26 hours. A second run loads from the NF4 cache (each forecast's line); the two configurations together
tell the load's work apart (`load_split`): the one without offload builds and quantizes the same layers on
the same GPU, so its work bounds the quantization the cache skips, and the rest of the offloaded load's
work is placement, which a cached load pays too. No GPU needed.

    python benchmarks/story_forecast.py [--depths 1,2,4,8,16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STORY = "qwen3-235b-a22b-thinking-4xh100"
# The rehearsal records each forecast reads (results/forecast/records/; each depth from the first that has
# it). Both are the story profile as shipped (8 rows, one micro-batch a step, so without
# `forecast_consistency.RAN_AT`'s 4 x 2; FlashAttention-4 and the kept dequantized experts) at depths 4, 8
# and 16, in one call on one H100 (`rehearsal_accuracy.py --configs nf4-offload|nf4-none --depths 4,8,16
# --records DIR`). Evaluation's timings (`EVAL_TIMINGS`) ran on one H100 too, so nothing is scaled from
# one card to another: `SCALING` is the H100's to 4 x H100. The records before them (`offload_4-16_lean`,
# `none_1-16`, on an H200) ran without FlashAttention-4, with the experts dequantized again for backward.
H100_RECORDS = "the depths and evaluation's timings ran on one H100 (FlashAttention-4, the kept experts)"
RECORDS = {"offload": ["offload_4-16_fa4"], "none": ["none_4-16_fa4"]}
EVAL_TIMINGS = ROOT / "benchmarks/results/eval_speed_h100.json"
MEASURED_GPU = "NVIDIA H100 80GB HBM3"  # the card the records and the timings ran on


def with_eval_timings(measures: list, path: Path = EVAL_TIMINGS) -> tuple[list, str]:
    """The depths with evaluation's timings on the story's slices set where `eval_speed.py` timed the
    same depth (its `rehearse_eval` events), and a depth that only timed evaluation (as `cockpit rehearse
    --eval-only` records one) for each it timed that the records lack; and which: timed, or modelled (no
    timings committed)."""
    from dataclasses import replace

    from cockpit.rehearse.measure import DepthMeasure

    timings = json.loads(path.read_text()).get("timings", {}) if path.is_file() else {}
    if not timings:
        return measures, "evaluation modelled (no eval_speed_h100.json timings: the plan's term)"
    out = [replace(m, eval=timings.get(str(m.layers), {})) for m in measures]
    have = {m.layers for m in measures}
    out += [DepthMeasure(int(d), "ok", eval=t) for d, t in timings.items() if int(d) not in have and t]
    out.sort(key=lambda m: m.layers)
    timed = [m.layers for m in out if m.eval]
    return out, f"evaluation timed on the story's slices ({', '.join(map(str, timed))} layers, {path.name})"


def load_split(summary: dict) -> dict | None:
    """The offloaded load's work told apart by the load without offload (the same layers drawn, built and
    quantized on the same GPU; offload adds their placement in pinned host memory): quantization is at
    most the latter's work, placement at least the difference, so the cached load with offload lies
    between its read plus that placement and its read plus the whole work."""
    if not {"offload", "none"} <= summary.keys():
        return None
    off, none = (summary[c]["forecast"] for c in ("offload", "none"))
    cache = off.get("load_cache")
    work, quantize = off["target"].get("load_s"), none["target"].get("load_s")
    if not cache or work is None or quantize is None:
        return None
    placement = max(0.0, work - quantize)
    lo, hi = cache["read_s"] + placement, cache["read_s"] + work
    return {
        "offload_work_s": work,
        "quantize_at_most_s": quantize,
        "placement_at_least_s": placement,
        "cached_load_s": [lo, hi],
        "first_load_s": off["wall"]["load_s"],
        "words": (
            f"the load's work with offload, {work:.0f} s: building and quantizing at most "
            f"{quantize:.0f} s of it (the whole work without offload: the same layers on the same GPU), "
            f"placing the partitions in pinned memory at least {placement:.0f} s, which a cached load pays "
            f"too: a second run's load {lo:.0f}-{hi:.0f} s against the first's {off['wall']['load_s']:.0f} s"
        ),
    }


def main(argv: list[str] | None = None) -> int:
    from dataclasses import replace

    from rich.console import Console

    from benchmarks.forecast_consistency import CONFIGS, RAN_AT, measures_of, scaling, story
    from cockpit.rehearse.forecast import forecast
    from cockpit.rehearse.render import render

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--depths", default="", help="the depths to forecast from (default: every one)")
    args = parser.parse_args(argv)
    chosen = {int(d) for d in args.depths.split(",") if d}
    console = Console(record=True, width=150)
    summary = {}
    for config, (overrides, _, _) in CONFIGS.items():
        records = RECORDS[config]
        profile, plan = story([o for o in overrides if o not in RAN_AT])
        by_depth = measures_of(records)
        measures = [m for d, m in sorted(by_depth.items()) if not chosen or d in chosen]
        measures, evaluation = with_eval_timings(measures)
        result = forecast(measures, profile, plan, replace(scaling(), measured_gpu=MEASURED_GPU))
        data = result.to_dict()
        console.rule(
            f"{config}: the story profile, "
            + ("parameter + optimizer offload" if config == "offload" else "no offload")
        )
        console.print(render(data))
        plan_step = (plan.get("run") or {}).get("optimizer_step_s")  # a micro-batch's step x accumulation
        plan_total = plan_step * result.wall["steps"] if plan_step else None
        lo, hi = result.ranges["wall"]["total_s"]
        console.print(
            f"beside: the story's 26 h; cockpit plan's optimizer step {plan_step or 0:.2f} s x "
            f"{result.wall['steps']:.0f} steps = {(plan_total or 0) / 3600:.2f} h of training; "
            "the rehearsal's "
            f"whole run {result.wall['total_s'] / 3600:.2f} h ({lo / 3600:.2f}-{hi / 3600:.2f} h), "
            f"{26 * 3600 / result.wall['total_s']:.0f}x shorter than the story's; {evaluation}, "
            f"{result.wall['eval_s'] / 3600:.2f} h of it; {H100_RECORDS}"
        )
        summary[config] = {
            "depths": [m.layers for m in measures],
            "records": records,
            "forecast": data,
            "plan_step_s": plan_step,
            "plan_train_s": plan_total,
            "evaluation": evaluation,
        }
    split = load_split(summary)
    if split:
        console.print(split["words"])
        summary["load_split"] = split
    out = Path(os.environ.get("OUT") or ROOT / "benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "story_forecast.md").write_text("```\n" + console.export_text() + "```\n")
    (out / "story_forecast.json").write_text(json.dumps(summary, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
