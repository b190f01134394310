"""One forecast from any depths: the story's 4 x H100 run predicted from every set of rehearsed depths.

Reads the story's rehearsal on one H200 (`benchmarks/results/forecast/records/`: the profile as it
shipped then, 4 rows a micro-batch and 2 a step (`RAN_AT`; it ships 8 rows in one since), random
weights, one rank; with parameter and optimizer offload at 1, 2, 4, 8, 16 and 24 layers, without
at 1, 2, 4, 8 and 16) and forecasts the whole run on the profile's 4 x H100 from every set of two depths
or more, with `cockpit.rehearse.forecast.forecast`, exactly as `cockpit rehearse` does. For each figure
(the optimizer step, the GPU peak in training, host RSS, the load) it gives the spread across the sets
that measure it, and apart from them the sets that can only bound it (each flagged by the forecast).

Out of sample: depth 48 with offload and depth 32 without, each measured in a rehearsal of its own
(`oos_offload_48.json`, `records/oos_none_32`), predicted from the default depths
(`cockpit.rehearse.figures.default_depths`) at that depth on the H200 itself: step, GPU at load and in
training, host RSS at load and in training, load time.

Then `cockpit rehearse --show`'s prediction of a rehearsal written before the fits took their shapes
(`tests/fixtures/records/20261202-051802-tiny-cpu-dfec`). No GPU needed:

    python benchmarks/forecast_consistency.py

The depths were measured in four device calls (about 20 minutes of one H200), at the profile's 4 rows a
micro-batch and 2 a step then (today add `--set training.micro_batch_size=4 --set training.grad_accum=2`):
    python benchmarks/rehearsal_accuracy.py --configs nf4-offload --depths 1,2,4,8,16,24 --name fc_offload
    python benchmarks/rehearsal_accuracy.py --configs nf4-offload --depths 24 --name fc_offload24
    python benchmarks/rehearsal_accuracy.py --configs nf4-offload --depths 48 --name fc_oos_offload48
    python benchmarks/rehearsal_accuracy.py --configs nf4-none --depths 32 --name fc_oos_none32
    python benchmarks/rehearsal_accuracy.py --configs nf4-none --depths 1,2,4,8,16 --name fc_none
(6 steps a depth for all but the first call's 8; the first call's depth 24 ran its steps but was cut at
its deadline, so depth 24 is the second call's). Writes forecast_consistency.md and .json under $OUT
(else benchmarks/results/).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STORY = "qwen3-235b-a22b-thinking-4xh100"
DATA = ROOT / "benchmarks/results/forecast"
OLD_REHEARSAL = ROOT / "tests/fixtures/records/20261202-051802-tiny-cpu-dfec"
NO_OFFLOAD = ['deepspeed.offload_param="none"', 'deepspeed.offload_optimizer="none"']
# These records ran 4 rows a micro-batch and 2 a step, the story profile's until it took 8 x 1
# (`story_forecast.py` reads that profile's own record); each forecast here is the profile they ran.
RAN_AT = ["training.micro_batch_size=4", "training.grad_accum=2"]
CONFIGS = {
    "offload": (RAN_AT, ["offload_1-16", "offload_24"], ("oos_offload_48.json", "nf4-offload")),
    "none": ([*NO_OFFLOAD, *RAN_AT], ["none_1-16"], ("records/oos_none_32", None)),
}
FIGURES = (
    ("step_s", "step s", 0.05),
    ("gpu_train", "GPU train GiB", 0.10),
    ("rss_train", "host RSS GiB", 0.10),
    ("load_s", "load s", None),
)
OOS = ("step_s", "gpu_load", "gpu_train", "rss_load", "rss_train", "load_s")


def measures_of(records: list[str]) -> dict[int, Any]:
    """Each depth once, the first record that completed it."""
    from cockpit.record import read_events
    from cockpit.rehearse.measure import depth_measures

    out: dict[int, Any] = {}
    for record in records:
        for m in depth_measures(read_events(DATA / "records" / record)):
            if m.complete:
                out.setdefault(m.layers, m)
    return out


def story(overrides: list[str]) -> tuple[Any, dict[str, Any]]:
    from cockpit.plan import build_plan
    from cockpit.profiles import load_profile

    profile, _ = load_profile(STORY, overrides)
    return profile, build_plan(profile).to_dict()


def scaling() -> Any:
    from cockpit.rehearse.forecast import Scaling

    return Scaling(1, "NVIDIA H200", 4, "H100-80GB", 80, 960, 1.0, 55.0, 55.0, 150.0, 2.0)


def consistency(config: str) -> dict[str, Any]:
    """Every set of two depths or more, forecast; the spread of each figure over the sets that measure it."""
    from cockpit.rehearse.forecast import forecast

    overrides, records, _ = CONFIGS[config]
    profile, plan = story(overrides)
    by_depth = measures_of(records)
    depths = sorted(by_depth)
    sets = []
    for n in range(2, len(depths) + 1):
        for subset in itertools.combinations(depths, n):
            f = forecast([by_depth[d] for d in subset], profile, plan, scaling())
            sets.append(
                {
                    "depths": list(subset),
                    **{key: f.target.get(key) for key, _, _ in FIGURES},
                    "measured": {key: f.measured(key) for key, _, _ in FIGURES},
                    "ranges": {key: f.ranges["target"].get(key) for key, _, _ in FIGURES},
                    "wall_h": (f.wall.get("total_s") or 0) / 3600,
                }
            )
    every = sets[-1]  # all the depths
    figures = {}
    for key, _, goal in FIGURES:
        says = [s[key] for s in sets if s["measured"][key] and s[key] is not None]
        bound = [s[key] for s in sets if not s["measured"][key] and s[key] is not None]
        ref = every[key]
        figures[key] = {
            "all_depths": ref,
            "sets_measuring": len(says),
            "min": min(says) if says else None,
            "max": max(says) if says else None,
            "spread": max(abs(v / ref - 1) for v in says) if says and ref else None,
            "goal": goal,
            "sets_bounding": len(bound),
            "bound_min": min(bound) if bound else None,
            "bound_max": max(bound) if bound else None,
            "median": statistics.median(says) if says else None,
        }
    return {"depths": depths, "sets": sets, "figures": figures}


def out_of_sample(config: str) -> dict[str, Any]:
    """The default depths' fits read at the held-out depth on the H200 itself, beside its measurement."""
    from cockpit.rehearse.figures import default_depths, fit_all, terms_for
    from cockpit.rehearse.forecast import model_facts
    from cockpit.rehearse.measure import DepthMeasure

    overrides, records, (held, key) = CONFIGS[config]
    profile, plan = story([*overrides, "hardware.gpus=1"])
    by_depth = measures_of(records)
    if key:
        (measure,) = [
            DepthMeasure.from_dict(m) for m in json.loads((DATA / held).read_text())[key]["measures"]
        ]
    else:
        measure = measures_of([held.split("/", 1)[1]])
        measure = next(iter(measure.values()))
    facts = model_facts(plan)
    fitted = [d for d in default_depths(profile, facts.layers) if d in by_depth]
    terms = terms_for(profile, plan, facts.layers, facts.layer_bytes, 1, 55.0)
    fits = fit_all([by_depth[d] for d in fitted], terms)
    rows = []
    for metric in OOS:
        fit = fits.get(metric)
        truth = (
            measure.step_s
            if metric == "step_s"
            else measure.load_s
            if metric == "load_s"
            else measure.peak(metric)
        )
        if fit is None or truth is None:
            continue
        lo, hi = fit.range(measure.layers)
        value = fit.at(measure.layers)
        rows.append(
            {
                "figure": metric,
                "predicted": value,
                "range": [lo, hi],
                "measured": truth,
                "error": value / truth - 1,
                "in_range": lo <= truth <= hi,
                "says": fit.says,
            }
        )
    return {"fitted": fitted, "depth": measure.layers, "rows": rows}


