"""The planner's GPU training peak against measured peaks, fitted on the code as it runs now, and checked.

One constant is fitted: `cockpit.plan.activations.WORKING_LAYERS_FAST`, what a layer's recompute and
backward hold in units of what autograd saves for it, on the trainer's fast paths (chunked loss, fused NF4
expert GEMMs with the kept dequantized experts, varlen attention by FlashAttention-4 on Hopper). It is
fitted as the largest factor that any in-sample measurement needs, rounded up, so that the plan bounds the
peak rather than splits the difference.

In sample (`RECORDS`): the story profile's rehearsals on one H100 with FlashAttention-4 and the kept experts,
at 4, 8 and 16 layers, with parameter + optimizer offload and without, at 8 rows x 4,096 tokens a
micro-batch (as shipped) and at 4 rows with accumulation 2: two token counts, so a per-token term and a
fixed one are told apart. The records' peaks are `torch.cuda.max_memory_allocated` over the training
steps; each depth is planned with the profile it ran (`run.json`) on its sliced geometry.

Out of sample, the same code (`CURRENT`): `benchmarks/step_speed.py` rows on one H100 in the same session:
1 and 2 layers, 1,024, 4,096 and 8,192 tokens, offload at 4 and 8 layers.
Shown apart, earlier code (`EARLIER`): the H200 rows of `step_speed` measured before FlashAttention-4,
planned as the varlen path of before, whose bound they gave (`WORKING_LAYERS_VARLEN`: what the planner
keeps for GPUs FlashAttention-4 does not run on).

    python benchmarks/fit_memory.py     # prints the tables and the constant for cockpit/plan/activations.py

Writes plan_memory_fit.md and .json under $OUT (else benchmarks/results/). No GPU needed.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RECORDS = ROOT / "benchmarks/results/forecast/records"
IN_SAMPLE = ("offload_4-16_fa4", "none_4-16_fa4", "offload_4-16_mb4_fa4", "none_4-16_mb4_fa4")
CURRENT = ROOT / "benchmarks/results/step_speed_h100_refit.json"
EARLIER = ROOT / "benchmarks/results/step_speed_h200.json"
GPUS = {"H100": ("NVIDIA H100", 79.6), "H200": ("NVIDIA H200", 139.8)}
GiB = 1024**3


def slice_inputs(profile: Any, layers: int, gpu: str) -> tuple[Any, Any]:
    """The planner's inputs and setup for `profile` sliced to `layers` on one `gpu` (GPUS)."""
    from cockpit.plan.hardware import Hardware
    from cockpit.plan.inputs import inputs_for, resolve_geometry, setup_for

    name, mem = GPUS[gpu]
    inputs = inputs_for(profile, resolve_geometry(profile).with_layers(layers))
    return inputs, setup_for(profile, Hardware(gpus=1, gpu_name=name, gpu_mem_gib=mem, host_ram_gib=128))


def _estimate(
    profile: Any, layers: int, gpu: str, keep_dequant: bool | None = None, flash4: bool = True
) -> tuple[Any, Any]:
    """The plan of `profile` sliced to `layers` on one `gpu` (GPUS), and its inputs; `flash4` false: as
    the varlen attention of before FlashAttention-4 ran."""
    from dataclasses import replace

    from cockpit.plan.estimator import estimate

    inputs, setup = slice_inputs(profile, layers, gpu)
    setup = replace(setup, flash4=setup.flash4 and flash4)
    if keep_dequant is not None:
        setup = replace(setup, keep_dequant=keep_dequant)
    return estimate(inputs, setup), inputs


def _needed(e: Any, inputs: Any, measured_gib: float) -> float:
    """The working-layer factor under which this plan equals the measured peak."""
    rest = sum(e.train.gpu.values()) - e.train.gpu["layer recompute + backward"]
    working = measured_gib * GiB - rest - (e.train.gpu["layer recompute + backward"] - _working(e, inputs))
    return working / inputs.activations(e.setup).layer_saved


