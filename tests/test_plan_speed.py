"""The planner's measured step-time model: the fit recovers known costs, and its constants are the fit's."""

from __future__ import annotations

import json

import pytest

from cockpit.plan.speed import STORY_SLICE, MeasuredSpeed, fit_speed


def test_fit_recovers_known_costs():
    truth = MeasuredSpeed("GPU", 800.0, 0.03, 0.02, 0.6, 0.0, "")
    rows = [(layers, tf * 1e12, 0.0) for layers, tf in [(1, 10), (2, 16), (4, 7), (4, 70), (3, 40)]]
    rows = [(layers, flops, truth.compute_s(layers, flops, 800.0)) for layers, flops, _ in rows]
    got = fit_speed(rows, "GPU", 800.0, "synthetic")
    assert got.fixed_s == pytest.approx(0.03, rel=1e-6)
    assert got.layer_s == pytest.approx(0.02, rel=1e-6)
    assert got.efficiency == pytest.approx(0.6, rel=1e-6)


def test_fit_refuses_rows_that_cannot_separate_the_costs():
    with pytest.raises(ValueError):
        fit_speed([(4, 1e12, 0.1), (4, 1e12, 0.1), (4, 1e12, 0.1)], "GPU", 800.0, "")
    with pytest.raises(ValueError):
        fit_speed([(1, 1e12, 0.1)], "GPU", 800.0, "")


def test_planner_constants_are_the_committed_fit():
    """cockpit/plan/speed.py's constants equal benchmarks/fit_speed.py over the committed results."""
    from benchmarks import fit_speed as script

    speed, table = script.fit(json.loads(script.RESULTS.read_text()))
    for field in ("fixed_s", "layer_s", "efficiency", "copy_factor"):
        assert getattr(STORY_SLICE, field) == pytest.approx(getattr(speed, field), abs=1e-5), field
    assert STORY_SLICE.measured_tflops == speed.measured_tflops
    assert {t["sample"] for t in table} == {"in (fitted)", "out"}
