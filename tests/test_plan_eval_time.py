"""`cockpit plan` counts evaluation after training: a decode step's bytes over one GPU's HBM bandwidth plus
its fixed cost, the prefill and scoring forwards at the step model's rate, both systems over the held-out
split; modelled, unless a rehearsal of the configuration timed it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cockpit.contract import EVAL_BATCH_SIZE
from cockpit.plan import build_plan
from cockpit.plan.eval_time import (
    DECODE_BANDWIDTH_SHARE,
    DECODE_FIXED_S,
    GRAPH_BLOCK_S,
    EvalCosts,
    EvalShape,
    decode_bytes,
    eval_seconds,
    eval_split,
    evaluation_words,
    modelled_costs,
    spread_overhead,
    touched_experts,
)
from cockpit.plan.hardware import Hardware
from cockpit.plan.inputs import inputs_for, resolve_geometry
from cockpit.plan.measured import Measured
from cockpit.plan.run_length import EvalSplit
from cockpit.profiles import load_profile

STORY = "qwen3-235b-a22b-thinking-4xh100"


def _story_inputs():
    profile, _ = load_profile(STORY)
    return profile, inputs_for(profile, resolve_geometry(profile))


def test_a_decode_step_reads_the_experts_the_batch_routes_to_and_never_the_embeddings() -> None:
    _, inputs = _story_inputs()
    w, g = inputs.weights, inputs.geometry
    assert touched_experts(128, 8, 1) == pytest.approx(8 / 128)
    assert touched_experts(128, 8, 64) == pytest.approx(1 - (120 / 128) ** 64)
    experts = sum(s.data_bytes + s.state_bytes for t, s in w.items if t.kind == "experts")
    rest = sum(s.data_bytes + s.state_bytes for t, s in w.items if t.kind not in ("experts", "embeddings"))
    assert decode_bytes(w, 1, 0) == pytest.approx(rest + experts * 8 / 128)
    kv = 64 * 1000 * 2 * g.kv_dim * g.layers * 2  # bf16 keys and values of 64 rows of 1,000 tokens
    assert decode_bytes(w, 64, 1000) == pytest.approx(rest + experts * touched_experts(128, 8, 64) + kv)


def test_the_decode_step_is_its_bytes_at_one_gpus_bandwidth_plus_a_fixed_cost() -> None:
    _, inputs = _story_inputs()
    shape = EvalShape(EvalSplit(400, 4, "given"), 1000, 512)
    h100, _ = modelled_costs(inputs, "H100-80GB", shape)
    h200, _ = modelled_costs(inputs, "NVIDIA H200", shape)
    assert (h100.decode_step_s - DECODE_FIXED_S) / (h200.decode_step_s - DECODE_FIXED_S) == pytest.approx(
        4800 / 3350
    )
    assert h100.prefill_s == pytest.approx(h200.prefill_s)  # one chip, one bf16 rate
    assert modelled_costs(inputs, "", shape) is None  # no bandwidth known (the CPU): not modelled


def test_evaluation_is_both_systems_over_the_split() -> None:
    split = EvalSplit(400, 4, "given")
    shape = EvalShape(split, 1000, 512)
    costs = EvalCosts(prefill_s=2.0, decode_step_s=0.1, score_s=3.0)
    rows = 32_768 // (1000 + 512 + 4 * 4)  # a row an example: its prefix once, its 4 labels behind it
    expected = 2 * (math.ceil(400 / EVAL_BATCH_SIZE) * (2.0 + 512 * 0.1) + math.ceil(400 / rows) * 3.0)
    assert eval_seconds(shape, costs) == pytest.approx(expected)


def test_the_held_out_split_from_the_data_the_built_in_tenants_or_the_profile(tmp_path: Path) -> None:
    story, _ = load_profile(STORY)
    split = eval_split(story)  # data.examples 3,600 with the default held-out tenth beside them
    assert (split.examples, split.least) == (400, 360) and split.how.startswith("assumed")
    tiny, _ = load_profile("tiny-cpu")
    assert eval_split(tiny).examples == 5 * tiny.data.eval_examples_per_tenant
    rows = [
        {"tenant": "a", "id": str(i), "split": "eval" if i < 3 else "train", "user": f"q{i}",
         "labels": ["X", "Y", "Z"], "gold": "X"}
        for i in range(10)
    ]  # fmt: skip
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    mine, _ = load_profile("tiny-cpu", [f'data.source="{data}"'])
    split = eval_split(mine)
    assert (split.examples, split.labels) == (3, 3.0)
    sampled, _ = load_profile("tiny-cpu", [f'data.source="{data}"', "eval.examples=2"])
    assert eval_split(sampled).examples == 2


def test_the_plan_counts_evaluation_on_gpus_and_says_it_is_modelled() -> None:
    profile, _ = load_profile(STORY)
    plan = build_plan(profile)
    ev = plan.run.evaluation
    assert ev is not None and not ev.measured and ev.total_s > 0
    assert ev.how.startswith("modelled: a decode step reads its bytes") and "one GPU's 3,350 GB/s" in ev.how
    assert plan.to_dict()["run"]["evaluation"]["total_s"] == pytest.approx(ev.total_s)
    words = evaluation_words(ev)
    assert "(modelled: " in words and f"= {ev.total_s / 3600:.2f} h" in words
    timed = Measured("rehearsal R", 16.0, 8000.0, eval_s=1800.0, eval_range=(1700.0, 1900.0))
    assert evaluation_words(ev, timed).startswith("0.50 h (0.47-0.53 h), measured by rehearsal R")
    tiny, _ = load_profile("tiny-cpu")
    cpu = build_plan(tiny, Hardware(gpus=0, gpu_name="", gpu_mem_gib=0, host_ram_gib=16))
    assert cpu.run.evaluation is None  # the CPU: nothing to model it from


def test_a_rehearsal_that_timed_evaluation_makes_the_plans_term_measured(tmp_path: Path) -> None:
    """The story's H200 depths (a benchmark's record) with evaluation timed after each depth's steps:
    `cockpit plan --rehearsal RUN` says evaluation measured by it, beside the plan's modelled figure."""
    from cockpit.record import read_events
    from cockpit.rehearse.calibrate import calibrate
    from tests.test_plan_calibrate import _as_rehearsal, _text

    run = _as_rehearsal(tmp_path, "offload_1-16", [])
    begins = [e for e in read_events(run) if e["kind"] == "rehearse_begin"]
    lines = []
    for e in begins:
        n = e["layers"]
        timing = {"prefill_s": 0.5 + 0.2 * n, "decode_step_s": 0.043 + 0.0024 * n, "score_s": 0.3 + 0.06 * n}
        fields = {**timing, "single_prefill_s": 0.02, "single_decode_step_s": 0.04 + 0.002 * n}
        lines.append({"t": e["t"] + 1, "kind": "rehearse_eval", "rank": 0, "layers": n, "prompt_tokens": 1000,
                      "repeats": 2, **fields})  # fmt: skip
    (run / "events" / "trainer-eval-rank0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    profile, _ = load_profile(STORY)
    plan = build_plan(profile)
    measured = calibrate(plan, profile, [run])
    mine = next(iter(measured.values()))
    assert mine.eval_s is not None and mine.eval_s != pytest.approx(plan.run.evaluation.total_s, rel=0.05)
    text = _text(plan, measured)
    assert f"Evaluation, after training: {mine.eval_s / 3600:.2f} h" in text
    assert f"measured by rehearsal {run.name}" in text and "modelled" in text.split("Evaluation, after")[1]


def test_the_batch_is_what_the_gpus_hold_beside_the_weights_as_evaluation_chooses() -> None:
    from cockpit.contract import MAX_EVAL_BATCH
    from cockpit.plan.eval_time import target_batch

    _, inputs = _story_inputs()
    small, _ = target_batch(inputs, Hardware(4, "H100-80GB", 80, 960), 2000, 512, 2000)
    large, _ = target_batch(inputs, Hardware(4, "NVIDIA H200", 141, 960), 2000, 512, 2000)
    few, _ = target_batch(inputs, Hardware(4, "NVIDIA H200", 141, 960), 1000, 512, 20)
    longer, _ = target_batch(inputs, Hardware(4, "H100-80GB", 80, 960), 4000, 512, 2000)
    assert 1 <= longer < small < large <= MAX_EVAL_BATCH and few == 20
    profile, _ = load_profile(STORY)
    plan = build_plan(profile)
    assert plan.run.evaluation.shape.batch == target_batch(inputs, plan.hardware, 1000, 512, 400)[0]


def test_the_decode_constants_are_the_committed_measurement() -> None:
    """`DECODE_BANDWIDTH_SHARE` and `DECODE_FIXED_S` are what `benchmarks/eval_speed.py` measured on the
    H100 (its line at batch 64 against the memory limit of a layer's bytes); after a new run, paste them."""
    path = Path(__file__).parent.parent / "benchmarks/results/eval_speed_h100.json"
    result = json.loads(path.read_text())
    line = next(r for r in result["rows"] if r["figure"] == "decode_step_s")
    share = result["memory_limit_per_layer_s"]["batch"] / line["per_layer"]
    assert abs(DECODE_BANDWIDTH_SHARE - share) < 5e-4
    assert abs(DECODE_FIXED_S - line["fixed"]) < 0.01 * line["fixed"]


def test_the_graph_a_gpu_constant_is_the_committed_measurement() -> None:
    """`GRAPH_BLOCK_S` is what `benchmarks/decode_speed.py` measured on the H200: the 16-layer slice's
    step at batch 64 in 4 graphs (`blocks`) less in one (`graph`), over the 3 more; both gave the same
    tokens as the steps launched one by one."""
    path = Path(__file__).parent.parent / "benchmarks/results/decode_speed_h200_blocks.json"
    steps = {(r["layers"], r["batch"], r["path"]): r for r in json.loads(path.read_text())["steps"]}
    blocks, graph = steps[(16, 64, "blocks")], steps[(16, 64, "graph")]
    assert abs(GRAPH_BLOCK_S - (blocks["step_ms"] - graph["step_ms"]) / 3 / 1000) < 1e-6
    assert blocks["ran"] == "graphs per GPU" and blocks["tokens_agree_with_before"] == 1.0


def test_evaluation_over_several_gpus_pays_for_a_graph_on_each() -> None:
    """The same GPUs, one against four: the modelled decode step over four is longer by exactly the
    replays of the three graphs past the first; on one GPU there is none."""
    _, inputs = _story_inputs()
    shape = EvalShape(EvalSplit(400.0, 4.0, "test"), 1000, 512, 64)
    one, _ = modelled_costs(inputs, "H100-80GB", shape, gpus=1)
    four, how = modelled_costs(inputs, "H100-80GB", shape, gpus=4)
    assert four.decode_step_s - one.decode_step_s == pytest.approx(GRAPH_BLOCK_S * 3)
    assert "replaying a CUDA graph on each of 4 GPUs" in how
    assert spread_overhead(1) == 0.0
