"""The trainer's audit compared with the run's plan: each dropped setting is a warning with its cost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cockpit.plan import Hardware, build_plan
from cockpit.plan.audit import compare_audit, plan_warnings
from cockpit.plan.inputs import GiB
from cockpit.profiles import load_profile
from cockpit.record.view import RunView

STORY = "qwen3-235b-a22b-thinking-4xh100"
EXPERTS = 94 * 128 * 3 * 4096 * 1536


@pytest.fixture(scope="module")
def plan() -> dict:
    profile, _ = load_profile(STORY)
    return json.loads(json.dumps(build_plan(profile, Hardware(4, "H100-80GB", 80, 960)).to_dict()))


def audit_as_planned(plan: dict, **applied) -> dict:
    """An audit event (trainer/audit.py shape) for a run that got what the plan assumed."""
    groups = {
        k["kind"]: {"params": k["params"], "params_4bit": k["planned_4bit_params"], "trainable": 0}
        for k in plan["kinds"]
    }
    groups["lora"] = {"params": plan["lora"]["params"], "params_4bit": 0, "trainable": plan["lora"]["params"]}
    setup = plan["configured"]["setup"]
    return {
        "kind": "audit",
        "groups": groups,
        "requested": {
            "zero_stage": 3,
            "gradient_checkpointing": True,
            "offload_param": "cpu",
            "offload_optimizer": "cpu",
        },
        "applied": {
            "zero_stage": 3,
            "offload_param": setup["offload_param"],
            "offload_optimizer": setup["offload_optimizer"],
            "partitioned_at_load": True,
            "gradient_checkpointing": True,
            **applied,
        },
        "warnings": [],
    }


def test_nothing_to_say_when_the_run_got_the_plan(plan) -> None:
    assert compare_audit(audit_as_planned(plan), plan) == []


def test_experts_left_in_16_bit_cost_their_difference(plan) -> None:
    audit = audit_as_planned(plan)
    audit["groups"]["experts"]["params_4bit"] = 0
    warnings = compare_audit(audit, plan)
    assert [w.setting for w in warnings] == ["4bit:experts"]
    w = warnings[0]
    assert w.cost_bytes == pytest.approx(EXPERTS * (2 - (0.5 + 1 / 64 + 4 / 16384)), rel=1e-3)
    # The layerwise loader holds one layer on a GPU at load: 16-bit experts cost pinned host RAM and copies.
    assert "experts" in w.message and "pinned host RAM" in w.message and "per GPU at load" not in w.message
    assert f"{w.cost_bytes / GiB:,.1f} GiB" in w.message


def test_experts_in_16_bit_under_from_pretrained_cost_every_gpu_at_load() -> None:
    profile, _ = load_profile(STORY)
    profile = profile.model_copy(
        update={"model": profile.model.model_copy(update={"loader": "transformers"})}
    )
    plan = json.loads(json.dumps(build_plan(profile, Hardware(4, "H100-80GB", 80, 960)).to_dict()))
    assert plan["configured"]["setup"]["loader"] == "transformers"
    audit = audit_as_planned(plan)
    audit["groups"]["experts"]["params_4bit"] = 0
    (w,) = compare_audit(audit, plan)
    assert "per GPU at load" in w.message


def test_plans_written_before_the_layerwise_loader_still_compare(plan) -> None:
    old = json.loads(json.dumps(plan))
    del old["configured"]["setup"]["loader"]
    old["configured"]["setup"]["load_on"] = "gpu"
    audit = audit_as_planned(old)
    audit["groups"]["experts"]["params_4bit"] = 0
    (w,) = compare_audit(audit, old)
    assert "per GPU at load" in w.message


def test_small_groups_are_not_worth_a_warning(plan) -> None:
    audit = audit_as_planned(plan)
    audit["groups"]["attention"]["params_4bit"] -= 10_000_000  # 10 M of 235 B
    assert compare_audit(audit, plan) == []


def test_dropped_settings_each_cost_something(plan) -> None:
    audit = audit_as_planned(
        plan,
        partitioned_at_load=False,
        gradient_checkpointing=False,
        offload_param="none",
        offload_optimizer="none",
    )
    warnings = {w.setting: w for w in compare_audit(audit, plan)}
    assert set(warnings) == {
        "partition_at_load",
        "gradient_checkpointing",
        "offload_param",
        "offload_optimizer",
    }
    stored = plan["weights_bytes"]["stored"]
    assert warnings["partition_at_load"].cost_bytes == stored - stored // 4
    acts = plan["activations"]
    assert (
        warnings["gradient_checkpointing"].cost_bytes
        == acts["without_checkpointing"] - acts["with_checkpointing"]
    )
    assert warnings["offload_param"].cost_bytes == plan["weights_bytes"]["stored_data"] // 4
    assert warnings["offload_optimizer"].cost_bytes == 16 * plan["lora"]["params"] // 4
    assert all(w.cost_bytes > 0 for w in warnings.values())


def test_viewers_add_plan_warnings_to_the_trainer_ones(plan) -> None:
    audit = audit_as_planned(plan)
    audit["groups"]["experts"]["params_4bit"] = 0
    audit["warnings"] = ["experts: not in 4 bit (from the trainer)"]
    audit["t"] = 1.0
    view = RunView()
    view.apply([audit])
    assert view.warnings == ["experts: not in 4 bit (from the trainer)"]  # the record: the trainer's own
    against = plan_warnings(view.audit, plan)
    assert len(against) == 1 and against[0].startswith("against the plan: experts")
    assert RunView().warnings == [] and plan_warnings(None, plan) == [] and plan_warnings(audit, None) == []


def test_a_new_run_stores_its_plan(tmp_path: Path) -> None:
    from cockpit.plan.store import load_plan
    from cockpit.service.runs import create_run

    profile, path = load_profile("tiny-cpu")
    run_dir = create_run(tmp_path / "runs", profile, path, ["cockpit", "run"])
    stored = load_plan(run_dir)
    assert stored is not None and stored["profile"] == "tiny-cpu"
    assert stored["configured"]["fits"] is True
    assert load_plan(tmp_path) is None


def test_the_app_shows_the_plan_warnings_too(plan, tmp_path: Path) -> None:
    from cockpit.app.model import build_audit
    from cockpit.plan.store import load_plan
    from cockpit.record import RunPaths, write_manifest
    from cockpit.record.playback import Playback

    audit = audit_as_planned(plan, partitioned_at_load=False)
    audit.update(t=1.0, rank=0)
    write_manifest(tmp_path, {"run_id": "r", "status": "running", "profile": {}})
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "trainer-rank0.jsonl").write_text(json.dumps(audit) + "\n")
    RunPaths(tmp_path).plan.write_text(json.dumps(plan))
    pb = Playback(tmp_path, live=True)
    pb.load()
    pb.tick()
    shown = build_audit(pb, load_plan(tmp_path))
    assert shown is not None and any(w.startswith("against the plan:") for w in shown.warnings)
    assert not any(w.startswith("against the plan:") for w in build_audit(pb).warnings)
