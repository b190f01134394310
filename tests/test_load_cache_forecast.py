"""The plan and the forecast know the NF4 cache: a second run's load reads the packed model's bytes at the
assumed disk rate, with at most the first load's work (`cockpit.plan.load_read`,
`cockpit.rehearse.forecast.cached_load`), checked against the H200 measurement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from benchmarks.forecast_consistency import CONFIGS, measures_of, scaling, story
from benchmarks.load_cache_model import check, rehearsed_work, slice_bytes
from benchmarks.story_forecast import load_split
from cockpit.plan import build_plan
from cockpit.plan.render import render as render_plan
from cockpit.profiles import load_profile
from cockpit.rehearse.forecast import forecast
from cockpit.rehearse.render import wall_lines
from cockpit.units import hours

STORY = "qwen3-235b-a22b-thinking-4xh100"
ROOT = Path(__file__).resolve().parent.parent


def _text(renderable) -> str:
    console = Console(record=True, width=400)
    console.print(renderable)
    return console.export_text()


@pytest.fixture(scope="module")
def offload():
    overrides, records, _ = CONFIGS["offload"]
    profile, plan = story(overrides)
    measures = [m for _, m in sorted(measures_of(records).items())]
    return plan, forecast(measures, profile, plan, scaling())


def test_plan_cache_is_the_stored_bytes_at_the_disk_rate():
    profile, _ = load_profile(STORY, [])
    plan = build_plan(profile)
    w, load = plan.inputs.weights, plan.load
    assert load is not None and load.cache_bytes == w.stored_bytes == w.data_bytes + w.state_bytes
    assert load.checkpoint_bytes == w.checkpoint_bytes
    assert load.cache_s == pytest.approx(w.stored_bytes / (plan.inputs.assumptions.disk_gbps * 1e9))
    assert load.cache_bytes / load.checkpoint_bytes < 0.3  # NF4: a quarter and its scales
    d = plan.to_dict()
    assert d["load"]["cache_bytes"] == w.stored_bytes and d["disk"]["nf4_cache"] == w.stored_bytes
    text = _text(render_plan(plan))
    line = next(x for x in text.splitlines() if x.strip().startswith("load "))
    assert "NF4 cache: 123.2 GB" in line and "123.2 GB of disk" in line


def test_plan_says_why_no_cache_is_kept():
    profile, _ = load_profile(STORY, ["quantization.cache=false"])
    plan = build_plan(profile)
    assert plan.load is not None and plan.load.cache_bytes == 0 and plan.load.cache_s is None
    assert "no NF4 cache (quantization.cache = false)" in plan.load.words()
    assert plan.to_dict()["disk"]["nf4_cache"] == 0


def test_forecast_cached_load_reads_the_packed_bytes(offload):
    plan, f = offload
    rate = f.scaling.disk_gbps * 1e9
    cache, checkpoint = plan["load"]["cache_bytes"], plan["weights_bytes"]["checkpoint"]
    assert cache == plan["weights_bytes"]["stored"]
    work = f.target["load_s"]
    w, r = f.wall, f.ranges["wall"]
    assert w["load_cached_s"] == pytest.approx(cache / rate + work)
    assert r["load_cached_s"][0] == pytest.approx(cache / rate)  # the read alone: no work at all
    assert r["load_cached_s"][1] >= w["load_cached_s"]
    # shorter than the first load by the bytes it does not read: at least checkpoint x (1 - the ratio)
    assert w["load_s"] - w["load_cached_s"] == pytest.approx((checkpoint - cache) / rate)
    assert (w["load_cached_s"] - work) / (w["load_s"] - work) == pytest.approx(cache / checkpoint)
    assert w["total_cached_s"] == pytest.approx(w["total_s"] - w["load_s"] + w["load_cached_s"])
    assert w["total_cached_s"] < w["total_s"]  # the whole run stays the first run's


def test_forecast_json_and_text_carry_the_cached_load(offload):
    plan, f = offload
    data = json.loads(json.dumps(f.to_dict()))
    assert data["wall"]["load_cached_s"] == pytest.approx(f.wall["load_cached_s"])
    assert data["load_cache"]["cache_bytes"] == plan["load"]["cache_bytes"]
    assert data["load_cache"]["work_bound_s"] == pytest.approx(f.target["load_s"])
    assert any(a.startswith("NF4 cache") for a in data["assumptions"])
    line = next(x for x in wall_lines(data) if x.startswith("a second run"))
    assert hours(f.wall["total_cached_s"]) in line and "123.2 GB" in line


def test_forecast_without_a_cache_says_none(offload):
    plan, _ = offload
    overrides, records, _ = CONFIGS["offload"]
    profile, _ = story(overrides)
    no_cache = {**plan, "load": {**plan["load"], "cache_bytes": 0}}
    f = forecast(list(measures_of(records).values()), profile, no_cache, scaling())
    data = f.to_dict()
    assert "load_cached_s" not in data["wall"] and data["load_cache"] is None
    assert not any(x.startswith("a second run") for x in wall_lines(data))


def test_load_split_bounds_quantization_by_the_load_without_offload():
    def side(work: float) -> dict:
        return {
            "forecast": {
                "target": {"load_s": work},
                "wall": {"load_s": work + 235},
                "load_cache": {"read_s": 62},
            }
        }

    split = load_split({"offload": side(100.0), "none": side(10.0)})
    assert split["quantize_at_most_s"] == 10.0 and split["placement_at_least_s"] == 90.0
    assert split["cached_load_s"] == [152.0, 162.0]
    assert load_split({"offload": side(100.0)}) is None


def test_cached_load_model_against_the_h200():
    """The model (the plan's bytes at 2 GB/s plus 0 to the rehearsal's work) against load_cache_h200.json:
    bytes and the range out of sample, the bound from the first load's rate in sample."""
    measured = json.loads((ROOT / "benchmarks/results/load_cache_h200.json").read_text())
    checkpoint, cache, disk = slice_bytes(measured["profile"], measured["layers"])
    assert checkpoint == measured["checkpoint_bytes"]
    work = rehearsed_work(measured["layers"])  # the slice's load without offload (records none_1-16)
    assert work is not None
    r = check(measured, checkpoint, cache, disk, work)
    assert abs(r["bytes_error"]) < 1e-4  # the cache's file headers only
    assert r["cached_in_range"] and r["cached_within_bound"]
    assert r["time_ratio"] <= r["byte_ratio"]  # the measured second load at least as short as its bytes


def test_the_profiles_disk_rate_times_the_reads():
    """`hardware.disk_gbps` sets the plan's read rate, and a rehearsal's target carries it to the forecast
    (a record written before the field: the assumed default)."""
    from cockpit.plan.inputs import Assumptions
    from cockpit.rehearse.run import scaling_for

    profile, _ = load_profile(STORY, ["hardware.disk_gbps=6"])
    plan = build_plan(profile)
    assert plan.inputs.assumptions.disk_gbps == 6.0
    assert plan.load.checkpoint_s == pytest.approx(plan.load.checkpoint_bytes / 6e9)
    assert "at 6 GB/s" in plan.load.words()
    target = {"target": profile.hardware.model_dump()}
    assert scaling_for({"rehearsal": target}, 1).disk_gbps == 6.0
    assert scaling_for({"rehearsal": {"target": {"gpus": 4}}}, 1).disk_gbps == Assumptions().disk_gbps
