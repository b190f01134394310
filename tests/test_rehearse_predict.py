"""Rehearsal figures: per-depth measures from events, linear fits over depth, the forecast and its flags."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cockpit.contract import GATHERED_BEYOND_PREFETCH
from cockpit.profiles import load_profile
from cockpit.rehearse.figures import Terms, copy_per_layer_s, default_depths, fit_all, terms_for
from cockpit.rehearse.fit import fit
from cockpit.rehearse.forecast import Scaling, disagreements, forecast
from cockpit.rehearse.measure import BEGIN, END, DepthMeasure, depth_measures

GIB_MIB = 1024.0


def _depth_events(t: float, layers: int, steps: int, offset: int, status: str = "ok") -> list[dict]:
    """A depth whose costs are linear in `layers`: GPU 2 + 1.5 L GiB, RSS 3 + 0.5 L, step 0.1 + 0.05 L s."""
    events = [{"t": t, "kind": BEGIN, "layers": layers, "step_offset": offset, "steps": steps}]
    for rank in (0, 1):
        events += [
            {"t": t + 1, "kind": "loaded", "rank": rank, "load_s": 4 + 2 * layers},
            {"t": t + 2, "kind": "train_begin", "rank": rank, "world_size": 2, "start_step": offset},
            {
                "t": t + 2,
                "kind": "load_peak",
                "rank": rank,
                "cuda_peak_alloc_mib": (1 + layers) * GIB_MIB,
                "rss_peak_mib": (3 + layers) * GIB_MIB,
            },
        ]
        for s in range(1, steps + 1):
            slow = 5.0 if s == 1 else 1.0  # a slow first step: the warm-up the median leaves out
            events.append(
                {
                    "t": t + 2 + s,
                    "kind": "step",
                    "rank": rank,
                    "step": offset + s,
                    "step_time_s": slow * (0.1 + 0.05 * layers),
                    "tokens": 4096,
                    "cuda_peak_alloc_mib": (2 + 1.5 * layers + 0.01 * rank) * GIB_MIB,
                    "rss_mib": (3 + 0.5 * layers) * GIB_MIB,
                }
            )
    events.append({"t": t + 3 + steps, "kind": "checkpoint", "rank": 0, "save_s": 1 + 0.5 * layers})
    events.append({"t": t + 4 + steps, "kind": END, "layers": layers, "status": status})
    return events


def test_depths_are_measured_from_their_brackets() -> None:
    events = _depth_events(0, 1, 6, 0) + _depth_events(100, 2, 6, 6)
    measures = depth_measures(events)
    assert [m.layers for m in measures] == [1, 2]
    one, two = measures
    assert one.complete and two.complete
    assert one.ranks == 2
    assert one.step_s == pytest.approx(0.15)
    assert two.step_s == pytest.approx(0.2)
    assert two.peak("gpu_train") == pytest.approx(5.01)
    assert two.gpu_train_gib[0] == pytest.approx(5.0)
    assert one.peak("rss_load") == pytest.approx(4.0)
    assert two.load_s == 8 and two.save_s == 2.0
    assert DepthMeasure.from_dict(two.to_dict()) == two


def test_a_stopped_rehearsal_keeps_the_depths_already_measured() -> None:
    events = _depth_events(0, 1, 6, 0) + _depth_events(100, 2, 6, 6)
    events += [{"t": 300, "kind": BEGIN, "layers": 4}, {"t": 301, "kind": "loaded", "rank": 0, "load_s": 9}]
    events += [{"t": 302, "kind": END, "layers": 4, "status": "stopped"}]
    measures = depth_measures(events)
    assert [(m.layers, m.complete) for m in measures] == [(1, True), (2, True), (4, False)]
    assert measures[2].status == "stopped"


def test_fit_is_exact_on_linear_costs_and_refuses_one_depth() -> None:
    line = fit([(1, 0.15), (2, 0.2), (4, 0.3)])
    assert line is not None
    assert line.fixed == pytest.approx(0.1) and line.per_layer == pytest.approx(0.05)
    assert line.at(94) == pytest.approx(4.8)
    assert fit([(2, 1.0), (2, 1.1)]) is None


def _plan(layers: int) -> dict:
    layer = 2 * 1024**3
    return {
        "model": {"layers": layers},
        "zero3": {
            "blocks": {**{f"layer.{i}": layer for i in range(layers)}, "embed": 1024**3, "lm_head": 1024**3}
        },
        "weights_bytes": {"checkpoint": 0},
        "configured": {
            "load": {"gpu_peak": 10 * 1024**3, "rss_peak": 20 * 1024**3, "host_peak": 40 * 1024**3},
            "train": {"gpu_peak": 100 * 1024**3, "rss_peak": 20 * 1024**3, "host_peak": 40 * 1024**3},
            "step_s": 1.0,
            "tokens_per_s": 1000.0,
        },
    }


def _scaling(target_gpus: int) -> Scaling:
    return Scaling(2, "NVIDIA H200", target_gpus, "H100-80GB", 80, 960, 1.0, 55, 55, 150, 2.0)


def test_forecast_reads_the_fit_at_full_depth_and_partitions_weights() -> None:
    profile, _ = load_profile(
        "tiny-cpu", ['deepspeed.offload_param="none"', 'deepspeed.offload_optimizer="none"']
    )
    measures = depth_measures(_depth_events(0, 1, 6, 0) + _depth_events(100, 2, 6, 6))
    same = forecast(measures, profile, _plan(10), _scaling(2))
    assert same.here["gpu_train"] == pytest.approx(2.01 + 1.5 * 10)
    assert same.target["gpu_train"] == pytest.approx(same.here["gpu_train"])
    assert same.here["step_s"] == pytest.approx(0.1 + 0.05 * 10)
    more = forecast(measures, profile, _plan(10), _scaling(4))
    weights_gib = 2 * 10 + 2  # ten 2-GiB layers, embeddings and head
    assert more.target["gpu_train"] == pytest.approx(same.here["gpu_train"] - weights_gib * (1 / 2 - 1 / 4))
    # the 4,096 tokens a step are both measured ranks': 2,048 a rank, on four ranks
    assert more.target["tokens_per_s"] == pytest.approx(4096 / 2 * 4 / more.target["step_s"])


def test_two_nodes_count_every_rank_but_host_ram_is_a_nodes() -> None:
    """Two nodes of 4 GPUs: weights partition over 8 ranks, the steps' gathers cross the network too, and
    host RAM is one node's 4 ranks."""
    profile, _ = load_profile("tiny-cpu", ['deepspeed.offload_param="none"'])
    measures = depth_measures(_depth_events(0, 1, 6, 0) + _depth_events(100, 2, 6, 6))
    one = forecast(measures, profile, _plan(10), _scaling(4))
    two = forecast(measures, profile, _plan(10), replace(_scaling(8), target_nodes=2, internode_gbps=50.0))
    weights_gib = 2 * 10 + 2
    assert two.target["gpu_train"] == pytest.approx(one.target["gpu_train"] - weights_gib * (1 / 4 - 1 / 8))
    rss = max(v for v in (two.target["rss_load"], two.target["rss_train"]) if v is not None)
    assert two.target["host_gib"] == pytest.approx(rss * 4)
    assert two.scaling.target_machine == "2 nodes x 4 x H100-80GB"
    assert any("between nodes: 50 GB/s" in line for line in two.scaling.lines())


