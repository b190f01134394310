"""Does a rehearsal predict? Depth 4 predicted from the 1- and 2-layer runs, beside its measurement.

For each configuration (NF4 or 16-bit experts, parameter offload or none) the story's architecture is
rehearsed at 1, 2 and 4 layers (random weights, the story profile's settings, `cockpit.rehearse`'s
depth brackets in the record). The fit over depths 1 and 2 (`cockpit.rehearse.predict.fit`) is read at
depth 4 and set beside what depth 4 measured: GPU peak at load and in training, host RSS at load and in
training, median step time. The 4-layer figures are out of sample: they took no part in the fit.

    python benchmarks/rehearsal_accuracy.py                     # on the GPU
    python benchmarks/rehearsal_accuracy.py --configs nf4-none  # one configuration
    python benchmarks/rehearsal_accuracy.py --cpu               # the tiny profile, a smoke test

Settings that would make a benchmark of 12 depth runs too long are changed and stated in the output:
gradient accumulation 2 instead of the profile's 8 (the rehearsal command keeps the profile's).
Writes rehearsal_accuracy.md and .json under $OUT (else benchmarks/results/).
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

CONFIGS = {
    "nf4-none": ("true", "none"),
    "nf4-offload": ("true", "cpu"),
    "bf16-none": ("false", "none"),
    "bf16-offload": ("false", "cpu"),
}
DEPTHS = (1, 2, 4)
FIT_DEPTHS = (1, 2)
STEPS = 8
TOLERANCE = 0.15
FIGURES = (
    ("gpu_load", "GPU load GiB"),
    ("gpu_train", "GPU train GiB"),
    ("rss_load", "RSS load GiB"),
    ("rss_train", "RSS train GiB"),
    ("step_s", "step s"),
)


def config_overrides(config: str, gpu: bool) -> list[str]:
    """The profile overrides of one configuration."""
    experts, offload = CONFIGS[config]
    overrides = [
        f"quantization.quantize_experts={experts}",
        f'deepspeed.offload_param="{offload}"',
        f'deepspeed.offload_optimizer="{offload}"',
        "training.grad_accum=2",
        f"hardware.gpus={1 if gpu else 0}",
    ]
    if not gpu:
        overrides += ["training.bf16=false", "training.micro_batch_size=4", "data.mean_tokens=100"]
    return overrides


def gathered(config: str, profile_name: str, gpu: bool) -> Any:
    """The configuration's gathered-layers term (`cockpit.rehearse.predict.gathered_for`), from its plan."""
    from cockpit.plan.model import Weights
    from cockpit.plan.planner import inputs_for, resolve_geometry
    from cockpit.profiles import load_profile
    from cockpit.rehearse.predict import gathered_for

    profile, _ = load_profile(profile_name, config_overrides(config, gpu))
    inputs = inputs_for(profile, resolve_geometry(profile))
    layer = Weights.of(inputs.geometry, inputs.precision).largest_layer()[1]
    return gathered_for(profile, layer)


def rehearse(config: str, profile_name: str, gpu: bool, runs: Path, deadline: float) -> dict[str, Any]:
    """Every depth of one configuration in one record, bracketed as the rehearsal command brackets them."""
    from benchmarks.trainer_runs import log_tail, new_run, run_depth
    from cockpit.record import EventWriter, RunPaths, read_events
    from cockpit.rehearse.measure import BEGIN, END, depth_measures

    run_dir, _ = new_run(profile_name, config_overrides(config, gpu), runs, f"accuracy-{config}")
    marks = EventWriter(RunPaths(run_dir).events("supervisor"))
    offset = 0
    for layers in DEPTHS:
        if time.time() > deadline:
            break
        marks.write(BEGIN, layers=layers, steps=STEPS, step_offset=offset)
        code = run_depth(run_dir, layers, STEPS, step_offset=offset, timeout=max(60, deadline - time.time()))
        ok = code == 0
        marks.write(
            END, layers=layers, status="ok" if ok else "failed", message="" if ok else log_tail(run_dir)
        )
        offset += STEPS
        if not ok:
            break
    marks.close()
    measures = depth_measures(read_events(run_dir))
    return {"run_dir": str(run_dir), "measures": [m.to_dict() for m in measures]}