def _working(e: Any, inputs: Any) -> int:
    """The part of the plan's recompute + backward term that WORKING_LAYERS_FAST scales."""
    return inputs.activations(e.setup).working(e.setup.grad_ckpt)


def record_profile(record: str) -> Any:
    """The profile a rehearsal record ran, rebuilt from the story profile and the fields that vary."""
    from benchmarks.forecast_consistency import STORY
    from cockpit.profiles import load_profile

    ran = json.loads((RECORDS / record / "run.json").read_text())["profile"]
    t, ds = ran["training"], ran["deepspeed"]
    overrides = [
        f"training.micro_batch_size={t['micro_batch_size']}",
        f"training.grad_accum={t['grad_accum']}",
        f"deepspeed.offload_param={ds['offload_param']}",
        f"deepspeed.offload_optimizer={ds['offload_optimizer']}",
    ]
    return load_profile(STORY, overrides)[0]


def record_lines() -> list[dict[str, Any]]:
    """One line per in-sample record and depth: measured and planned peak, and the factor it needs."""
    from benchmarks.forecast_consistency import measures_of

    out = []
    for record in IN_SAMPLE:
        profile = record_profile(record)
        t, ds = profile.training, profile.deepspeed
        for layers, m in sorted(measures_of([record]).items()):
            measured = max(m.gpu_train_gib.values())
            e, inputs = _estimate(profile, layers, "H100")
            plan = e.train.gpu_peak / GiB
            out.append(
                {
                    "line": f"{record} at {layers}",
                    "record": record,
                    "layers": layers,
                    "tokens": t.seq_len * t.micro_batch_size,
                    "accum": t.grad_accum,
                    "offload": ds.offload_param != "none",
                    "measured_gib": round(measured, 3),
                    "planned_gib": round(plan, 3),
                    "error": round(plan / measured - 1, 4),
                    "needed": round(_needed(e, inputs, measured), 4),
                }
            )
    return out


def fit(lines: list[dict[str, Any]]) -> float:
    """WORKING_LAYERS_FAST: the largest factor an in-sample line needs, to two decimals, rounded up."""
    return math.ceil(max(x["needed"] for x in lines) * 100 - 1e-9) / 100


def step_lines(data: dict[str, Any], gpu: str, flash4: bool = True) -> list[dict[str, Any]]:
    """One line per measured step_speed row (rows gathering expert blocks as their own ZeRO-3 leaves, a
    lever dropped, left out): its configuration, the measured and planned peak (`flash4`: planned with
    FlashAttention-4 where the GPU runs it)."""
    from benchmarks.step_speed import EARLIER_OFFLOAD, EMB_HOST, MOE_LEAF, STORY_PROFILE, gpu_rows
    from cockpit.profiles import load_profile

    results = {r["name"]: r["result"] for r in data["rows"] if r.get("result")}
    out = []
    for row in gpu_rows():
        got = results.get(row.name, {})
        if not got.get("cuda_peak_gib") or set(MOE_LEAF) & set(row.extra):
            continue
        overrides = row.overrides(gpu=True) + (list(EMB_HOST) if row.name in EARLIER_OFFLOAD else [])
        profile, _ = load_profile(STORY_PROFILE, overrides)
        e, _ = _estimate(profile, row.layers, gpu, got.get("keep_dequant", False), flash4)
        plan = e.train.gpu_peak / GiB
        out.append(
            {
                "row": row.name,
                "layers": row.layers,
                "tokens": row.seq * row.mb,
                "accum": row.ga,
                "offload": row.offload,
                "checkpointing": e.setup.grad_ckpt,
                "paths": "fast" if e.setup.fast_paths else "unfused",
                "measured_gib": round(got["cuda_peak_gib"], 3),
                "planned_gib": round(plan, 3),
                "error": round(plan / got["cuda_peak_gib"] - 1, 4),
            }
        )
    return out


