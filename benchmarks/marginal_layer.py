"""The marginal decoder layer of the story's step, before and after the packed attention and the fused
expert activation (and, on one H100, FlashAttention-4 and the kept experts): seconds, TFLOP/s, and the
share of the datasheet and of the measured matmul rate.

Reads committed H200 results (no GPU needed):
  with offload   the story's rehearsals as shipped (parameter and optimizer offload, 3 layers prefetched),
                 depths 4, 8 and 16: `results/forecast/records/offload_1-16` (before),
                 `offload_1-16_levers` (packed attention and fused activation) and `offload_1-16_all`
                 (every lever, the fused RoPE too), each `benchmarks/rehearsal_accuracy.py --configs
                 nf4-offload --depths 1,2,4,8,16`; the slope is the least-squares line through 4, 8, 16.
                 Then one call, both micro-batches: `offload_4-16_mb4` (4 rows and 2 micro-batches a step,
                 the profile's then: today `--depths 4,8,16 --set training.micro_batch_size=4 --set
                 training.grad_accum=2`; its budget ended before depth 16) and `offload_1-16_mb8` (8 rows,
                 one micro-batch a step, the story profile since: `--depths 1,2,4,8,16`); and a fifth
                 call's `offload_1-16_mb8_val` (the same, each token's expert pairs summed in one kernel,
                 `trainer/kernels/gather_sum.py`, and validation forwards timed: as shipped)
  no offload     `results/step_speed_h200_levers.json` (`benchmarks/step_speed.py --rows levers-...`): both
                 levers off, both on, and the activation alone off, at 4 and 8 layers in one call; and
                 `results/step_speed_h200_rope.json` (`--rows rope-...`): the fused rotary embedding off
                 and on, the two levers on, in another call (the same configuration as "both on" there
                 measured 5% slower: the spread between calls; compare rows of one call); and
                 `results/step_speed_h200_lora.json`'s `lora-off` rows: every lever, as shipped (those
                 rows' lever was dropped and its rows with it; `--rows rope-on-4L,rope-on-8L` runs the
                 same configuration); and `results/step_speed_h200_combine.json` (`--rows combine-...`,
                 the fifth call): 8 rows x 1, the fused combine off and on at 4 and 8 layers; the
                 operator tables of 8 rows x 1 come from `--rows mb8-4L-prof,mb8-8L-prof`, before the
                 fused combine (`step_speed_h200_mb8_profile`) and with it (a later call,
                 `step_speed_h200_combine_profile`)
The offload rows come from four calls hours apart: their differences carry the spread between calls.
Where a further layer's device time goes: the torch.profiler summaries of the 4- and 8-layer steps
(`results/step_speed_h200_story_profile.json`, packed attention on in its first version, which also
zeroed the padding's output, the expert activation in torch's kernels, no offload), each kernel's
seconds differenced and divided by 4 (kernels grouped by the start of their name; the 30 longest of each
profile).

A layer's FLOPs a step = (FLOPs a token at 8 layers - at 4) / 4 x the step's tokens, as `step_speed.py`
counted them (`cockpit.plan.flops`, its formula printed, at the rows' measured document length and target
fraction). The datasheet rate is `cockpit.plan.inputs.datasheet_tflops` (989 TFLOP/s dense bf16 for the
H200 SXM); the measured rate is the 8192^3 bf16 matmul `step_speed.py` timed in the same call.

    python benchmarks/marginal_layer.py   # writes results/marginal_layer.{md,json}
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks/results"
MB8_PROFILES = ("mb8-4L-prof", "mb8-8L-prof")  # step_speed_h200_{mb8,combine,norm}_profile.json: 8 rows x 1
OFFLOAD_RECORDS = {
    "before": "offload_1-16",
    "attention + activation": "offload_1-16_levers",
    "every lever": "offload_1-16_all",
    "every lever, again (a fourth call)": "offload_4-16_mb4",
    "8 rows, one micro-batch a step (the fourth call)": "offload_1-16_mb8",
    "8 rows x 1, the fused combine (a fifth call)": "offload_1-16_mb8_val",
    "8 rows x 1, the head norms' kernel (a sixth call)": "offload_4-16_norm",
    "8 rows x 1, the head norms' kernel and the lean LoRA (a seventh call; as shipped)": "offload_4-16_lean",
}
# The eleventh call, one H100, the story profile as shipped (FlashAttention-4, the kept experts) at depths
# 4, 8 and 16 with offload and without (`rehearsal_accuracy.py --configs nf4-offload|nf4-none --depths
# 4,8,16 --records DIR`); the matmul rate is the one `kept_experts.py` measured on that machine first.
H100_RECORDS = {
    "offload": ("one H100: FlashAttention-4 and the kept experts (the eleventh call; as shipped)",
                "offload_4-16_fa4"),
    "no offload": ("one H100: FlashAttention-4 and the kept experts, no offload (the eleventh call)",
                   "none_4-16_fa4"),
}  # fmt: skip
H100_MATMUL = "kept_experts_h100.json"
# One call, depths 4 and 8 with offload: the two levers off (COCKPIT_NORM_KERNEL=0 COCKPIT_LEAN_LORA=0),
# then on (`rehearsal_accuracy.py --configs nf4-offload --depths 4,8`, results `rehearsal_both_{off,on}`).
OFFLOAD_AB = {
    "8 rows x 1, head norms' kernel and lean LoRA off (an eighth call)": "rehearsal_both_off_h200",
    "8 rows x 1, both on (the eighth call)": "rehearsal_both_on_h200",
}
LEAN = "the head norms' kernel and the lean LoRA (the seventh call)"
# Profiled steps without offload, 4 and 8 layers, 8 rows x 1: device time a further layer, by call.
BUSY_PROFILES = {
    "the fused combine (the fifth call)": ("step_speed_h200_combine_profile", MB8_PROFILES),
    "the head norms' kernel (the sixth call)": ("step_speed_h200_norm_profile", MB8_PROFILES),
    "the head norms' kernel, PEFT's LoRA forward (the seventh call)": (
        "step_speed_h200_lora_profile", ("lora-peft-4L-prof", "lora-peft-8L-prof")),
    LEAN: (
        "step_speed_h200_lora_profile", ("lora-lean-4L-prof", "lora-lean-8L-prof")),
    "one H100: the experts dequantized again for backward (the ninth call)": (
        "step_speed_h100_keep_profile", ("keep-off-4L-prof", "keep-off-8L-prof")),
    "one H100: the recompute's dequantized experts kept for backward (the ninth call)": (
        "step_speed_h100_keep_profile", ("keep-on-4L-prof", "keep-on-8L-prof")),
    "one H100: packed attention through torch's varlen_attn, FlashAttention-2 (the tenth call)": (
        "step_speed_h100_fa4_profile", ("fa4-off-4L-prof", "fa4-off-8L-prof")),
    "one H100: packed attention through FlashAttention-4 (the tenth call; as shipped)": (
        "step_speed_h100_fa4_profile", ("fa4-on-4L-prof", "fa4-on-8L-prof")),
}  # fmt: skip
NOW_PROFILES = ("now-4L-prof", "now-8L-prof")  # step_speed_h200_now_profile.json: every lever on
PROFILES = ("story-4096-mb4-ga2-prof", "story-4096-mb4-ga2-8L-prof")  # step_speed_h200_story_profile.json
STEP_ROWS = {  # label -> (results file, 4-layer row, 8-layer row); rows of one file ran in one call
    "before (both off)": ("step_speed_h200_levers", "levers-off-4L", "levers-off-8L"),
    "packed attention only": ("step_speed_h200_levers", "levers-act-off-4L", "levers-act-off-8L"),
    "after (both on)": ("step_speed_h200_levers", "levers-on-4L", "levers-on-8L"),
    "both on, torch RoPE (another call)": ("step_speed_h200_rope", "rope-off-4L", "rope-off-8L"),
    "both on and fused RoPE": ("step_speed_h200_rope", "rope-on-4L", "rope-on-8L"),
    "every lever, 4 rows x 2 (a third call)": ("step_speed_h200_lora", "lora-off-4L", "lora-off-8L"),
    "8 rows x 1, torch's gather and sum (the fifth call)": (
        "step_speed_h200_combine",
        "combine-off-4L",
        "combine-off-8L",
    ),
    "8 rows x 1, the fused combine (the fifth call)": (
        "step_speed_h200_combine",
        "combine-on-4L",
        "combine-on-8L",
    ),
}


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares seconds a layer through (layers, seconds) points."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def main() -> int:
    from benchmarks.forecast_consistency import measures_of
    from cockpit.plan.flops import FORMULA
    from cockpit.plan.inputs import datasheet_tflops

    speed = json.loads((RESULTS / "step_speed_h200_levers.json").read_text())
    rows = {r["name"]: r["result"] for r in speed["rows"]}
    matmul, datasheet = speed["ceilings"]["bf16_tflops"], datasheet_tflops(speed["ceilings"]["gpu"])
    four, eight = rows["levers-on-4L"], rows["levers-on-8L"]
    tokens = four["tokens_per_step"]
    layer_tflop = (eight["flops_per_token"] - four["flops_per_token"]) / 4 * tokens / 1e12
    out: dict[str, Any] = {
        "tokens_per_step": tokens, "layer_tflop": layer_tflop, "matmul_tflops": matmul,
        "datasheet_tflops": datasheet, "formula": FORMULA, "rows": [],
    }  # fmt: skip

    def add(config: str, label: str, seconds: float, depths: list[int], points: list[float],
            measured: float = matmul, gpu: list[float] | None = None) -> None:  # fmt: skip
        rate = layer_tflop / seconds
        out["rows"].append({
            "config": config, "label": label, "s": seconds, "depths": depths, "step_s": points,
            "tflops": rate, "datasheet": rate / datasheet, "matmul": rate / measured,
            "matmul_tflops": measured, "gpu_train_gib": gpu,
        })  # fmt: skip

    def add_record(config: str, label: str, record: str, measured: float = matmul) -> None:
        """A rehearsal record's slope through its depths 4, 8 and 16."""
        by_depth = measures_of([record])
        depths = [d for d in (4, 8, 16) if d in by_depth]
        points = [by_depth[d].step_s for d in depths]
        gpu = [max(by_depth[d].gpu_train_gib.values()) for d in depths]
        add(config, label, slope(list(zip(depths, points, strict=True))), depths, points, measured, gpu)

    for label, record in OFFLOAD_RECORDS.items():
        add_record("offload", label, record)
    out["h100_matmul_tflops"] = json.loads((RESULTS / H100_MATMUL).read_text())["meta"]["peak_tflops"]
    for config, (label, record) in H100_RECORDS.items():
        add_record(config, label, record, out["h100_matmul_tflops"])
    for label, name in OFFLOAD_AB.items():
        measures = json.loads((RESULTS / f"{name}.json").read_text())["nf4-offload"]["measures"]
        depths, points = [m["layers"] for m in measures], [m["step_s"] for m in measures]
        gpu = [max(m["gpu_train_gib"].values()) for m in measures]
        add("offload", label, slope(list(zip(depths, points, strict=True))), depths, points, gpu=gpu)
    for label, (name, four, eight) in STEP_ROWS.items():
        results = json.loads((RESULTS / f"{name}.json").read_text())
        by_name = {r["name"]: r["result"] for r in results["rows"]}
        points = [by_name[four]["step_s"], by_name[eight]["step_s"]]
        add(
            "no offload",
            label,
            (points[1] - points[0]) / 4,
            [4, 8],
            points,
            results["ceilings"]["bf16_tflops"],
        )
    out["layer_kernels"] = layer_kernels()
    out["layer_ops"] = layer_ops()
    out["layer_ops_mb8"] = layer_ops("step_speed_h200_mb8_profile", MB8_PROFILES)
    out["layer_ops_combine"] = layer_ops("step_speed_h200_combine_profile", MB8_PROFILES)
    out["layer_ops_lean"] = layer_ops(
        "step_speed_h200_lora_profile", ("lora-lean-4L-prof", "lora-lean-8L-prof")
    )
    out["busy"] = [
        busy_row(label, name, rows, out["datasheet_tflops"]) for label, (name, rows) in BUSY_PROFILES.items()
    ]
    text = table(out)
    print(text)
    dest = Path(os.environ.get("OUT") or RESULTS)
    (dest / "marginal_layer.md").write_text(text)
    (dest / "marginal_layer.json").write_text(json.dumps(out, indent=1))
    return 0