def old_record() -> dict[str, Any]:
    """`cockpit rehearse --show` of a rehearsal written before this change: predicted again."""
    from cockpit.rehearse.run import forecast_run

    data = forecast_run(OLD_REHEARSAL).to_dict()
    return {"record": OLD_REHEARSAL.name, "summary": data["summary"]}


def _f(value: Any, fmt: str = ".3g") -> str:
    return "-" if value is None else format(value, fmt)


def report(results: dict[str, Any]) -> str:
    lines = [
        "# One forecast from any depths: the story on 4 x H100, from every set of rehearsed depths",
        "",
        "The story profile at 4 rows a micro-batch and 2 a step, as it shipped when these depths ran (one "
        "epoch), rehearsed on one H200 (random weights, one rank). "
        "Each set of two depths or more forecasts the 4 x H100 run with the rehearsal's own code. "
        "*Measuring* sets are those the forecast says can say the figure; the others are flagged by it "
        "(a bound, or the plan's per-layer term) and listed apart. Spread: the largest distance of a "
        "measuring set's figure from the figure of all the depths.",
        "",
    ]
    for config, r in results["consistency"].items():
        lines += [
            f"## {'Parameter + optimizer offload' if config == 'offload' else 'No offload'}: depths "
            f"{', '.join(map(str, r['depths']))} ({len(r['sets'])} sets)",
            "",
            "| figure | all depths | sets measuring | their range | spread | goal | sets flagged "
            "| their range |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for key, label, goal in FIGURES:
            g = r["figures"][key]
            spread = f"{g['spread']:.1%}" if g["spread"] is not None else "-"
            ok = "" if goal is None or g["spread"] is None else (" ok" if g["spread"] <= goal else " !")
            lines.append(
                f"| {label} | {_f(g['all_depths'])} | {g['sets_measuring']} | "
                f"{_f(g['min'])}-{_f(g['max'])} | "
                f"{spread}{ok} | {f'{goal:.0%}' if goal else 'none set'} | {g['sets_bounding']} | "
                f"{_f(g['bound_min'])}-{_f(g['bound_max'])} |"
            )
        lines.append("")
    lines += [
        "## Out of sample: a deeper slice, each in a rehearsal of its own, predicted from the default depths",
        "",
        "| configuration | fitted on | depth | figure | predicted [range] | measured | error | in range |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for config, r in results["out_of_sample"].items():
        for row in r["rows"]:
            lines.append(
                f"| {config} | {','.join(map(str, r['fitted']))} | {r['depth']} | {row['figure']} | "
                f"{row['predicted']:.3g} [{row['range'][0]:.3g}, {row['range'][1]:.3g}] | "
                f"{row['measured']:.3g} | "
                f"{row['error']:+.1%} | {'yes' if row['in_range'] else 'no'} |"
            )
    old = results["old_record"]
    lines += [
        "",
        f"## An older record still reads: `cockpit rehearse --show {old['record']}`",
        "",
        f"    {old['summary']}",
        "",
        "Reproduce: `python benchmarks/forecast_consistency.py` (no GPU; the depths' device calls are in its "
        "docstring).",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    results = {
        "consistency": {config: consistency(config) for config in CONFIGS},
        "out_of_sample": {config: out_of_sample(config) for config in CONFIGS},
        "old_record": old_record(),
    }
    text = report(results)
    print(text)
    out = Path(os.environ.get("OUT") or ROOT / "benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "forecast_consistency.md").write_text(text)
    (out / "forecast_consistency.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
