"""The planner's step time against the step times measured on the GPU, from the stored results.

`benchmarks/plan_vs_measured.py` ran the real trainer on slices of the story's geometry on one H200 and
kept each case's measured median step time in `benchmarks/results/plan_vs_measured*_h200.json`. This
script asks the current planner for the same cases (same geometry, depth, offload, experts, loader,
sequence length, one H200) and prints predicted against measured, with the error. It needs no GPU:

    python benchmarks/plan_step_time.py

The step-time model's one fitted constant (`Assumptions.expert_pass_ms`) was fitted to these same
cases, so this table shows the fit, not an out-of-sample check.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from plan_vs_measured import STORY_CONFIG, Case, profile_for  # noqa: E402

from cockpit.plan.hardware import Hardware  # noqa: E402
from cockpit.plan.model import Assumptions  # noqa: E402
from cockpit.plan.planner import build_plan  # noqa: E402
from cockpit.profiles import parse_profile  # noqa: E402

RESULTS = sorted((ROOT / "benchmarks" / "results").glob("plan_vs_measured*_h200.json"))
H200 = Hardware(gpus=1, gpu_name="NVIDIA H200", gpu_mem_gib=139.8, host_ram_gib=128.0)


def predicted_step_s(case: Case, seq_len: int, work: Path, assumptions: Assumptions) -> float | None:
    """The planner's step time for one stored case, rebuilt from the story's config.json."""
    model = work / f"slice-{case.depth}"
    model.mkdir(exist_ok=True)
    config = json.loads(STORY_CONFIG.read_text())
    (model / "config.json").write_text(json.dumps({**config, "num_hidden_layers": case.depth}))
    data = work / "data.jsonl"
    data.touch()
    profile = parse_profile(profile_for(case, model, data, True, seq_len, 4), f"{case.name} (rebuilt)")
    return build_plan(profile, H200, assumptions).configured.step_s


def main() -> int:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in RESULTS:
            stored = json.loads(path.read_text())
            for c in stored["cases"]:
                measured = (c.get("measured") or {}).get("step_s")
                if not measured:
                    continue
                case = Case(c["depth"], c["offload_param"], bool(c.get("experts_4bit_requested")))
                case.loader = c.get("loader") or "transformers"
                without = predicted_step_s(case, stored["seq_len"], Path(tmp), Assumptions(expert_pass_ms=0))
                now = predicted_step_s(case, stored["seq_len"], Path(tmp), Assumptions())
                rows.append((case, without, now, measured))
    print(
        "| depth | param offload | experts | loader | measured s | plan, FLOPs only s | error "
        "| plan with the per-expert cost s | error |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    errors: dict[str, list[float]] = {"without": [], "with": []}
    for case, without, now, measured in rows:
        e0, e1 = (without - measured) / measured, (now - measured) / measured
        errors["without"].append(abs(e0))
        errors["with"].append(abs(e1))
        print(
            f"| {case.depth} | {case.offload_param} | {'NF4' if case.experts_4bit else '16 bit'} "
            f"| {case.loader} | {measured:.3f} | {without:.3f} | {e0:+.0%} | {now:.3f} | {e1:+.0%} |"
        )
    for name, errs in errors.items():
        within = sum(e <= 0.15 for e in errs)
        print(
            f"{name} the per-expert cost: {within} of {len(errs)} within 15%, largest error {max(errs):.0%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
