"""`cockpit plan --rehearsal RUN`: a rehearsal's measured figures on the plan row it rehearsed, which rows
are measured and which modelled, and the fastest that fits chosen from measured rows only."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks.forecast_consistency import RAN_AT
from cockpit.plan import build_plan
from cockpit.plan.measured import CONFIGURED
from cockpit.profiles import load_profile

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "benchmarks/results/forecast/records"
STORY = "qwen3-235b-a22b-thinking-4xh100"
NO_OFFLOAD = ['deepspeed.offload_param="none"', 'deepspeed.offload_optimizer="none"']


def _as_rehearsal(tmp_path: Path, record: str, overrides: list[str]) -> Path:
    """The story's H200 depths (a benchmark's record of real measurements) in a rehearsal's manifest whose
    target is the story's own hardware, as `cockpit rehearse` writes it."""
    profile, _ = load_profile(STORY, overrides)
    run = tmp_path / f"rehearsal-{record}"
    shutil.copytree(RECORDS / record, run)
    manifest = json.loads((run / "run.json").read_text())
    manifest["mode"] = "rehearse"
    manifest["rehearsal"] = {
        "layers": [1, 2, 4, 8, 16],
        "steps": 8,
        "target": profile.hardware.model_dump(),
        "target_profile": profile.model_dump(),
    }
    (run / "run.json").write_text(json.dumps(manifest))
    return run


def _text(plan, measured) -> str:
    from rich.console import Console

    from cockpit.plan.render import render

    console = Console(width=200, record=True)
    console.print(render(plan, measured))
    return console.export_text()


def test_a_rehearsal_of_the_configuration_replaces_its_modelled_step(tmp_path: Path) -> None:
    from cockpit.rehearse.calibrate import calibrate

    profile, _ = load_profile(STORY)
    plan = build_plan(profile)
    measured = calibrate(plan, profile, [_as_rehearsal(tmp_path, "offload_1-16", [])])
    assert set(measured) == {CONFIGURED}
    mine = measured[CONFIGURED]
    assert mine.step_measured and mine.gpu_measured
    assert mine.step_s != pytest.approx(plan.run.optimizer_step_s, rel=0.02)  # a figure of its own
    text = _text(plan, measured)
    assert f"{mine.step_s:.2f} s (measured by rehearsal rehearsal-offload_1-16" in text
    assert (
        "(step measured by rehearsal rehearsal-offload_1-16)" in text.splitlines()[2] + text.splitlines()[3]
    )
    # the configured row says measured, every other row modelled
    rows = [
        line for line in text.splitlines() if line.rstrip().endswith((" modelled", " measured", " bound"))
    ]
    assert sum(line.rstrip().endswith(" measured") for line in rows) == 1
    assert sum(line.rstrip().endswith(" modelled") for line in rows) == len(plan.options) - 1


def test_the_fastest_that_fits_is_chosen_from_measured_rows_and_a_faster_modelled_one_is_a_guess(
    tmp_path: Path,
) -> None:
    from cockpit.rehearse.calibrate import calibrate

    earlier = RAN_AT  # what those records ran
    profile, _ = load_profile(STORY, earlier)
    plan = build_plan(profile)
    runs = [
        _as_rehearsal(tmp_path, "offload_1-16", earlier),
        _as_rehearsal(tmp_path, "none_1-16", [*NO_OFFLOAD, *earlier]),
    ]
    measured = calibrate(plan, profile, runs)
    assert set(measured) == {CONFIGURED, "no offload"}
    text = _text(plan, measured)
    fastest = max(measured.values(), key=lambda m: m.tokens_per_s)
    assert f"Fastest that fits, measured ({fastest.source})" in text
    # the plan's own pick (8 rows a micro-batch) was not rehearsed: named, but as a guess to measure
    assert "a guess: modelled, not rehearsed" in text and "training.micro_batch_size=8" in text


def test_without_rehearsals_the_fastest_is_said_to_be_a_guess() -> None:
    profile, _ = load_profile(STORY)
    text = _text(build_plan(profile), {})
    assert "Fastest that fits (a guess: modelled, not rehearsed" in text
    assert "Fastest that fits, measured" not in text


def test_a_rehearsal_of_another_model_cannot_calibrate(tmp_path: Path) -> None:
    from cockpit.rehearse.calibrate import CalibrationError, calibrate

    tiny, _ = load_profile("tiny-cpu")
    plan = build_plan(tiny)
    with pytest.raises(CalibrationError, match="rehearsed another model"):
        calibrate(plan, tiny, [_as_rehearsal(tmp_path, "offload_1-16", [])])


def test_plan_rehearsal_on_the_command_line_is_one_line_when_it_cannot(tmp_path: Path, capsys) -> None:
    from cockpit.cli import main

    run = _as_rehearsal(tmp_path, "offload_1-16", [])
    assert main(["plan", "--profile", "tiny-cpu", "--rehearsal", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot calibrate this plan" in err[0]
    assert main(["plan", "--profile", STORY, "--rehearsal", str(run), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["measured"][CONFIGURED]["source"] == f"rehearsal {run.name}"