def busy_row(label: str, name: str, rows: tuple[str, str], datasheet: float) -> dict[str, Any]:
    """A further layer's device time by a results file's profiled 4- and 8-layer rows, with its rate: the
    layer's FLOPs (those rows' FLOPs a token differenced, times the step's tokens) over that time."""
    results = json.loads((RESULTS / f"{name}.json").read_text())
    by_name = {r["name"]: r["result"] for r in results["rows"]}
    four, eight = by_name[rows[0]], by_name[rows[1]]
    layer_tflop = (eight["flops_per_token"] - four["flops_per_token"]) / 4 * eight["tokens_per_step"] / 1e12
    busy, _, step = further_layer(name, rows, "top_ops_s")
    matmul = results["ceilings"]["bf16_tflops"]
    rate = layer_tflop / busy
    return {"label": label, "file": name, "busy_s": busy, "step_s": step, "matmul_tflops": matmul,
            "layer_tflop": layer_tflop, "tflops": rate, "datasheet": rate / datasheet,
            "matmul": rate / matmul}  # fmt: skip


def further_layer(
    name: str, rows: tuple[str, str], key: str, width: int | None = None
) -> tuple[float, list[tuple[str, float]], float]:
    """A further layer by a results file's profiled 4- and 8-layer `rows`: its device busy seconds, each
    entry of the profiles' `key` list (names cut to `width` characters, entries of one cut name summed),
    longest first, and its step seconds; each the 8-layer figure less the 4-layer one, over 4."""
    speed = json.loads((RESULTS / f"{name}.json").read_text())
    results = {r["name"]: r["result"] for r in speed["rows"]}
    four, eight = (results[row] for row in rows)

    def summed(result: dict[str, Any]) -> dict[str, float]:
        out: dict[str, float] = {}
        for label, seconds in result["profile"][key]:
            out[label[:width]] = out.get(label[:width], 0.0) + seconds
        return out

    a, b = summed(four), summed(eight)
    entries = sorted(((label, (b[label] - a.get(label, 0.0)) / 4) for label in b), key=lambda kv: -kv[1])
    busy = (eight["profile"]["device_busy_s"] - four["profile"]["device_busy_s"]) / 4
    return busy, entries, (eight["step_s"] - four["step_s"]) / 4


