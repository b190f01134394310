"""The story's whole run predicted from depths measured on an H200: rehearsal figures, scaled to 4 x H100.

Reads the depth measurements `benchmarks/rehearsal_accuracy.py` made (the story's architecture at 1, 2,
4, 8 and 16 layers (16 with offload only), random weights, one H200, the story profile as shipped: 4
packed rows of 4096 tokens a micro-batch, gradient accumulation 2, 3 layers prefetched) and predicts the
whole 94-layer run on the story profile's own machine (4 x H100-80GB) with
`cockpit.rehearse.forecast.forecast`, every assumption printed. The step count comes from the profile's
data (3,600 examples of about 2,000 tokens, two epochs: an assumption, the data file is not here).
Beside it: what `cockpit plan` says for the same profile, and the story's 26 hours. No GPU needed.

    python benchmarks/story_forecast.py [--measured F.json ...]

Depths measured with other settings need those settings again: `--set training.grad_accum=2 ...`.
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
CONFIGS = {"nf4-offload": ("true", "cpu"), "nf4-none": ("true", "none")}
# A device call each (benchmarks/rehearsal_accuracy.py --depths 1,2,D, D = 4, 8, 16): 1 and 2 from the first
MEASURED = (
    "rehearsal_accuracy_mb4_h200.json",
    "rehearsal_accuracy_mb4_depth8_h200.json",
    "rehearsal_accuracy_mb4_depth16_h200.json",
)


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    from benchmarks.rehearsal_accuracy import merged
    from cockpit.plan import build_plan
    from cockpit.profiles import load_profile
    from cockpit.rehearse.forecast import Scaling, forecast
    from cockpit.rehearse.measure import DepthMeasure
    from cockpit.rehearse.render import render

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--measured",
        type=Path,
        action="append",
        help="rehearsal_accuracy results (repeatable: depths missing from the first are taken from the "
        "next); default: the story profile's depths 1, 2, 4, 8 and 16 (" + ", ".join(MEASURED) + ")",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a profile override the measured depths ran with (repeatable)",
    )
    args = parser.parse_args(argv)
    files = args.measured or [ROOT / "benchmarks/results" / name for name in MEASURED]
    measured = merged([json.loads(path.read_text()) for path in files])  # each depth once, completed first
    console = Console(record=True, width=150)
    summary = {}
    for config, (experts, offload) in CONFIGS.items():
        overrides = [
            f"quantization.quantize_experts={experts}",
            f'deepspeed.offload_param="{offload}"',
            f'deepspeed.offload_optimizer="{offload}"',
            *args.set,  # the settings the depths ran with, where they were not the profile's
        ]
        profile, _ = load_profile(STORY, overrides)
        plan = build_plan(profile).to_dict()
        measures = [DepthMeasure.from_dict(m) for m in measured.get(config, {}).get("measures", [])]
        scaling = Scaling(1, "NVIDIA H200", 4, "H100-80GB", 80, 960, 1.0, 55.5, 55.0, 150.0, 2.0)
        result = forecast(measures, profile, plan, scaling)
        data = result.to_dict()
        console.rule(
            f"{config}: the story profile, "
            + ("parameter + optimizer offload" if offload != "none" else "no offload")
        )
        console.print(render(data))
        plan_step = (plan.get("run") or {}).get("optimizer_step_s")  # a micro-batch's step x accumulation
        plan_total = plan_step * result.wall["steps"] if plan_step else None
        console.print(
            f"beside: the story's 26 h; cockpit plan's optimizer step {plan_step or 0:.2f} s x "
            f"{result.wall['steps']:.0f} steps = {(plan_total or 0) / 3600:.2f} h of training"
        )
        summary[config] = {
            "forecast": data,
            "plan_step_s": plan_step,
            "plan_train_s": plan_total,
        }
    out = Path(os.environ.get("OUT") or ROOT / "benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "story_forecast.md").write_text("```\n" + console.export_text() + "```\n")
    (out / "story_forecast.json").write_text(json.dumps(summary, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
