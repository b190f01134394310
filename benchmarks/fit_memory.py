"""The planner's GPU training peak against the speed benchmark's measured peaks, fitted and checked.

Reads `benchmarks/results/step_speed_h200.json` (`benchmarks/step_speed.py` on one H200: the story's
geometry sliced, random weights, `torch.cuda.max_memory_allocated` over the training steps) and plans
every row with the profile and overrides it ran with (`cockpit.plan.estimate` on the sliced geometry,
one H200). Offload rows measured before the overlapped fetch ran with the embeddings on the host and are
planned so.

One constant is fitted: `cockpit.plan.activations.WORKING_LAYERS_FAST`, what a layer's recompute and
backward hold in units of what autograd saves for it, on the trainer's fast paths (chunked loss, fused NF4
expert GEMMs, varlen attention). It is fitted on the IN_SAMPLE rows (no offload, 4 layers, 4,096 and
8,192 tokens a micro-batch) as the largest that any of them needs, so that the plan bounds the peak
rather than splits the difference. Every other row is out of sample: 1 and 2 layers, 1,024 tokens, two
rows a micro-batch, gradient accumulation, and every parameter-offload row (prefetch 1 to 3, 4 to 8
layers). Rows of the unfused paths (`before-*`) are planned with the unfused terms and shown apart.
Rows that gather each expert block as its own ZeRO-3 leaf (a lever measured and dropped) are left out:
the planner gathers whole layers, as the trainer does.

    python benchmarks/fit_memory.py     # prints the table and the constant for cockpit/plan/activations.py

Writes plan_memory_fit.md and .json under $OUT (else benchmarks/results/). No GPU needed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks/results/step_speed_h200.json"
IN_SAMPLE = ("after-4096", "after-8192")
GiB = 1024**3


def planned(row: Any, keep_dequant: bool = False) -> Any:
    """The plan's training phase for a step_speed row, configured as the row ran (`keep_dequant`: whether
    the trainer kept the dequant path's weights for backward then; rows measured before say nothing)."""
    from dataclasses import replace

    from benchmarks.step_speed import EARLIER_OFFLOAD, EMB_HOST, STORY_PROFILE
    from cockpit.plan.estimator import estimate
    from cockpit.plan.hardware import Hardware
    from cockpit.plan.inputs import inputs_for, resolve_geometry, setup_for
    from cockpit.profiles import load_profile

    overrides = row.overrides(gpu=True) + (list(EMB_HOST) if row.name in EARLIER_OFFLOAD else [])
    profile, _ = load_profile(STORY_PROFILE, overrides)
    inputs = inputs_for(profile, resolve_geometry(profile).with_layers(row.layers))
    hw = Hardware(gpus=1, gpu_name="NVIDIA H200", gpu_mem_gib=139.8, host_ram_gib=128)
    return estimate(inputs, replace(setup_for(profile, hw), keep_dequant=keep_dequant)), inputs, profile


def needed_working_layers(row: Any, measured_gib: float, keep_dequant: bool) -> float:
    """The working-layer factor under which this row's plan equals its measured peak."""
    e, inputs, _ = planned(row, keep_dequant)
    acts = inputs.activations(e.setup)
    rest = sum(e.train.gpu.values()) - e.train.gpu["layer recompute + backward"]
    return (measured_gib * GiB - rest) / acts.layer_saved


def measured_rows(data: dict[str, Any]) -> list[tuple[Any, float, bool]]:
    """(row definition, measured training peak in GiB, whether the trainer kept the dequant path's weights
    for backward) for every row that ran and has a peak."""
    from benchmarks.step_speed import MOE_LEAF, gpu_rows

    results = {r["name"]: r["result"] for r in data["rows"] if r.get("result")}
    return [
        (row, results[row.name]["cuda_peak_gib"], results[row.name].get("keep_dequant", False))
        for row in gpu_rows()
        if results.get(row.name, {}).get("cuda_peak_gib") and not set(MOE_LEAF) & set(row.extra)
    ]


