"""The rehearsal's fits in their known shapes: any set of depths that can say a figure says the same, a
set that cannot says so and bounds it; ranges; old records re-predicted."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from cockpit.rehearse.fit import Point, fit_gathered, fit_line, fit_past_window

ROOT = Path(__file__).resolve().parent.parent
FORECAST = ROOT / "benchmarks/results/forecast"
OLD_REHEARSAL = ROOT / "tests/fixtures/records/20261202-051802-tiny-cpu-dfec"


def _step(d: int, window: int = 4) -> float:
    """An offloaded step: 0.2 s fixed, 0.17 s a layer, 0.04 s more for each layer inside the window."""
    return 0.2 + 0.17 * d + 0.04 * min(d, window)


def _gpu(d: int, knee: int = 6) -> float:
    """A gathered training peak: 11 GiB fixed, 0.16 GiB a layer, 1.2 GiB more a layer up to the knee."""
    return 11.0 + 0.16 * d + 1.2 * min(d, knee)


DEPTHS = (1, 2, 4, 8, 16, 24)


def _subsets(depths=DEPTHS):
    for n in range(2, len(depths) + 1):
        yield from itertools.combinations(depths, n)


def test_every_set_with_two_depths_past_the_window_says_the_same_step() -> None:
    truth = _step(94)
    for subset in _subsets():
        fit = fit_past_window([Point(d, _step(d)) for d in subset], 4, copy_s=0.09, full=94)
        past = [d for d in subset if d >= 4]
        assert fit.says == (len(past) >= 2), subset
        if fit.says:
            assert fit.at(94) == pytest.approx(truth), subset
        else:
            # a bound, never below the truth, its range reaching it, and the depths to add named
            assert fit.at(94) >= truth - 1e-9, subset
            lo, hi = fit.range(94)
            assert lo <= truth <= hi, subset
            assert "--layers" in fit.note and "prefetch window (4 layers)" in fit.note


def test_a_line_through_every_depth_would_not_have_said_the_same() -> None:
    """The shape is what makes the answers agree: one line through the window's depths reads the step
    high (the failure this fit replaces)."""
    plain = fit_line([Point(d, _step(d)) for d in (1, 2, 4, 8)])
    assert plain is not None and plain.at(94) > 1.02 * _step(94)


def test_every_set_with_two_depths_past_the_knee_says_the_same_peak() -> None:
    truth = _gpu(94)
    for subset in _subsets():
        fit = fit_gathered([Point(d, _gpu(d)) for d in subset], 6, modelled_per_layer=0.125, full=94)
        says = len([d for d in subset if d >= 6]) >= 2
        assert fit.says == says, subset
        if says:
            assert fit.at(94) == pytest.approx(truth), subset
        else:
            assert fit.per_layer == 0.125 and "modelled" in fit.note and "--layers" in fit.note
            assert fit.at(94) == pytest.approx(truth, rel=0.15), subset


def test_one_line_through_the_knee_reads_the_peak_far_too_high() -> None:
    plain = fit_line([Point(d, _gpu(d)) for d in (1, 2, 4, 8)])
    assert plain is not None and plain.at(94) > 1.5 * _gpu(94)


def test_the_band_grows_with_the_points_own_uncertainty_and_the_distance() -> None:
    points = [Point(d, 1.0 + 0.5 * d, 0.01) for d in (4, 8)]
    fit = fit_line(points, floor=0.0)
    assert fit is not None
    assert fit.band(8) < fit.band(16) < fit.band(94)
    exact = fit_line([Point(d, 1.0 + 0.5 * d) for d in (4, 8)], floor=0.0)
    assert exact is not None and exact.band(94) == 0.0
    lo, hi = fit.range(94)
    assert lo < fit.at(94) < hi


def _story_forecasts(name: str, overrides: list[str], depths_files: list[str]):
    from cockpit.plan import build_plan
    from cockpit.profiles import load_profile
    from cockpit.record import read_events
    from cockpit.rehearse.forecast import Scaling, forecast
    from cockpit.rehearse.measure import depth_measures

    by_depth = {}
    for record in depths_files:
        for m in depth_measures(read_events(FORECAST / "records" / record)):
            if m.complete:
                by_depth.setdefault(m.layers, m)
    profile, _ = load_profile("qwen3-235b-a22b-thinking-4xh100", overrides)
    plan = build_plan(profile).to_dict()
    scaling = Scaling(1, "NVIDIA H200", 4, "H100-80GB", 80, 960, 1.0, 55.0, 55.0, 150.0, 2.0)
    out = {}
    for subset in _subsets(tuple(sorted(by_depth))):
        out[subset] = forecast([by_depth[d] for d in subset], profile, plan, scaling)
    return out


@pytest.mark.parametrize(
    ("overrides", "records"),
    [
        ([], ["offload_1-16", "offload_24"]),
        (['deepspeed.offload_param="none"', 'deepspeed.offload_optimizer="none"'], ["none_1-16"]),
    ],
    ids=["offload", "none"],
)
def test_the_story_forecast_is_one_answer_from_any_depths_that_can_say_it(overrides, records) -> None:
    """The committed H200 rehearsal of the story (benchmarks/results/forecast/records): every set of two
    depths or more that measures the step gives it within 5% of the forecast from all the depths, and the
    GPU peak in training within 10%; a set that cannot is flagged."""
    forecasts = _story_forecasts("story", overrides, records)
    every = forecasts[max(forecasts, key=len)]
    step, gpu = every.target["step_s"], every.target["gpu_train"]
    for subset, f in forecasts.items():
        if f.measured("step_s"):
            assert f.target["step_s"] == pytest.approx(step, rel=0.05), subset
        else:
            assert any("prefetch window" in n for n in f.notes), subset
        if f.measured("gpu_train"):
            assert f.target["gpu_train"] == pytest.approx(gpu, rel=0.10), subset
        else:
            assert any("modelled" in n for n in f.notes), subset


def test_a_rehearsal_written_before_the_shapes_is_predicted_again_and_its_old_file_drawn() -> None:
    from rich.console import Console

    from cockpit.rehearse.render import render
    from cockpit.rehearse.run import forecast_run

    again = forecast_run(OLD_REHEARSAL)
    data = again.to_dict()
    lo, hi = data["ranges"]["wall"]["total_s"]
    assert lo <= data["wall"]["total_s"] <= hi
    assert {"step_s", "gpu_train", "load_s"} <= set(data["measured"])
    old = json.loads((OLD_REHEARSAL / "rehearsal.json").read_text())
    assert "ranges" not in old  # the older format, as written
    console = Console(width=160, record=True)
    console.print(render(old))
    console.print(render(data))
    text = console.export_text()
    assert "predicted at" in text and "wall clock on the profile's machine" in text


def test_each_depth_keeps_its_step_spread_its_load_a_layer_and_its_start() -> None:
    from cockpit.record import read_events
    from cockpit.rehearse.measure import depth_measures

    measures = depth_measures(read_events(FORECAST / "records/offload_1-16"))
    four = next(m for m in measures if m.layers == 4)
    assert four.step_sd_s is not None and 0 < four.step_sd_s < 0.05 * four.step_s
    assert four.load_layer_s is not None and 0 < four.load_layer_s * 4 < four.load_s
    assert four.start_s is not None and four.start_s > 0
    one = next(m for m in measures if m.layers == 1)
    assert one.load_layer_s is None  # one layer: no gap between two layers' progress
