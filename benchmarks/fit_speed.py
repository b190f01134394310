"""The planner's step-time coefficients, fitted to measured rows and checked out of sample.

Fits `cockpit.plan.speed.MeasuredSpeed`: a micro-batch = fixed + layers x per-layer + model FLOPs / (rate x
efficiency), on one H100 with the code as it runs now (FlashAttention-4, the kept experts): the rows
`IN_SAMPLE` of `benchmarks/results/step_speed_h100_refit.json` (`benchmarks/step_speed.py`: depths 1 and 2
at 4,096 tokens, depth 4 at 1,024 and 8,192) and the story profile's rehearsals without offload
(`benchmarks/fit_memory.py`'s records: 4, 8 and 16 layers at 32,768 and 16,384 tokens a micro-batch).
With parameter offload the step is at least `copy_factor` x its host-to-device copies at the measured
link rate: fitted on the offload rows of the story profile's own settings (3 layers prefetched, the
embeddings on the GPU, the overlapped fetch) at 4 and 8 layers and 4,096 tokens, which their copies
bound, their copy bytes the planner's (`Weights.moved_bytes`: each layer twice a micro-batch). Out of
sample: the story's rehearsals with offload, each predicted as max(compute, copies). A row with gradient
accumulation is predicted a micro-batch at a time, times its micro-batches.

    python benchmarks/fit_speed.py            # prints the table and the constants for cockpit/plan/speed.py

Writes plan_speed_fit.md and .json under $OUT (else benchmarks/results/). No GPU needed.
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

RESULTS = ROOT / "benchmarks/results/step_speed_h100_refit.json"
STORY = "qwen3-235b-a22b-thinking-4xh100"
IN_SAMPLE = ("after-4096-1L", "after-4096-2L", "after-1024", "after-full-8192")
OFFLOAD_IN_SAMPLE = ("offload-prefetch3-4096", "offload-prefetch3-4096-8L")
OUT_OF_SAMPLE = (
    "after-4096",
    "after-4096-callbacks",
    "after-4096-telemetry",
    "after-8192",
    "after-full-4096",
    "after-4096-mb2",
    "story-4096-ga8",
    "story-offload-prefetch3-4096-ga8",
    # measured after the fit was made: the story profile's step as it now ships, and a deeper offload slice
    "story-4096-mb4-ga2",
    "story-offload-prefetch3-4096-mb2-ga4",
    "story-offload-prefetch3-4096-mb4-ga2",
    "story-offload-prefetch3-4096-mb4-ga2-8L",
    "story-offload-prefetch3-4096-ga8-again",
    "offload-prefetch3-4096-16L",
)


def copy_bytes(layers: int) -> float:
    """Host-to-device bytes of a micro-batch with parameter offload, as the planner counts them for the
    story profile on one GPU."""
    from benchmarks.fit_memory import slice_inputs
    from cockpit.profiles import load_profile

    inputs, setup = slice_inputs(load_profile(STORY)[0], layers, "H200")
    return inputs.weights.moved_bytes(setup)


def rows_by_name(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for r in data["rows"]:
        x = r["result"]
        if x.get("exit") == 0 and x.get("step_s") and x.get("flops_per_token") and x.get("tokens_per_step"):
            out[r["name"]] = {
                "layers": r["layers"],
                "offload": r["offload"],
                "flops": x["flops_per_token"] * x["tokens_per_step"],
                "step_s": x["step_s"],
                "tflops": (x.get("ceilings") or data["ceilings"])["bf16_tflops"],
                "h2d_gbps": (x.get("ceilings") or data["ceilings"])["h2d_gbps"],
                "timed_steps": x.get("timed_steps"),
                "ga": r.get("ga", 1),
            }
    return out


def record_rows() -> dict[str, dict[str, Any]]:
    """The story profile's rehearsals on one H100 (`benchmarks/fit_memory.py`'s records: 4, 8 and 16
    layers, offload and none, 8 rows a micro-batch and 4 rows x 2), a row a depth as `rows_by_name` gives
    them, a micro-batch at a time: its model FLOPs as the planner counts them (`micro_batch_flops`, the
    profile's data), its seconds the record's optimizer step over its micro-batches."""
    from benchmarks.fit_memory import IN_SAMPLE as RECORDS
    from benchmarks.fit_memory import record_profile, slice_inputs
    from benchmarks.forecast_consistency import measures_of
    from cockpit.plan.estimator import micro_batch_flops

    out = {}
    for record in RECORDS:
        profile = record_profile(record)
        ga = profile.training.grad_accum
        for layers, m in sorted(measures_of([record]).items()):
            _, flops = micro_batch_flops(*slice_inputs(profile, layers, "H100"))
            out[f"{record} at {layers}"] = {
                "layers": layers,
                "offload": profile.deepspeed.offload_param != "none",
                "flops": flops,
                "step_s": m.step_s / ga,
                "timed_steps": m.steps_timed,
                "ga": 1,
            }
    return out


def fit(data: dict[str, Any]) -> tuple[Any, list[dict[str, Any]]]:
    """The fitted MeasuredSpeed and a row a configuration: predicted beside measured."""
    from dataclasses import replace

    from cockpit.plan.speed import fit_speed

    rows = rows_by_name(data)
    missing = [n for n in IN_SAMPLE + OFFLOAD_IN_SAMPLE if n not in rows]
    if missing:
        raise SystemExit(f"{RESULTS}: rows missing for the fit: {', '.join(missing)}")
    tflops = round(statistics.mean(r["tflops"] for r in rows.values()), 1)
    h2d = statistics.mean(r["h2d_gbps"] for r in rows.values())
    records = record_rows()
    fitted = [*IN_SAMPLE, *(n for n, r in records.items() if not r["offload"])]
    rows.update(records)
    speed = fit_speed(
        [(rows[n]["layers"], rows[n]["flops"], rows[n]["step_s"]) for n in fitted],
        data["ceilings"].get("gpu", "NVIDIA H200"),
        tflops,
        f"benchmarks/results/{RESULTS.name} rows {', '.join(IN_SAMPLE + OFFLOAD_IN_SAMPLE)}; the story's "
        "rehearsals without offload (forecast/records/none_4-16_fa4, none_4-16_mb4_fa4)",
    )
    copies = {n: copy_bytes(rows[n]["layers"]) / (h2d * 1e9) for n in OFFLOAD_IN_SAMPLE}
    for n in OFFLOAD_IN_SAMPLE:  # the copies bound these rows: their compute alone is shorter
        if speed.compute_s(rows[n]["layers"], rows[n]["flops"], tflops) >= rows[n]["step_s"]:
            raise SystemExit(f"{RESULTS}: {n} is not bound by its copies; it cannot fit copy_factor")
    speed = replace(speed, copy_factor=statistics.mean(rows[n]["step_s"] / copies[n] for n in copies))
    table = []
    for name in [*fitted, *OFFLOAD_IN_SAMPLE, *OUT_OF_SAMPLE, *(n for n in records if n not in fitted)]:
        r = rows.get(name)
        if r is None:
            continue
        predicted = speed.compute_s(r["layers"], r["flops"] / r["ga"], tflops)
        if r["offload"]:
            predicted = max(predicted, speed.copy_factor * copy_bytes(r["layers"]) / (h2d * 1e9))
        predicted *= r["ga"]
        table.append(
            {
                "row": name,
                "sample": "in (fitted)" if name in fitted or name in OFFLOAD_IN_SAMPLE else "out",
                "layers": r["layers"],
                "offload": r["offload"],
                "tflop_per_step": r["flops"] / 1e12,
                "measured_s": r["step_s"],
                "predicted_s": predicted,
                "error": predicted / r["step_s"] - 1,
                "timed_steps": r["timed_steps"],
            }
        )
    return speed, table


def report(speed: Any, table: list[dict[str, Any]]) -> str:
    lines = [
        "# The planner's step time, fitted to measured rows",
        "",
        f"step = {speed.fixed_s:.4f} s + layers x {speed.layer_s:.4f} s + model FLOPs / "
        f"({speed.measured_tflops} TFLOP/s x {speed.efficiency:.3f}); with parameter offload, the step is "
        f"at least {speed.copy_factor:.2f} x the host-to-device copy time. Fitted on {speed.gpu} to "
        f"{speed.source}.",
        "",
        "| row | sample | layers | offload | TFLOP a micro-batch | measured s (timed steps) | predicted s "
        "| error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in table:
        lines.append(
            f"| {t['row']} | {t['sample']} | {t['layers']} | {'param+opt' if t['offload'] else 'none'} | "
            f"{t['tflop_per_step']:.1f} | "
            f"{t['measured_s']:.3f} ({t['timed_steps']}) | "
            f"{t['predicted_s']:.3f} | {t['error']:+.1%} |"
        )
    out = [r for r in table if r["sample"] == "out"]
    if out:
        worst = max(out, key=lambda r: abs(r["error"]))
        within = sum(abs(r["error"]) <= 0.15 for r in out)
        lines += [
            "",
            f"Out of sample: {within} of {len(out)} within 15%; largest error {worst['error']:+.1%} "
            f"({worst['row']}).",
        ]
    lines += [
        "",
        "Constants for cockpit/plan/speed.py:",
        "",
        "```",
        f"fixed_s={speed.fixed_s:.6f}, layer_s={speed.layer_s:.6f}, efficiency={speed.efficiency:.6f}, "
        f"copy_factor={speed.copy_factor:.6f}, measured_tflops={speed.measured_tflops}",
        "```",
        "",
        f"Reproduce: `python benchmarks/fit_speed.py` (reads the committed {RESULTS.name}).",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    from dataclasses import asdict

    data = json.loads(RESULTS.read_text())
    speed, table = fit(data)
    text = report(speed, table)
    print(text)
    out = Path(os.environ.get("OUT") or ROOT / "benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan_speed_fit.md").write_text(text)
    (out / "plan_speed_fit.json").write_text(json.dumps({"speed": asdict(speed), "rows": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
