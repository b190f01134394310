"""Evaluation in the rehearsal's forecast: timings read per depth, each a line over depth, scaled to the
target (decode by HBM bandwidth, prefill and scoring by the bf16 rate), counted into the wall clock with
its range and its share named; the plan's modelled term where no depth timed it; serving priced."""

from __future__ import annotations

import math

import pytest

from cockpit.contract import EVAL_BATCH_SIZE, LABEL_TOKENS, SCORE_LOGITS, SCORE_TOKENS
from cockpit.data.tenants import TENANTS
from cockpit.plan.eval_time import GRAPH_BLOCK_S
from cockpit.profiles import load_profile
from cockpit.rehearse.evaluation import fit_eval, forecast_eval
from cockpit.rehearse.forecast import Scaling, forecast
from cockpit.rehearse.measure import BEGIN, END, EVAL, depth_measures
from cockpit.rehearse.render import wall_lines
from cockpit.rehearse.serving import serving, serving_lines

PROMPT = 100
# Linear costs a depth: (fixed, per layer)
PREFILL, DECODE, SCORE = (0.2, 0.03), (0.04, 0.002), (0.5, 0.1)
SINGLE_PREFILL, SINGLE_DECODE = (0.01, 0.001), (0.03, 0.0005)


def _eval_event(t: float, layers: int) -> dict:
    def at(cost: tuple[float, float]) -> float:
        return cost[0] + cost[1] * layers

    return {
        "t": t,
        "kind": EVAL,
        "rank": 0,
        "layers": layers,
        "batch": EVAL_BATCH_SIZE,
        "prompt_tokens": PROMPT,
        "new_tokens": 32,
        "repeats": 2,
        "prefill_s": at(PREFILL),
        "decode_step_s": at(DECODE),
        "score_s": at(SCORE),
        "single_prefill_s": at(SINGLE_PREFILL),
        "single_decode_step_s": at(SINGLE_DECODE),
    }


def _depth(t: float, layers: int, offset: int, timed: bool = True) -> list[dict]:
    """A depth of 6 steps (0.1 + 0.05 L s) and, where `timed`, its evaluation timed after them."""
    events = [{"t": t, "kind": BEGIN, "layers": layers, "steps": 6, "step_offset": offset}]
    events += [
        {"t": t + 1, "kind": "loaded", "rank": 0, "load_s": 2.0 + layers},
        {"t": t + 2, "kind": "train_begin", "rank": 0, "world_size": 1, "start_step": offset},
        {"t": t + 2, "kind": "load_peak", "rank": 0, "cuda_peak_alloc_mib": 1024.0, "rss_peak_mib": 2048.0},
    ]
    for s in range(1, 7):
        step = {"t": t + 2 + s, "kind": "step", "rank": 0, "step": offset + s, "tokens": 4096}
        events.append({**step, "step_time_s": 0.1 + 0.05 * layers, "rss_mib": 2048.0})
    if timed:
        events.append(_eval_event(t + 20, layers))
    events.append({"t": t + 30, "kind": END, "layers": layers, "status": "ok"})
    return events


def _measures(timed: bool = True):
    return depth_measures(_depth(0, 2, 0, timed) + _depth(100, 8, 6, timed))


def _plan(layers: int, evaluation: dict | None = None) -> dict:
    layer = 1024**3
    return {
        "model": {"layers": layers},
        "zero3": {"blocks": {**{f"layer.{i}": layer for i in range(layers)}, "embed": layer}},
        "weights_bytes": {"checkpoint": 0},
        "configured": {"step_s": 1.0, "tokens_per_s": 1000.0},
        "run": {"evaluation": evaluation},
    }


def _scaling(
    here: str = "NVIDIA H200", there: str = "H100-80GB", compute: float = 1.0, gpus: int = 1
) -> Scaling:
    """One GPU measured, `gpus` of `there` targeted (over several, a decode step replays a graph on each)."""
    return Scaling(1, here, gpus, there, 80, 960, compute, 55, 55, 150, 2.0)


def _profile():
    sets = ['deepspeed.offload_param="none"', 'deepspeed.offload_optimizer="none"']
    profile, _ = load_profile("tiny-cpu", [*sets, "data.examples=2000", "data.mean_tokens=150"])
    return profile  # its run's length assumed (the built-in data is counted where it is built)