def test_disagreements_name_the_figure_and_which_is_measured() -> None:
    flags = disagreements({"step_s": 1.0, "gpu_train": 50.0}, {"step_s": 1.1, "gpu_train": 80.0})
    assert len(flags) == 1
    assert "GPU peak in training" in flags[0] and "+60%" in flags[0] and "measured" in flags[0]


def test_a_slope_below_zero_reads_as_flat_at_the_largest_depth_measured() -> None:
    line = fit([(1, 8.0), (2, 7.5)])
    assert line is not None
    assert line.per_layer == 0.0 and line.at(94) == pytest.approx(8.0)


def _offload_profile(prefetch: float = 1.0, grad_accum: int = 2):
    profile, _ = load_profile(
        "tiny-cpu",
        [
            'deepspeed.offload_param="cpu"',
            'deepspeed.offload_optimizer="cpu"',
            f"deepspeed.prefetch_layers={prefetch}",
            f"training.grad_accum={grad_accum}",
        ],
    )
    return profile


def _steps(
    depths: list[int], fixed: float, extra: float, per_layer: float, window: int
) -> list[DepthMeasure]:
    """Depths whose step costs `per_layer` a layer, and `extra` more for each layer inside the window
    (its copy partly exposed while the prefetch fills)."""
    out = []
    for d in depths:
        step = fixed + per_layer * d + extra * min(d, window)
        out.append(DepthMeasure(layers=d, status="ok", step_s=step, steps_timed=6, rss_train_gib={0: 1.0}))
    return out


