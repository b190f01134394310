"""Benchmark: the plan's GPU training peak against the rehearsal records of the story profile as shipped.

`benchmarks/fit_memory.py` fits the planner's `WORKING_LAYERS_FAST` on step_speed rows of 4,096 and 8,192
tokens measured before FlashAttention-4 and the kept dequantized experts. This sets the plan beside what
the shipped profile (8 rows of 4,096 tokens, one micro-batch, FlashAttention-4, the kept experts) measured
at 4, 8 and 16 layers on one H100, with parameter offload and without (`benchmarks/results/forecast/records`,
`RECORDS`): each depth planned on its sliced geometry for that GPU (`cockpit.plan.estimate`), the error,
and the working-layer factor under which the plan would equal the measurement (what a layer's recompute
and backward hold, in units of what autograd saves for it). No GPU needed.

    python benchmarks/plan_memory_records.py

Writes plan_memory_records.md and .json under $OUT (else benchmarks/results/).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# configuration -> (its records, its profile overrides); measured on one H100 (rehearsal_h100_fa4*.md)
NONE = ["deepspeed.offload_param=none", "deepspeed.offload_optimizer=none"]
MB4 = ["training.micro_batch_size=4", "training.grad_accum=2"]
RECORDS = {
    "offload": (["offload_4-16_fa4"], []),
    "none": (["none_4-16_fa4"], NONE),
    "offload, 4 rows x 2": (["offload_4-16_mb4_fa4"], MB4),
    "none, 4 rows x 2": (["none_4-16_mb4_fa4"], NONE + MB4),
}
GPU = ("NVIDIA H100", 79.6)  # the GPU the records ran on, and its memory in GiB
GiB = 1024**3


def planned(overrides: list[str], layers: int) -> tuple[float, float, float]:
    """(the plan's training peak, its recompute + backward term, what autograd saves a layer), GiB."""
    from benchmarks.forecast_consistency import STORY
    from cockpit.plan.estimator import estimate
    from cockpit.plan.hardware import Hardware
    from cockpit.plan.inputs import inputs_for, resolve_geometry, setup_for
    from cockpit.profiles import load_profile

    profile, _ = load_profile(STORY, overrides)
    inputs = inputs_for(profile, resolve_geometry(profile).with_layers(layers))
    hw = Hardware(gpus=1, gpu_name=GPU[0], gpu_mem_gib=GPU[1], host_ram_gib=128)
    e = estimate(inputs, setup_for(profile, hw))
    saved = inputs.activations(e.setup).layer_saved
    return e.train.gpu_peak / GiB, e.train.gpu["layer recompute + backward"] / GiB, saved / GiB


def rows() -> list[dict[str, Any]]:
    from benchmarks.forecast_consistency import measures_of
    from cockpit.plan.activations import WORKING_LAYERS_FAST

    out = []
    for config, (records, overrides) in RECORDS.items():
        for layers, m in sorted(measures_of(records).items()):
            measured = max(m.gpu_train_gib.values())
            plan, working, saved = planned(overrides, layers)
            # the factor under which plan == measured: the working term moves by (factor - now) x saved
            needed = WORKING_LAYERS_FAST + (measured - plan) / saved
            out.append(
                {
                    "config": config,
                    "layers": layers,
                    "measured_gib": round(measured, 2),
                    "planned_gib": round(plan, 2),
                    "over_gib": round(plan - measured, 2),
                    "error": round(plan / measured - 1, 4),
                    "working_gib": round(working, 2),
                    "layer_saved_gib": round(saved, 2),
                    "working_layers_needed": round(needed, 3),
                }
            )
    return out


def slopes(lines: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """GiB a further layer, measured and planned, per configuration (first to last depth)."""
    out = {}
    for config in RECORDS:
        xs = [x for x in lines if x["config"] == config]
        if len(xs) >= 2:
            a, b = xs[0], xs[-1]
            span = b["layers"] - a["layers"]
            out[config] = {
                "measured": round((b["measured_gib"] - a["measured_gib"]) / span, 3),
                "planned": round((b["planned_gib"] - a["planned_gib"]) / span, 3),
            }
    return out


def report(lines: list[dict[str, Any]], constant: float) -> str:
    over = [x["over_gib"] for x in lines]
    text = [
        "# The plan's GPU training peak against the story profile's rehearsal records",
        "",
        f"One {GPU[0]}; the story profile as shipped (8 x 4,096 tokens a micro-batch, FlashAttention-4, the "
        "kept experts), records in benchmarks/results/forecast/records. Measured: the rehearsal's training "
        "peak (`torch.cuda.max_memory_allocated`); planned: `cockpit.plan.estimate` on the sliced geometry "
        f"for that GPU. `WORKING_LAYERS_FAST` is {constant:.2f} (fitted at 4,096 and 8,192 tokens before "
        "FlashAttention-4); 'needed' is the factor under which the plan would equal the measurement.",
        "",
        "| configuration | layers | measured GiB | planned GiB | plan over by GiB | error "
        "| recompute + backward term GiB | a layer's saved GiB | factor needed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    text += [
        f"| {x['config']} | {x['layers']} | {x['measured_gib']:.2f} | {x['planned_gib']:.2f} | "
        f"{x['over_gib']:+.2f} | {x['error']:+.1%} | {x['working_gib']:.2f} | {x['layer_saved_gib']:.2f} | "
        f"{x['working_layers_needed']:.3f} |"
        for x in lines
    ]
    text += [""]
    for config, s in slopes(lines).items():
        text.append(
            f"- {config}: a further layer {s['measured']:.3f} GiB measured, {s['planned']:.3f} planned"
        )
    if over:
        text.append(
            f"- the plan is over by {min(over):.1f} to {max(over):.1f} GiB "
            f"(mean {statistics.fmean(over):.1f}) at every depth: the working term, not the per-layer terms"
        )
    return "\n".join(text) + "\n"


def main() -> int:
    from cockpit.plan.activations import WORKING_LAYERS_FAST

    lines = rows()
    text = report(lines, WORKING_LAYERS_FAST)
    print(text)
    out = Path(os.environ.get("OUT") or ROOT / "benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan_memory_records.md").write_text(text)
    payload = {"working_layers_fast": WORKING_LAYERS_FAST, "rows": lines, "slopes": slopes(lines)}
    (out / "plan_memory_records.json").write_text(json.dumps(payload, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