def layer_kernels() -> dict[str, Any]:
    """Seconds a further layer spends in each kernel: the 8-layer profile less the 4-layer one, over 4."""
    busy, kernels, _ = further_layer("step_speed_h200_story_profile", PROFILES, "top_kernels_s", width=90)
    return {"device_busy_s": busy, "kernels": [[name, s] for name, s in kernels[:12]]}


def layer_ops(
    name: str = "step_speed_h200_now_profile", rows: tuple[str, str] = NOW_PROFILES
) -> dict[str, Any]:
    """Seconds a further layer's kernels take, by the operator that launched them (every lever on): the
    8-layer profile's `top_ops_s` less the 4-layer one's, over 4 (`name`'s profiled `rows`)."""
    busy, ops, step = further_layer(name, rows, "top_ops_s")
    return {
        "device_busy_s": busy,
        "step_s_per_layer": step,
        "ops": [[name, s] for name, s in ops if s >= 0.0005],
    }


def table(out: dict[str, Any]) -> str:
    lines = [
        "# The story's marginal decoder layer on an H200, before and after",
        "",
        f"A step of {out['tokens_per_step']:,.0f} tokens (4 rows of 4,096 a micro-batch and 2 micro-batches, "
        f"or 8 rows and one where the row says); a further layer is {out['layer_tflop']:.1f} TFLOP of it by "
        f"{out['formula']}.",
        "",
        f"Rates: {out['datasheet_tflops']:.0f} TFLOP/s datasheet dense bf16; the measured rate is the 8192^3 "
        "bf16 matmul step_speed.py timed in each call (the offload rows: the levers call's, "
        f"{out['matmul_tflops']:.0f} TFLOP/s; the H100 rehearsals': kept_experts.py's on that machine, "
        f"{out['h100_matmul_tflops']:.0f} TFLOP/s). The H100 and the H200 share one chip, so their dense "
        "rate is the same; the H200's memory is faster. In sample: each slope fits its depths.",
        "",
        "| configuration | layer | depths (step s) | s a layer | TFLOP/s | % of datasheet | % of matmul "
        "| GPU peak in training, GiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in out["rows"]:
        steps = ", ".join(f"{d}: {s:.3f}" for d, s in zip(r["depths"], r["step_s"], strict=True))
        gpu = r.get("gpu_train_gib")
        peaks = ", ".join(f"{d}: {g:.1f}" for d, g in zip(r["depths"], gpu, strict=True)) if gpu else "-"
        lines.append(
            f"| {r['config']} | {r['label']} | {steps} | {r['s']:.4f} | {r['tflops']:.0f} | "
            f"{100 * r['datasheet']:.1f}% | {100 * r['matmul']:.1f}% | {peaks} |"
        )
    lk = out["layer_kernels"]
    lines += [
        "",
        f"Where a further layer's device time goes ({lk['device_busy_s']:.4f} s busy; packed attention on, "
        "the expert activation in torch's kernels, no offload; the 8-layer profile less the 4-layer, "
        "over 4):",
        "",
        "| kernel | s a layer | share of busy |",
        "|---|---|---|",
        *(f"| `{name}` | {s:.4f} | {100 * s / lk['device_busy_s']:.1f}% |" for name, s in lk["kernels"]),
    ]
    lo = out["layer_ops"]
    lines += [
        "",
        f"Where a further layer's device time goes now ({lo['device_busy_s']:.4f} s busy, "
        f"{lo['step_s_per_layer']:.4f} s of step with Python frames profiled; every lever on, no offload; "
        "`step_speed_h200_now_profile`): each kernel charged to the operator that launched it, then its "
        "enclosing operator and the nearest Python frame outside torch. Kernels launched by a Python "
        "autograd function itself (the Triton ones) are charged to that function. The 8-layer profile less "
        "the 4-layer, over 4; 0.5 ms and over:",
        "",
        "| launched by | s a layer | share of busy |",
        "|---|---|---|",
        *(f"| `{name}` | {s:.4f} | {100 * s / lo['device_busy_s']:.1f}% |" for name, s in lo["ops"]),
        "",
        "These profiles were taken before `trainer/trace_summary.py` left out Python frames still open at "
        "the profiler's stop and ranges that only overlap the next: there, one frame whose return was "
        "missed seems to enclose all that follows on its thread, so many enclosing names (after `<`, such "
        "as `_PackedGroupedMM < torch_attn::_varlen_attn`) and frames (after `@`, backward operators at "
        "`packed_attention`) are wrong. The launching operator (first) is exact.",
    ]
    for key, what, name in (
        ("layer_ops_mb8", "The same at 8 rows and one micro-batch a step", "step_speed_h200_mb8_profile"),
        ("layer_ops_combine", "Then with the fused combine", "step_speed_h200_combine_profile"),
        (
            "layer_ops_lean",
            "Then with the head norms' kernel and the lean LoRA, as shipped (another call)",
            "step_speed_h200_lora_profile",
        ),
    ):
        mb8 = out[key]
        lines += [
            "",
            f"{what} (`{name}`, no offload, one call): {mb8['device_busy_s']:.4f} s busy, "
            f"{mb8['step_s_per_layer']:.4f} s of step a further layer; 0.5 ms and over:",
            "",
            "| launched by | s a layer | share of busy |",
            "|---|---|---|",
            *(f"| `{name}` | {s:.4f} | {100 * s / mb8['device_busy_s']:.1f}% |" for name, s in mb8["ops"]),
        ]
    lines += [
        "",
        "Device time a further layer, no offload, 8 rows x 1 (torch.profiler's busy time and the step, each "
        "the 8-layer figure less the 4-layer one, over 4; calls differ by a few percent, as their matmul "
        "rates do):",
        "",
        "| configuration | results | busy s a layer | step s a layer | TFLOP/s (busy) | % of datasheet "
        "| % of matmul | matmul TFLOP/s in that call |",
        "|---|---|---|---|---|---|---|---|",
        *(f"| {b['label']} | `{b['file']}` | {b['busy_s']:.4f} | {b['step_s']:.4f} | {b['tflops']:.0f} "
          f"| {100 * b['datasheet']:.1f}% | {100 * b['matmul']:.1f}% | {b['matmul_tflops']:.0f} |"
          for b in out["busy"]),
    ]  # fmt: skip
    lines += ["", "Reproduce: `python benchmarks/marginal_layer.py` (reads the committed results)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