def test_each_depths_timings_are_read_and_fitted_as_lines() -> None:
    measures = _measures()
    assert [m.eval["decode_step_s"] for m in measures] == pytest.approx([0.044, 0.056])
    fits = fit_eval(measures)
    for key, (fixed, per_layer) in {
        "prefill_s": PREFILL,
        "decode_step_s": DECODE,
        "score_s": SCORE,
        "single_decode_step_s": SINGLE_DECODE,
    }.items():
        assert fits[key].fixed == pytest.approx(fixed) and fits[key].per_layer == pytest.approx(per_layer)
        assert fits[key].at(16) == pytest.approx(fixed + per_layer * 16)  # out of sample, on the line
    assert fit_eval(_measures(timed=False))["decode_step_s"] is None  # no depth timed it: no line


def test_decode_scales_by_hbm_bandwidth_and_forwards_by_the_bf16_rate() -> None:
    """H200 to H100: a decode step's layers take 4800/3350 as long, its fixed part as long as measured;
    the prefill and a scoring forward scale whole by the bf16 rates' ratio; nothing divides by the GPUs."""
    full = 40
    ev = forecast_eval(_measures(), _profile(), full, _scaling(compute=2.0, gpus=4), _plan(full), None)
    assert ev.measured
    spread = GRAPH_BLOCK_S * 3  # over 4 GPUs, a graph replayed on each: 3 past the first
    assert ev.target["decode_step_s"] == pytest.approx(DECODE[0] + DECODE[1] * full * 4800 / 3350 + spread)
    assert ev.target["prefill_s"] == pytest.approx((PREFILL[0] + PREFILL[1] * full) * 2.0)
    assert ev.target["score_s"] == pytest.approx((SCORE[0] + SCORE[1] * full) * 2.0)
    same = forecast_eval(_measures(), _profile(), full, _scaling(there="NVIDIA H200"), _plan(full), None)
    assert same.target["decode_step_s"] == pytest.approx(DECODE[0] + DECODE[1] * full)  # one GPU: a graph
    assert any("HBM" in line for line in ev.assumptions)
    assert any("does not divide by the GPU count" in line for line in ev.assumptions)
    assert any("replays a CUDA graph on each" in line for line in ev.assumptions)
    assert not any("replays a CUDA graph on each" in line for line in same.assumptions)


EAGER_DECODE = (0.05, 0.0035)  # a step launched one by one: the graph's (DECODE) and more a layer


def test_over_several_gpus_the_launched_steps_timed_are_not_what_is_counted() -> None:
    """Where the depths also timed steps launched one by one (what a failed capture costs), the target's
    decode steps still gain only a graph's replay on each GPU: evaluation replays a graph a GPU."""
    events = []
    for i, n in enumerate((2, 8)):
        depth = _depth(100 * i, n, 6 * i)
        for e in depth:
            if e["kind"] == EVAL:
                e.update(eager_decode_step_s=EAGER_DECODE[0] + EAGER_DECODE[1] * n)
        events += depth
    full = 40
    ev = forecast_eval(depth_measures(events), _profile(), full, _scaling(gpus=4), _plan(full), None)
    spread = GRAPH_BLOCK_S * 3
    assert ev.target["decode_step_s"] == pytest.approx(DECODE[0] + DECODE[1] * full * 4800 / 3350 + spread)
    assert any("replays a CUDA graph on each" in line for line in ev.assumptions)


