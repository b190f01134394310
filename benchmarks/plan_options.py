"""The plan's speed options, measured: each option of `cockpit plan`'s table that one GPU can run, on the
story's 8-layer slice, beside the plan's own ratio.

Each option is the story profile with the `--set` overrides the plan would print for it
(`cockpit.plan.options.overrides_for`), rehearsed at 8 layers (random weights, one H200, `STEPS` optimizer
steps, the median of those after the warm-up), in one record a option, bracketed as `cockpit rehearse`
brackets a depth. The ratio is tokens/s against the configuration the options were measured from
(param + optimizer offload, 4 rows of 4,096 tokens a micro-batch, 2 a step: `forecast_consistency.RAN_AT`,
the profile's then, so that 8 rows a micro-batch stays an option; it ships 8 rows in one since),
measured at the same depth.

    python benchmarks/plan_options.py --run                    # on the GPU: every option, one call
    python benchmarks/plan_options.py --run --options mb8      # one option
    python benchmarks/plan_options.py --merge FILE [--merge F2] # the table again from measured files

Options that one GPU cannot run (another GPU count, NVMe offload without an NVMe path) are left out;
the plan's table marks them modelled. Writes plan_options_h200.md and .json under $OUT (else
benchmarks/results/).
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

PROFILE = "qwen3-235b-a22b-thinking-4xh100"
LAYERS = 8
STEPS = 6
ONE_GPU = ["hardware.gpus=1"]
# option key -> (the plan's row name, the overrides it prints for it, on top of the profile as written)
OPTIONS: dict[str, tuple[str, list[str]]] = {
    "configured": ("param + optimizer offload", []),
    "none": ("no offload", ['deepspeed.offload_param="none"', 'deepspeed.offload_optimizer="none"']),
    "optimizer": ("optimizer offload", ['deepspeed.offload_param="none"']),
    "mb8": (
        "8 rows a micro-batch, accumulation 1",
        ["training.micro_batch_size=8", "training.grad_accum=1"],
    ),
    "seq2048": (
        "shorter sequences (2048)",
        ['deepspeed.offload_param="none"', 'deepspeed.offload_optimizer="none"', "training.seq_len=2048"],
    ),
    "seq1024": (
        "shorter sequences (1024)",
        ['deepspeed.offload_param="none"', 'deepspeed.offload_optimizer="none"', "training.seq_len=1024"],
    ),
}


def measure(key: str, runs: Path, deadline: float) -> dict[str, Any]:
    """The option's 8-layer slice: one bracketed depth in a record of its own; its DepthMeasure."""
    from benchmarks.forecast_consistency import RAN_AT
    from benchmarks.trainer_runs import log_tail, new_run, run_depth
    from cockpit.record import EventWriter, RunPaths, read_events
    from cockpit.rehearse.measure import BEGIN, END, depth_measures

    run_dir, _ = new_run(PROFILE, ONE_GPU + RAN_AT + OPTIONS[key][1], runs, f"option-{key}")
    marks = EventWriter(RunPaths(run_dir).events("supervisor"))
    marks.write(BEGIN, layers=LAYERS, steps=STEPS, step_offset=0)
    code = run_depth(run_dir, LAYERS, STEPS, None, 0, max(60.0, deadline - time.time()))
    ok = code == 0
    marks.write(END, layers=LAYERS, status="ok" if ok else "failed", message="" if ok else log_tail(run_dir))
    marks.close()
    (m,) = depth_measures(read_events(run_dir))
    return {"run_dir": str(run_dir), "overrides": OPTIONS[key][1], "measure": m.to_dict()}


def plan_ratios() -> dict[str, float]:
    """The plan's tokens/s of each option's row against the configured row (`cockpit plan`'s table)."""
    from benchmarks.forecast_consistency import RAN_AT
    from cockpit.plan import build_plan
    from cockpit.profiles import load_profile

    plan = build_plan(load_profile(PROFILE, RAN_AT)[0]).to_dict()
    rows = {r["label"]: r for r in plan.get("options", [])}
    base = (plan.get("configured") or {}).get("tokens_per_s")
    out = {}
    for key, (name, _) in OPTIONS.items():
        row = rows.get(name, {}) if key != "configured" else {"tokens_per_s": base}
        tps = row.get("tokens_per_s")
        if tps and base:
            out[key] = tps / base
    return out


def table(results: dict[str, dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Markdown, and the rows: measured step, tokens/s and ratio beside the plan's ratio."""
    plan = plan_ratios()
    base = results.get("configured", {}).get("measure", {})
    base_tps = (base.get("tokens_per_step") or 0) / base["step_s"] if base.get("step_s") else None
    rows = []
    for key, (name, overrides) in OPTIONS.items():
        m = results.get(key, {}).get("measure")
        if not m or not m.get("step_s"):
            continue
        tps = (m.get("tokens_per_step") or 0) / m["step_s"]
        rows.append(
            {
                "option": key,
                "name": name,
                "overrides": overrides,
                "step_s": m["step_s"],
                "tokens_per_s": tps,
                "measured_ratio": tps / base_tps if base_tps else None,
                "plan_ratio": plan.get(key),
            }
        )
    lines = [
        f"# The plan's speed options, measured on the story's {LAYERS}-layer slice (one H200)",
        "",
        f"Profile {PROFILE} at 4 rows a micro-batch and 2 a step (as it shipped then) with each "
        f"option's overrides, random weights, {STEPS} optimizer steps (median after 2 warm-up steps). "
        "Ratio: tokens/s against that configuration, the same depth. The plan's ratio is for the whole "
        "model on 4 x H100 (`cockpit plan`), modelled.",
        "",
        "| option | step s | tokens/s | measured ratio | plan's ratio |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        measured = f"{r['measured_ratio']:.2f}x" if r["measured_ratio"] else "-"
        plan = f"{r['plan_ratio']:.2f}x" if r["plan_ratio"] else "-"
        lines.append(f"| {r['name']} | {r['step_s']:.3f} | {r['tokens_per_s']:,.0f} | {measured} | {plan} |")
    lines += ["", "Reproduce: `python benchmarks/plan_options.py --run` (one device call, about 6 minutes)."]
    return "\n".join(lines) + "\n", rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", action="store_true", help="measure the options (needs the GPU)")
    parser.add_argument("--options", default=",".join(OPTIONS), help="comma-separated option keys")
    parser.add_argument("--budget-s", type=float, default=480)
    parser.add_argument("--runs-dir", type=Path, default=Path("/tmp/plan-options-runs"))
    parser.add_argument("--merge", type=Path, action="append", default=[], help="an earlier results file")
    args = parser.parse_args(argv)
    results: dict[str, dict[str, Any]] = {}
    for path in args.merge:
        results.update(json.loads(path.read_text())["results"])
    if args.run:
        deadline = time.time() + args.budget_s
        for key in filter(None, args.options.split(",")):
            if time.time() > deadline:
                print(f"{key}: skipped (budget)", flush=True)
                continue
            t0 = time.time()
            results[key] = measure(key, args.runs_dir, deadline)
            print(f"{key}: {results[key]['measure']['status']} in {time.time() - t0:.0f} s", flush=True)
    report, rows = table(results)
    print(report)
    out = Path(os.environ.get("OUT") or ROOT / "benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan_options_h200.md").write_text(report)
    (out / "plan_options_h200.json").write_text(json.dumps({"results": results, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