def _terms(profile, layers: int = 10, layer_bytes: float = 2 * 1024**3, ranks: int = 1) -> Terms:
    return terms_for(profile, _plan(layers), layers, layer_bytes, ranks, 55.0)


def test_a_layer_copy_is_its_two_crossings_a_micro_batch_over_the_link() -> None:
    profile = _offload_profile(prefetch=1.0, grad_accum=2)
    assert copy_per_layer_s(profile, 1.1e9, 1, 55.0) == pytest.approx(2 * 2 * 1.1e9 / 55e9)
    assert copy_per_layer_s(profile, 1.1e9, 2, 55.0) == pytest.approx(2 * 1.1e9 / 55e9)
    terms = _terms(profile)
    assert terms.window == 2 and terms.knee == 2 + GATHERED_BEYOND_PREFETCH


def test_offload_depths_past_the_window_are_read_directly_and_bound_compute() -> None:
    """Copy-bound past the window (the deep slope is the link's and a little): the line past it is read
    there, and its slope is compute's upper bound, so a target with a faster link is not assumed faster."""
    profile = _offload_profile()
    plan = _plan(10)
    copy = copy_per_layer_s(profile, 2 * 1024**3, 1, 55.0)
    deep = 1.05 * copy
    measures = _steps([1, 2, 4, 6], 0.1, 0.05, deep, 2)
    model = fit_all(measures, _terms(profile))["step_s"]
    assert model.says and model.per_layer == pytest.approx(deep)
    assert model.at(8) == pytest.approx(0.1 + 0.05 * 2 + deep * 8)
    faster_link = Scaling(1, "NVIDIA H200", 1, "H200", 141, 960, 1.0, 55, 110, 150, 2)
    f = forecast(measures, profile, plan, faster_link)
    assert f.target["step_s"] == pytest.approx(f.here["step_s"])


def test_a_rehearsal_on_the_target_itself_predicts_its_own_line() -> None:
    """Nothing changes from the measuring machine to the target (two ranks each, the same GPUs and links,
    the embeddings crossing the link, a negative intercept past the window): the target is the line as
    measured."""
    profile, _ = load_profile(
        "tiny-cpu",
        [
            'deepspeed.offload_param="cpu"',
            'deepspeed.offload_optimizer="cpu"',
            "deepspeed.prefetch_layers=1",
            "deepspeed.embeddings_on_gpu=false",
            "training.grad_accum=2",
            "hardware.gpus=2",
        ],
    )
    plan = _plan(10)
    same = Scaling(2, "NVIDIA H200", 2, "H200", 141, 960, 1.0, 55, 55, 150, 2)
    deep = [
        DepthMeasure(layers=d, status="ok", step_s=0.5 * d - 0.7, steps_timed=6, rss_train_gib={0: 1.0})
        for d in (2, 4, 6)
    ]  # the intercept below zero
    g = forecast(deep, profile, plan, same)
    assert g.fits["step_s"].fixed < 0
    assert g.target["step_s"] == pytest.approx(g.here["step_s"]) == pytest.approx(g.fits["step_s"].at(10))