def table(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One line per measured row: its configuration, the measured and planned peak, in or out of sample."""
    out = []
    for row, measured, keep in measured_rows(data):
        e, _, profile = planned(row, keep)
        plan = e.train.gpu_peak / GiB
        out.append(
            {
                "row": row.name,
                "layers": row.layers,
                "tokens": row.seq * row.mb,
                "accum": row.ga,
                "offload": row.offload,
                "prefetch": profile.deepspeed.prefetch_layers if row.offload else 0,
                "embeddings": "gpu" if e.setup.keeps_embeddings or not row.offload else "host",
                "paths": "fast" if e.setup.fast_paths else "unfused",
                "sample": "in" if row.name in IN_SAMPLE else "out",
                "measured_gib": round(measured, 3),
                "planned_gib": round(plan, 3),
                "error": round(plan / measured - 1, 4),
            }
        )
    return out


def fit(data: dict[str, Any]) -> float:
    """WORKING_LAYERS_FAST: the largest factor an in-sample row needs, to two decimals, rounded up."""
    import math

    needs = [
        needed_working_layers(*measured) for measured in measured_rows(data) if measured[0].name in IN_SAMPLE
    ]
    return math.ceil(max(needs) * 100) / 100


def report(constant: float, fitted: float, lines: list[dict[str, Any]]) -> str:
    out = [
        "# The planner's GPU training peak against measured (story geometry, one H200)",
        "",
        f"`WORKING_LAYERS_FAST` fitted on {', '.join(IN_SAMPLE)}: {fitted:.2f} "
        f"(cockpit/plan/activations.py has {constant:.2f}). Measured: `torch.cuda.max_memory_allocated` over "
        "the training steps of each step_speed row; planned: `cockpit.plan.estimate` for the row's profile "
        "and overrides on the sliced geometry.",
        "",
        "| row | layers | tokens x accum | offload (prefetch, embeddings) | paths | sample | measured GiB "
        "| planned GiB | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for x in collapsed(lines):
        off = f"param+opt ({x['prefetch']:g}, {x['embeddings']})" if x["offload"] else "none"
        out.append(
            f"| {x['row']} | {x['layers']} | {x['tokens']} x {x['accum']} | {off} | {x['paths']} | "
            f"{x['sample']} | {x['measured_gib']:.2f} | {x['planned_gib']:.2f} | {x['error']:+.1%} |"
        )
    out += ["", *summary(lines)]
    return "\n".join(out) + "\n"


def collapsed(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of one configuration and one measured peak on one line, their names joined (many step_speed
    rows differ only in what they time, not in what they hold)."""
    keys = ("layers", "tokens", "accum", "offload", "prefetch", "embeddings", "paths", "sample")
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for x in lines:
        key = (*(x[k] for k in keys), round(x["measured_gib"], 2), round(x["planned_gib"], 2))
        if key in merged:
            merged[key]["row"] += f", {x['row']}"
        else:
            merged[key] = dict(x)
    return list(merged.values())


def summary(lines: list[dict[str, Any]]) -> list[str]:
    """Error ranges by group: in sample, out of sample without and with offload, unfused paths."""
    groups = {
        "in sample": [x for x in lines if x["sample"] == "in"],
        "out of sample, no offload": [
            x for x in lines if x["sample"] == "out" and not x["offload"] and x["paths"] == "fast"
        ],
        "out of sample, parameter offload": [
            x for x in lines if x["sample"] == "out" and x["offload"] and x["paths"] == "fast"
        ],
        "unfused paths (their own terms, not fitted here)": [x for x in lines if x["paths"] == "unfused"],
    }
    out = []
    for name, xs in groups.items():
        if not xs:
            continue
        errs = [x["error"] for x in xs]
        within = sum(abs(e) <= 0.15 for e in errs)
        under = sum(e < -0.0005 for e in errs)
        out.append(
            f"- {name}: {len(xs)} rows, error {min(errs):+.1%} to {max(errs):+.1%}; {within} within 15%; "
            f"{under} under the measurement"
        )
    return out


def main() -> int:
    from cockpit.plan.activations import WORKING_LAYERS_FAST

    data = json.loads(RESULTS.read_text())
    fitted = fit(data)
    lines = table(data)
    text = report(WORKING_LAYERS_FAST, fitted, lines)
    print(text)
    out = Path(os.environ.get("OUT") or ROOT / "benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan_memory_fit.md").write_text(text)
    payload = {"working_layers_fast": fitted, "in_sample": list(IN_SAMPLE), "rows": lines}
    (out / "plan_memory_fit.json").write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