def test_evaluation_counts_both_systems_batches_thinking_and_scoring() -> None:
    """2 systems x [batches x (prefill + think tokens x decode step) + scoring forwards x a forward],
    over the built-in tenants' held-out split (5 tenants x 40, their labels)."""
    profile, full = _profile(), 40
    ev = forecast_eval(_measures(), profile, full, _scaling(there="NVIDIA H200"), _plan(full), None)
    examples = len(TENANTS) * profile.data.eval_examples_per_tenant
    labels = sum(len(t.labels) for t in TENANTS) / len(TENANTS)
    think = profile.eval.max_think_tokens
    tail = math.ceil(labels) * LABEL_TOKENS  # a row: the prefix, then its labels; kept: its tail and one
    rows = min(SCORE_TOKENS // (PROMPT + think + tail), SCORE_LOGITS // (1 + tail))
    prefill, step = PREFILL[0] + PREFILL[1] * full, DECODE[0] + DECODE[1] * full
    score = SCORE[0] + SCORE[1] * full
    batches, forwards = math.ceil(examples / EVAL_BATCH_SIZE), math.ceil(examples / rows)
    assert ev.total_s == pytest.approx(2 * (batches * (prefill + think * step) + forwards * score))
    lo, hi = ev.range_s
    assert lo < ev.total_s < hi


def test_the_forecast_total_includes_evaluation_and_names_its_share() -> None:
    profile = _profile()
    f = forecast(_measures(), profile, _plan(40), _scaling())
    w = f.wall
    assert w["eval_s"] == pytest.approx(f.evaluation.total_s) and w["eval_s"] > 0
    parts = ("load_s", "start_s", "train_s", "save_s", "validation_s", "eval_s")
    assert w["total_s"] == pytest.approx(sum(w[k] for k in parts))
    ends = tuple(sum(f.ranges["wall"][k][i] for k in parts) for i in (0, 1))
    assert f.ranges["wall"]["total_s"] == pytest.approx(ends)
    assert f.ranges["wall"]["eval_s"] == pytest.approx(f.evaluation.range_s)
    share = w["eval_s"] / w["total_s"]
    top = f.dominant()
    if top and top[0] == "evaluation":
        assert f"evaluation {share:.0%} of it" in f.summary()
    else:
        assert f", evaluation {share:.0%}" in f.summary()
    data = f.to_dict()
    assert data["evaluation"]["measured"] and data["evaluation"]["shape"]["examples"] == 200
    line = next(x for x in wall_lines(data) if x.startswith("evaluation (base and tuned"))
    assert f"{share:.0%} of the wall clock (timed on the slices, scaled)" in line


def test_without_timings_the_plans_modelled_term_stands_in_and_says_so() -> None:
    profile, untimed = _profile(), _measures(timed=False)
    modelled = {"total_s": 900.0, "range_s": [800.0, 900.0], "how": "modelled: bytes over bandwidth"}
    f = forecast(untimed, profile, _plan(40, modelled), _scaling())
    assert not f.evaluation.measured and f.wall["eval_s"] == 900.0
    assert f.ranges["wall"]["eval_s"] == (800.0, 900.0)
    assert "evaluation not rehearsed (no depth timed it), modelled: bytes over bandwidth" in f.notes
    assert f.serving is None  # nothing timed to price
    line = next(x for x in wall_lines(f.to_dict()) if x.startswith("evaluation (base and tuned"))
    assert line.endswith("(modelled, not rehearsed)")
    none = forecast(untimed, profile, _plan(40), _scaling())
    assert none.wall["eval_s"] == 0.0 and any(n.startswith("evaluation not counted") for n in none.notes)
    off = profile.model_copy(update={"eval": profile.eval.model_copy(update={"enabled": False})})
    assert forecast(_measures(), off, _plan(40), _scaling()).wall["eval_s"] == 0.0


def test_a_sample_and_a_time_budget_cut_evaluation() -> None:
    """`eval.examples` scores a sample (fewer batches and forwards); `eval.time_budget_s` caps the time."""
    profile, full = _profile(), 40
    whole = forecast_eval(_measures(), profile, full, _scaling(), _plan(full), None)
    cut = profile.model_copy(update={"eval": profile.eval.model_copy(update={"examples": 64})})
    sample = forecast_eval(_measures(), cut, full, _scaling(), _plan(full), None)
    assert sample.shape.split.examples == 64 and "a sample of 64 (eval.examples)" in sample.how
    assert sample.total_s < whole.total_s / 2
    budget = profile.model_copy(update={"eval": profile.eval.model_copy(update={"time_budget_s": 5.0})})
    capped = forecast_eval(_measures(), budget, full, _scaling(), _plan(full), None)
    assert whole.total_s > 5.0 and capped.total_s == 5.0 and "eval.time_budget_s 5 s" in capped.how


def test_serving_is_priced_from_the_same_fits() -> None:
    """A request alone: prefill + thinking at batch 1 + its row's share of a scoring forward; tokens/s
    of a thinking batch; the profile's hourly price over them, beside the API's."""
    profile, full = _profile(), 40
    ev = forecast_eval(_measures(), profile, full, _scaling(there="NVIDIA H200"), _plan(full), None)
    s = serving(ev, profile, "4 x H200")
    think = profile.eval.max_think_tokens
    single = SINGLE_PREFILL[0] + SINGLE_PREFILL[1] * full
    step1 = SINGLE_DECODE[0] + SINGLE_DECODE[1] * full
    labels = sum(len(t.labels) for t in TENANTS) / len(TENANTS)
    tail = math.ceil(labels) * LABEL_TOKENS
    rows = min(SCORE_TOKENS // (PROMPT + think + tail), SCORE_LOGITS // (1 + tail))
    answer = (SCORE[0] + SCORE[1] * full) / rows  # the request's row: its prefix and its labels
    assert s["latency_s"] == pytest.approx(single + think * step1 + answer)
    batch_s = PREFILL[0] + PREFILL[1] * full + think * (DECODE[0] + DECODE[1] * full)
    tps = EVAL_BATCH_SIZE * think / batch_s
    assert s["batch_tokens_per_s"] == pytest.approx(tps)
    usd = profile.cost.serving_hour_usd / 3600 / tps * 1e6
    assert s["usd_per_mtok"] == pytest.approx(usd)
    assert s["vs_api"] == pytest.approx(usd / profile.cost.api_usd_per_mtok)
    assert any("upper bound" in a for a in s["assumptions"])
    lines = serving_lines(s)
    assert f"${usd:,.2f} per 1M generated tokens" in lines[1] and profile.cost.api_name in lines[1]


LARGE_PREFILL, LARGE_DECODE = (0.6, 0.1), (0.06, 0.004)


def test_costs_are_read_at_the_targets_batch_between_the_batches_timed() -> None:
    """Evaluation chooses its batch from the free memory (the plan says the target's: 160 here); a depth
    timed 1, 64 and 256 prompts: the prefill and the decode step at 160 lie on the line from 64 to 256."""
    events = []
    for i, n in enumerate((2, 8)):
        depth = _depth(100 * i, n, 6 * i)
        for e in depth:
            if e["kind"] == EVAL:
                e.update(large_batch=256, large_prefill_s=LARGE_PREFILL[0] + LARGE_PREFILL[1] * n,
                         large_decode_step_s=LARGE_DECODE[0] + LARGE_DECODE[1] * n)  # fmt: skip
        events += depth
    profile, full = _profile(), 40
    plan = _plan(full, {"total_s": 1.0, "batch": 160, "how": "modelled"})
    ev = forecast_eval(depth_measures(events), profile, full, _scaling(there="NVIDIA H200"), plan, None)
    assert ev.shape.batch == 160
    share = (160 - 64) / (256 - 64)

    def between(small: tuple[float, float], large: tuple[float, float]) -> float:
        a, b = small[0] + small[1] * full, large[0] + large[1] * full
        return a + (b - a) * share

    costs = ev.costs()
    assert costs.decode_step_s == pytest.approx(between(DECODE, LARGE_DECODE))
    assert costs.prefill_s == pytest.approx(between(PREFILL, LARGE_PREFILL))
    think = profile.eval.max_think_tokens
    s = serving(ev, profile, "4 x H200")
    assert s["batch"] == 160
    batch_s = costs.prefill_s + think * costs.decode_step_s
    assert s["batch_tokens_per_s"] == pytest.approx(160 * think / batch_s)


def test_a_larger_batch_never_steps_faster_than_a_smaller_one() -> None:
    """A depth's largest batch timed a decode step below the evaluation batch's (noise behind its long
    prefill): it is read as the smaller batch's, so the batch between them costs no less, and the
    forecast says so."""
    events = []
    for i, n in enumerate((2, 8)):
        depth = _depth(100 * i, n, 6 * i)
        for e in depth:
            if e["kind"] == EVAL:  # the 256-prompt step at half the 64-prompt one
                e.update(large_batch=256, large_prefill_s=LARGE_PREFILL[0] + LARGE_PREFILL[1] * n,
                         large_decode_step_s=(DECODE[0] + DECODE[1] * n) / 2)  # fmt: skip
        events += depth
    profile, full = _profile(), 40
    plan = _plan(full, {"total_s": 1.0, "batch": 160, "how": "modelled"})
    ev = forecast_eval(depth_measures(events), profile, full, _scaling(there="NVIDIA H200"), plan, None)
    batch_step = DECODE[0] + DECODE[1] * full
    assert ev.target["large_decode_step_s"] < batch_step  # as timed
    assert ev.costs().decode_step_s == pytest.approx(batch_step)  # at 160: no less than at 64
    assert ev.costs(1).decode_step_s >= ev.costs(0).decode_step_s
    assert any("decode_step_s below a smaller batch's at batch 256" in line for line in ev.assumptions)
    assert not any("prefill_s below" in line for line in ev.assumptions)  # the prefills grew with the batch


def test_evaluation_runs_on_one_host_s_gpus() -> None:
    """Evaluation is one process over one host's GPUs: on 2 nodes of 4 it spans 4, and on one GPU a node
    it replays its graph (no launched steps)."""
    from cockpit.rehearse.evaluation import EvalScaling

    two_nodes = Scaling(1, "NVIDIA H200", 8, "H100-80GB", 80, 960, 1.0, 55, 55, 150, 2.0, target_nodes=2)
    assert EvalScaling.of(two_nodes).gpus == 4
    one_a_node = Scaling(1, "NVIDIA H200", 2, "H100-80GB", 80, 960, 1.0, 55, 55, 150, 2.0, target_nodes=2)
    full = 40
    ev = forecast_eval(_measures(), _profile(), full, one_a_node, _plan(full), None)
    assert not any("replays a CUDA graph on each" in line for line in ev.assumptions)