def compare(result: dict[str, Any], extra: Any = None) -> list[dict[str, Any]]:
    """Per figure: the rehearsal's fit over FIT_DEPTHS (`cockpit.rehearse.predict.fit_all`, the GPU peak
    less the gathered layers `extra`) read at 4 layers, beside the 4-layer measurement."""
    from cockpit.rehearse.measure import DepthMeasure
    from cockpit.rehearse.predict import fit_all

    measures = [DepthMeasure.from_dict(m) for m in result["measures"]]
    by_depth = {m.layers: m for m in measures if m.complete}
    fits = fit_all([by_depth[d] for d in FIT_DEPTHS if d in by_depth], extra)
    rows = []
    for key, label in FIGURES:

        def value(m: DepthMeasure, key: str = key) -> float | None:
            return m.step_s if key == "step_s" else m.peak(key)

        line = fits.get(key)
        measured = value(by_depth[4]) if 4 in by_depth else None
        predicted = line.at(4) if line else None
        if predicted is not None and key == "gpu_train" and extra is not None:
            predicted += extra.at(4)
        error = (predicted - measured) / measured if predicted is not None and measured else None
        rows.append({"figure": label, "predicted": predicted, "measured": measured, "error": error})
    return rows


def table(results: dict[str, dict[str, Any]], note: str, extras: dict[str, Any] | None = None) -> str:
    out = [
        "# Rehearsal accuracy: depth 4 predicted from depths 1 and 2 (out of sample)",
        "",
        note,
        "",
        "| configuration | " + " | ".join(label for _, label in FIGURES) + " | within 15% |",
        "|---|" + "---|" * (len(FIGURES) + 1),
    ]
    total = inside = 0
    for config, result in results.items():
        cells, ok = [], 0
        for row in compare(result, (extras or {}).get(config)):
            if row["error"] is None:
                cells.append("-")
                continue
            flag = "" if abs(row["error"]) <= TOLERANCE else " !"
            ok += abs(row["error"]) <= TOLERANCE
            total += 1
            cells.append(f"{row['predicted']:.3g} / {row['measured']:.3g} ({row['error']:+.0%}){flag}")
        inside += ok
        out.append(f"| {config} | " + " | ".join(cells) + f" | {ok} of {sum(c != '-' for c in cells)} |")
    out += ["", f"{inside} of {total} figures within 15% (predicted / measured, error against measured)."]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cpu", action="store_true", help="the tiny profile on the CPU (a smoke test)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated configurations")
    parser.add_argument("--budget-s", type=float, default=480)
    parser.add_argument("--runs-dir", type=Path, default=Path("/tmp/rehearsal-accuracy-runs"))
    parser.add_argument(
        "--merge", type=Path, help="an earlier rehearsal_accuracy.json: its configurations are kept"
    )
    args = parser.parse_args(argv)
    gpu = not args.cpu
    profile_name = "qwen3-235b-a22b-thinking-4xh100" if gpu else "tiny-cpu"
    deadline = time.time() + args.budget_s
    results: dict[str, dict[str, Any]] = json.loads(args.merge.read_text()) if args.merge else {}
    for config in filter(None, args.configs.split(",")):  # --configs "" --merge F: report F again
        t0 = time.time()
        results[config] = rehearse(config, profile_name, gpu, args.runs_dir, deadline)
        done = [m["layers"] for m in results[config]["measures"] if m["status"] == "ok"]
        print(f"{config}: depths {done} in {time.time() - t0:.0f} s", flush=True)
    note = (
        f"Profile {profile_name}, random weights, {STEPS} steps a depth (median of the last {STEPS - 2}), "
        "gradient accumulation 2 (the profile's 8 would make 12 depth runs too long), one GPU."
        if gpu
        else "The tiny profile on the CPU (a smoke test of the method, not a claim)."
    )
    extras = {c: gathered(c, profile_name, gpu) for c in CONFIGS if c in results}
    report = table({c: results[c] for c in CONFIGS if c in results}, note, extras)
    print(report)
    out = Path(os.environ.get("OUT") or ROOT / "benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    suffix = "" if gpu else "_cpu"
    (out / f"rehearsal_accuracy{suffix}.md").write_text(report)
    (out / f"rehearsal_accuracy{suffix}.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