def test_a_compute_bound_slope_past_the_window_is_computes_own() -> None:
    """Past the window a slope well above the copy is compute's, and the target scales it."""
    profile = _offload_profile()
    plan = _plan(10)  # layers of 2 GiB
    copy = copy_per_layer_s(profile, 2 * 1024**3, 1, 55.0)
    measures = _steps([1, 2, 4, 6], 0.1, 0.04, 0.2, 2)
    model = fit_all(measures, _terms(profile))["step_s"]
    assert copy < 0.2 / 1.15
    assert model.per_layer == pytest.approx(0.2)

    def scaled(ratio: float) -> float:
        machine = Scaling(1, "NVIDIA H200", 1, "H200", 141, 960, ratio, 55, 55, 150, 2)
        f = forecast(measures, profile, plan, machine)
        assert any("0.200 s a further layer here, the line of the depths at or past" in n for n in f.notes)
        if ratio == 1.0:
            assert f.target["step_s"] == pytest.approx(f.here["step_s"])  # the same machine: as measured
        return f.target["step_s"]

    # compute twice as fast: a layer now costs its copy (0.156 s), longer than its compute (0.1 s); the
    # fixed part's compute halves too (the embeddings and head are no larger than a layer: no copies of
    # theirs)
    expected = model.fixed * 0.5 + 10 * max(copy, 0.1)
    assert scaled(0.5) == pytest.approx(expected)
    assert scaled(0.5) < scaled(1.0)


def test_default_depths_reach_two_past_every_knee() -> None:
    # window 4 and the gathered layers' knee 6: doublings until two depths are at or past 6
    assert default_depths(_offload_profile(prefetch=3.0), 94) == [1, 2, 4, 8, 16]
    assert default_depths(_offload_profile(prefetch=1.0), 94) == [1, 2, 4, 8]  # window 2, knee 4
    assert default_depths(_offload_profile(prefetch=3.0), 6) == [1, 2, 4]  # no deeper than the model
    none, _ = load_profile("tiny-cpu", ['deepspeed.offload_param="none"', "deepspeed.prefetch_layers=3"])
    assert default_depths(none, 94) == [1, 2, 4]
    story, _ = load_profile("qwen3-235b-a22b-thinking-4xh100")
    assert default_depths(story, 94) == [1, 2, 4, 8, 16]


def test_nothing_overlaps_without_offload_or_prefetch() -> None:
    assert _terms(_offload_profile(prefetch=0.0)).window is None
    none, _ = load_profile("tiny-cpu", ['deepspeed.offload_param="none"'])
    assert _terms(none).window is None and copy_per_layer_s(none, 1e9, 1, 55.0) == 0.0


def test_an_offloaded_step_scales_by_its_parts() -> None:
    """Same machine: the target is the line read at full depth. Four ranks: each copies a quarter of a
    layer and all-gathers the rest, and compute stays; every layer the longer of transfer and compute."""
    profile = _offload_profile()
    plan = _plan(10)
    layer, other = 2 * 1024**3, 2 * 1024**3
    copy = copy_per_layer_s(profile, layer, 1, 55.0)
    other_s = 2 * (other - layer + 1024**3 * 0) / 55e9  # embeddings and head beyond one layer's bytes
    measures = _steps([2, 4, 6], 0.3, 0.0, 0.05 + copy, 2)  # a slope above the copy: compute-bound
    one = forecast(
        measures, profile, plan, Scaling(1, "NVIDIA H200", 1, "H200", 141, 960, 1.0, 55, 55, 150, 2)
    )
    assert one.target["step_s"] == pytest.approx(one.here["step_s"])
    assert one.here["step_s"] == pytest.approx(0.3 + 10 * (0.05 + copy))
    four = forecast(
        measures, profile, plan, Scaling(1, "NVIDIA H200", 4, "H200", 141, 960, 1.0, 55, 55, 150, 2)
    )
    gather = 2 * 2 * layer * 3 / 4 / 150e9
    move = copy / 4 + gather
    compute = 0.05 + copy
    fixed = (0.3 - other_s) + other_s / 4 + 2 * (other - layer) * 3 / 4 / 150e9
    assert four.target["step_s"] == pytest.approx(fixed + 10 * max(move, compute))


