"""`benchmarks/eval_speed.py` reads a rehearsal that timed evaluation at three depths: the deepest predicted
from the two others, figure by figure and as the slice's whole evaluation, against the goal. (Its run on
the tiny profile, `--tiny`, launches real rehearsals: the lead's GPU run and the smoke test do that.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.eval_speed import analyse, render
from cockpit.profiles import load_profile, profile_to_dict
from cockpit.record import RunPaths, write_manifest
from cockpit.rehearse.measure import BEGIN, END, EVAL


def _record(tmp_path: Path, profile, bend: float) -> Path:
    """A rehearsal record of three eval-only depths whose costs are linear in depth, the deepest's decode
    step `bend` times the line's."""
    run = tmp_path / "rehearsal"
    run.mkdir()
    write_manifest(
        run, {"run_id": run.name, "mode": "rehearse", "status": "finished",
              "rehearsal": {"layers": [1, 2, 4], "steps": 0, "target_profile": profile_to_dict(profile)}},
    )  # fmt: skip
    supervisor, trainer = [], []
    for i, n in enumerate((1, 2, 4)):
        t = 100.0 * i
        supervisor.append({"t": t, "kind": BEGIN, "layers": n, "steps": 0, "step_offset": 0})
        decode = (0.01 + 0.002 * n) * (bend if n == 4 else 1.0)
        trainer.append(
            {"t": t + 1, "kind": EVAL, "rank": 0, "layers": n, "device": "cpu", "gpus": 0, "batch": 64,
             "prompt_tokens": 96, "new_tokens": 8, "repeats": 2, "prefill_s": 0.1 + 0.05 * n,
             "decode_step_s": decode, "score_s": 0.5 + 0.3 * n, "single_prefill_s": 0.01 + 0.001 * n,
             "single_decode_step_s": 0.004 + 0.001 * n}
        )  # fmt: skip
        supervisor.append({"t": t + 2, "kind": END, "layers": n, "status": "ok", "message": ""})
    paths = RunPaths(run)
    for path, events in ((paths.events("supervisor"), supervisor), (paths.events("trainer-rank0"), trainer)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return run


def test_the_deepest_slice_is_predicted_from_the_others(tmp_path: Path) -> None:
    profile, _ = load_profile("tiny-cpu")
    result = analyse(_record(tmp_path, profile, 1.0), profile)
    assert (result["fitted"], result["checked"]) == ([1, 2], 4)
    rows = {r["figure"]: r for r in result["rows"]}
    assert rows["decode_step_s"]["predicted"] == pytest.approx(0.018)
    assert rows["decode_step_s"]["error"] == pytest.approx(0.0, abs=1e-9)
    assert result["slice_error"] == pytest.approx(0.0, abs=1e-9)
    assert "within the goal of 10%" in render(result) and "NOT within" not in render(result)
    assert result["forecast"]["evaluation"]["measured"]


def test_a_slice_off_its_line_is_said_not_within_the_goal(tmp_path: Path) -> None:
    profile, _ = load_profile("tiny-cpu")
    result = analyse(_record(tmp_path, profile, 1.5), profile)
    rows = {r["figure"]: r for r in result["rows"]}
    assert rows["decode_step_s"]["error"] == pytest.approx(1 / 1.5 - 1)
    assert result["slice_error"] < -0.10 and "NOT within the goal of 10%" in render(result)