def _collapsed(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of one configuration and one measured peak on one line, their names joined."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for x in lines:
        key = tuple(v for k, v in x.items() if k != "row")
        if key in merged:
            merged[key]["row"] += f", {x['row']}"
        else:
            merged[key] = dict(x)
    return list(merged.values())


def _mode(line: dict[str, Any]) -> str:
    return "param+opt" if line["offload"] else "none"


def _peaks(line: dict[str, Any]) -> str:
    return f"{line['measured_gib']:.2f} | {line['planned_gib']:.2f} | {line['error']:+.1%}"


def summary(name: str, lines: list[dict[str, Any]]) -> str:
    """The error range of a group of lines, how many within 15% and how many under the measurement."""
    errs = [x["error"] for x in lines]
    within = sum(abs(e) <= 0.15 for e in errs)
    under = sum(e < -0.0005 for e in errs)
    return (
        f"- {name}: {len(lines)} lines, error {min(errs):+.1%} to {max(errs):+.1%}; {within} within 15%; "
        f"{under} under the measurement"
    )


def report(
    constant: float, fitted: float, records: list[dict[str, Any]], current: list, earlier: list
) -> str:
    from cockpit.contract import GATHERED_BEYOND_PREFETCH, GATHERED_BEYOND_PREFETCH_ONE

    out = [
        "# The planner's GPU training peak against measured (story geometry)",
        "",
        f"`WORKING_LAYERS_FAST` fitted on the in-sample records: {fitted:.2f} (cockpit/plan/activations.py "
        f"has {constant:.2f}); layers held gathered beyond the prefetch window on one rank with the "
        f"overlapped fetch (cockpit/contract.py): {GATHERED_BEYOND_PREFETCH_ONE}, with accumulation "
        f"{GATHERED_BEYOND_PREFETCH}. "
        "Measured: `torch.cuda.max_memory_allocated` over the training steps; planned: "
        "`cockpit.plan.estimate` for the profile and overrides each ran with, on the sliced geometry, "
        "one GPU.",
        "",
        "## In sample: the story profile's rehearsals on one H100 (FlashAttention-4, the kept experts)",
        "",
        "| record | layers | tokens x accum | offload | measured GiB | planned GiB | error | factor needed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    out += [
        f"| {x['record']} | {x['layers']} | {x['tokens']} x {x['accum']} | {_mode(x)} | {_peaks(x)} "
        f"| {x['needed']:.3f} |"
        for x in records
    ]
    for title, lines in (
        ("Out of sample: step_speed rows on one H100, the same code (`step_speed_h100_refit.json`)", current),
        (
            "Earlier code: step_speed rows on one H200 before FlashAttention-4 (`step_speed_h200.json`), "
            "planned as the varlen path of before (`WORKING_LAYERS_VARLEN`)",
            earlier,
        ),
    ):
        out += [
            "",
            f"## {title}",
            "",
            "| row | layers | tokens x accum | offload | checkpointing | paths | measured GiB | planned GiB "
            "| error |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        out += [
            f"| {x['row']} | {x['layers']} | {x['tokens']} x {x['accum']} | "
            f"{_mode(x)} | {'yes' if x['checkpointing'] else 'no'} | {x['paths']} | {_peaks(x)} |"
            for x in _collapsed(lines)
        ]
    fast = [x for x in earlier if x["paths"] == "fast"]
    out += [
        "",
        summary("in sample (records)", records),
        summary("out of sample, the same code", current),
        *([summary("earlier code, fast paths, planned as the varlen path of before", fast)] if fast else []),
    ]
    return "\n".join(out) + "\n"


def main() -> int:
    from cockpit.plan.activations import WORKING_LAYERS_FAST

    records = record_lines()
    fitted = fit(records)
    current = step_lines(json.loads(CURRENT.read_text()), "H100")
    earlier = step_lines(json.loads(EARLIER.read_text()), "H200", flash4=False)
    text = report(WORKING_LAYERS_FAST, fitted, records, current, earlier)
    print(text)
    out = Path(os.environ.get("OUT") or ROOT / "benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan_memory_fit.md").write_text(text)
    payload = {
        "working_layers_fast": fitted,
        "in_sample": list(IN_SAMPLE),
        "records": records,
        "current": current,
        "earlier": earlier,
    }
    (out / "plan_memory_fit.json").write_text(json.dumps(payload, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