def test_the_wall_clock_counts_the_validation_passes() -> None:
    """Forward-only passes over the validation sample at the first step, every `eval_steps` and the
    last, each micro-batch a share of the target's micro-batch step: in the wall clock and its total."""
    from cockpit.plan.run_length import data_size, run_steps
    from cockpit.plan.validation_time import validation_passes, validation_time
    from cockpit.rehearse.render import wall_lines

    assumed = ["data.examples=2000", "data.mean_tokens=150", "validation.eval_steps=20"]
    profile, _ = load_profile("tiny-cpu", ['deepspeed.offload_param="none"', *assumed])
    measures = depth_measures(_depth_events(0, 1, 6, 0) + _depth_events(100, 2, 6, 6))
    f = forecast(measures, profile, _plan(10), _scaling(4))
    w = f.wall
    steps, _ = run_steps(profile, data_size(profile), 4)
    assert w["validations"] == validation_passes(steps, 20) > 2
    expected = validation_time(profile, steps, 4, f.target["step_s"] / profile.training.grad_accum)
    assert w["validation_s"] == pytest.approx(expected.total_s) and w["validation_s"] > 0
    parts = ("load_s", "start_s", "train_s", "save_s", "validation_s", "eval_s")
    assert w["total_s"] == pytest.approx(sum(w[k] for k in parts))
    # the training run alone (its load included): the total less the evaluation (none timed on the CPU),
    # said beside the whole run where there is an evaluation
    assert w["without_eval_s"] == pytest.approx(w["total_s"] - w["eval_s"])
    lo, hi = f.ranges["wall"]["without_eval_s"]
    assert lo <= w["without_eval_s"] <= hi
    alone = f"a first run {w['without_eval_s'] / 3600:.2f} h ({lo / 3600:.2f}-{hi / 3600:.2f} h)"
    assert not any("evaluation apart" in line for line in wall_lines(f.to_dict()))
    evaluated = f.to_dict()
    evaluated["wall"]["eval_s"] = 600.0
    assert any(alone in line for line in wall_lines(evaluated))
    assert any(
        n.startswith("validation loss (not rehearsed): ") and "of a micro-batch step" in n for n in f.notes
    )
    assert (
        f"{w['validations']:.0f} validations {w['validation_s'] / 3600:.2f} h + evaluation"
        in wall_lines(f.to_dict())[0]
    )
    off, _ = load_profile(
        "tiny-cpu", ['deepspeed.offload_param="none"', *assumed[:2], "validation.eval_steps=0"]
    )
    none = forecast(measures, off, _plan(10), _scaling(4)).wall
    assert (none["validations"], none["validation_s"]) == (0.0, 0.0)
    assert none["total_s"] == pytest.approx(w["total_s"] - w["validation_s"])


def _validated(events: list[dict], layers: int) -> list[dict]:
    """A depth's events with its validation forwards timed before its end: 0.04 + 0.02 L s a forward."""
    timed = {"t": events[-1]["t"], "kind": "rehearse_validation", "rank": 0, "layers": layers, "forwards": 3}
    return [*events[:-1], {**timed, "forward_s": 0.04 + 0.02 * layers, "first_s": 1.0}, events[-1]]


def test_rehearsed_validation_forwards_set_the_validation_passes() -> None:
    """Where the depths timed a validation forward, its line at full depth, scaled as the step is, sets
    each pass (the forwards a rank runs): not a share of the step. Older records keep the share."""
    from cockpit.plan.run_length import data_size, run_steps
    from cockpit.plan.validation_time import validation_time
    from cockpit.rehearse.render import depths_table

    assumed = ["data.examples=2000", "data.mean_tokens=150", "validation.eval_steps=20"]
    profile, _ = load_profile("tiny-cpu", ['deepspeed.offload_param="none"', *assumed])
    events = _validated(_depth_events(0, 1, 6, 0), 1) + _validated(_depth_events(100, 2, 6, 6), 2)
    measures = depth_measures(events)
    assert [m.validation_s for m in measures] == pytest.approx([0.06, 0.08])
    assert DepthMeasure.from_dict(measures[1].to_dict()) == measures[1]
    f = forecast(measures, profile, _plan(10), _scaling(4))
    assert f.measured("validation_s") and f.here["validation_s"] == pytest.approx(0.04 + 0.02 * 10)
    forward = f.here["validation_s"] * f.target["step_s"] / f.here["step_s"]
    assert f.target["validation_s"] == pytest.approx(forward)
    steps, _ = run_steps(profile, data_size(profile), 4)
    shared = validation_time(profile, steps, 4, f.target["step_s"] / profile.training.grad_accum)
    assert shared is not None and shared.rounds >= 1
    assert f.wall["validation_s"] == pytest.approx(shared.passes * shared.rounds * forward)
    assert f.wall["validation_s"] != pytest.approx(shared.total_s)
    assert any(n.startswith("validation loss (rehearsed): ") for n in f.notes)
    lo, hi = f.ranges["target"]["validation_s"]
    assert lo < forward < hi
    wall_lo, wall_hi = f.ranges["wall"]["validation_s"]
    assert wall_lo == pytest.approx(f.wall["validation_s"] * lo / forward)
    assert wall_hi == pytest.approx(f.wall["validation_s"] * hi / forward)
    # a record without the timed forwards: the plan's forward (0.4 s), scaled to the rehearsed step
    planned = {**_plan(10), "run": {"validation": {"pass_s": 1.2, "rounds": 3}, "optimizer_step_s": 2.0}}
    unvalidated = depth_measures(_depth_events(0, 1, 6, 0) + _depth_events(100, 2, 6, 6))
    old = forecast(unvalidated, profile, planned, _scaling(4))
    assert old.plan["validation_s"] == pytest.approx(0.4) and old.target["validation_s"] is None
    scaled = 0.4 * old.target["step_s"] / 2.0
    assert old.wall["validation_s"] == pytest.approx(shared.passes * shared.rounds * scaled)
    said = [n for n in old.notes if n.startswith("validation loss (not rehearsed): ")]
    assert len(said) == 1 and "the plan's 0.40 s a forward" in said[0]
    cells = [list(c.cells) for c in depths_table(f.to_dict()).columns if c.header == "validation fwd s"]
    assert cells == [["0.060", "0.080"]]
    bare = forecast(unvalidated, profile, _plan(10), _scaling(4))  # no plan of it: a share of the step
    assert bare.target["validation_s"] is None and bare.wall["validation_s"] == pytest.approx(shared.total_s)


def test_what_the_measured_ranks_gathered_is_fitted_out_and_the_targets_added() -> None:
    """One rank without offload holds every layer whole and gathers none; four ranks gather the computing
    layer and the one prefetched behind it. The fit takes the depths as measured; the target gives back
    the partitions it no longer holds and adds the layers it gathers."""
    profile, _ = load_profile(
        "tiny-cpu",
        [
            'deepspeed.offload_param="none"',
            'deepspeed.offload_optimizer="none"',
            "deepspeed.prefetch_layers=1",
        ],
    )
    measures = depth_measures(_depth_events(0, 1, 6, 0) + _depth_events(100, 2, 6, 6))
    one = Scaling(1, "NVIDIA H200", 4, "H100-80GB", 80, 960, 1.0, 55, 55, 150, 2.0)
    result = forecast(measures, profile, _plan(10), one)
    assert result.here["gpu_train"] == pytest.approx(2.01 + 1.5 * 10)  # the depths' own line
    weights_gib, layer_gib = 2 * 10 + 2, 2
    gathered = 2 * layer_gib  # the computing layer and one prefetched, whole on each of the four
    assert result.target["gpu_train"] == pytest.approx(
        result.here["gpu_train"] - weights_gib * (1 - 1 / 4) + gathered
    )


def test_a_forecast_from_depths_inside_the_window_says_to_measure_past_it() -> None:
    """Depths 1 and 2 of a profile prefetching 1 layer (window 2, one inside it): the step past the window
    is bounded, not measured, and the forecast says which depths would measure it."""
    profile = _offload_profile()
    plan = _plan(10)
    one_rank = Scaling(1, "NVIDIA H200", 4, "H100-80GB", 80, 960, 1.0, 55, 55, 150, 2)
    inside = forecast(_steps([1, 2], 0.1, 0.05, 0.2, 2), profile, plan, one_rank)
    assert not inside.measured("step_s")
    assert any(
        "only one depth at or past the prefetch window (2 layers)" in n and "--layers 1,2,4" in n
        for n in inside.notes
    )
    past = forecast(_steps([1, 2, 4], 0.1, 0.05, 0.2, 2), profile, plan, one_rank)
    assert past.measured("step_s")
    assert not any("prefetch window" in n and "--layers" in n for n in past.notes)
