"""The validation passes' wall time, in `cockpit plan` and the rehearsal's forecast."""

from __future__ import annotations

import json
import math

import pytest

from cockpit.contract import ZERO3_LAYER_FETCHES
from cockpit.plan.validation_time import (
    FORWARD_SHARE_CHECKPOINTED,
    FORWARD_SHARE_PLAIN,
    forward_share,
    modelled_forward,
    validation_passes,
    validation_size,
    validation_time,
)
from cockpit.profiles import load_profile

STORY = "qwen3-235b-a22b-thinking-4xh100"


def test_a_validation_at_the_start_every_eval_steps_and_at_the_last() -> None:
    """As `trainer.evaluation.validation` does: the tiny run's 320 steps at 40 give 0, 40, ..., 320."""
    assert validation_passes(320, 40) == len(range(0, 321, 40)) == 9
    assert validation_passes(112, 50) == len([0, 50, 100, 112])
    assert validation_passes(0, 50) == 0 and validation_passes(100, 0) == 0


@pytest.mark.parametrize(
    ("settings", "share"),
    [
        (['deepspeed.offload_param="none"'], FORWARD_SHARE_CHECKPOINTED),
        (['deepspeed.offload_param="none"', "training.gradient_checkpointing=false"], FORWARD_SHARE_PLAIN),
        ([], 1 / ZERO3_LAYER_FETCHES),  # the tiny profile offloads: a forward copies each layer once of 2
    ],
)
def test_a_forward_is_a_third_of_a_checkpointed_step_or_its_copies_share(settings, share) -> None:
    profile, _ = load_profile("tiny-cpu", settings)
    assert forward_share(profile)[0] == pytest.approx(max(share, FORWARD_SHARE_CHECKPOINTED))


def test_the_plans_forward_is_a_share_of_compute_and_one_fetch_of_the_exposed_transfers() -> None:
    """A forward does a third of a checkpointed step's compute (half without checkpointing) and one of the
    step's layer fetches: half of what the step spends beyond its compute; a compute-bound step adds
    nothing. The story's plan costs its validation passes so."""
    from cockpit.plan import build_plan

    profile, _ = load_profile(STORY)
    assert modelled_forward(profile, 9.0, 9.0)[0] == pytest.approx(3.0)
    seconds, why = modelled_forward(profile, 9.0, 10.0)
    assert seconds == pytest.approx(3.0 + 1.0 / ZERO3_LAYER_FETCHES) and "exposed transfers" in why
    plain, _ = load_profile(STORY, ["training.gradient_checkpointing=false"])
    assert modelled_forward(plain, 9.0, 9.0)[0] == pytest.approx(4.5)
    plan = build_plan(profile)
    c, v = plan.configured, plan.run.validation
    assert c.step_s >= c.compute_s > 0 and v is not None  # the story is compute-bound: copies hide
    forward = modelled_forward(profile, c.compute_s, c.step_s)[0]
    assert v.pass_s == pytest.approx(v.rounds * forward) and v.forward_share < 1 / ZERO3_LAYER_FETCHES


def _write_data(path, per_tenant: dict[str, int], split: str) -> list[str]:
    """Examples of a few tenants, `per_tenant` of each in `split`; returns the users' texts in order."""
    rows, texts = [], []
    for tenant, n in per_tenant.items():
        for i in range(n):
            user = f"{tenant} example {i} " + "x" * (10 * i)
            rows.append(
                {"tenant": tenant, "split": split, "system": "", "user": user, "reasoning": "", "gold": "g"}
            )
            texts.append(user)
        rows.append(
            {"tenant": tenant, "split": "train", "system": "", "user": "t", "reasoning": "", "gold": "g"}
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return texts


def test_the_sample_is_the_trainers_own_from_the_data_file(tmp_path) -> None:
    """The first `examples_per_tenant` of each tenant's validation split (else eval split), counted as the
    training tokens are (here four characters a token: no tokenizer at model.path)."""
    data = tmp_path / "d.jsonl"
    texts = _write_data(data, {"a": 5, "b": 2}, "validation")
    profile, _ = load_profile(
        "tiny-cpu",
        [f'data.source="{data}"', f'model.path="{tmp_path / "none"}"', "validation.examples_per_tenant=3"],
    )
    size = validation_size(profile)
    kept = texts[:3] + texts[5:7]  # a's first three, b's two
    assert size.examples == 5
    assert size.tokens == sum(round(len(t) / 4) + 1 + 1 for t in kept)  # user, label, end of turn
    assert "validation split" in size.how


def test_without_the_file_the_held_out_share_of_the_assumed_data(tmp_path) -> None:
    profile, _ = load_profile(STORY)  # 3,600 examples of 2,000 tokens assumed, 10% held out, no tenants
    size = validation_size(profile)
    held = math.floor(3600 * 0.1 / 0.9)
    assert (size.examples, size.tokens) == (held, held * 2000) and "data.tenants" in size.how
    five, _ = load_profile(STORY, ["data.tenants=5"])
    assert validation_size(five).examples == 5 * profile.validation.examples_per_tenant


def test_a_pass_is_its_rank_s_forwards_times_a_share_of_the_micro_step() -> None:
    profile, _ = load_profile(STORY)
    one = validation_time(profile, steps=112, ranks=1, micro_step_s=4.0)
    four = validation_time(profile, steps=112, ranks=4, micro_step_s=4.0)
    assert one.passes == four.passes == 4
    assert (
        one.micro_batches
        == four.micro_batches
        >= math.ceil(one.tokens / (profile.training.seq_len * profile.training.micro_batch_size))
    )
    assert (one.rounds, four.rounds) == (one.micro_batches, math.ceil(one.micro_batches / 4))
    assert four.pass_s == pytest.approx(four.rounds * 4.0 * four.forward_share)
    assert four.total_s == pytest.approx(4 * four.pass_s)
    assert validation_time(profile, 112, 4, None).total_s is None, "no step time: no seconds"
    off, _ = load_profile(STORY, ["validation.eval_steps=0"])
    assert validation_time(off, 112, 4, 4.0) is None


def test_plan_counts_and_shows_the_validation_passes() -> None:
    from rich.console import Console

    from cockpit.plan import build_plan
    from cockpit.plan.render import verdict_text

    profile, _ = load_profile(STORY)
    plan = build_plan(profile)
    run = plan.run
    assert run.validation is not None and run.validation.passes == validation_passes(run.steps, 50)
    micro = run.optimizer_step_s / profile.training.grad_accum
    assert run.validation.pass_s == pytest.approx(
        run.validation.rounds * micro * run.validation.forward_share
    )
    assert plan.to_dict()["run"]["validation"]["total_s"] == pytest.approx(run.validation.total_s)
    console = Console(width=400, record=True)
    console.print(verdict_text(plan))
    text = console.export_text()
    assert f"Validation loss, on top: {run.validation.passes} passes x 400 examples" in text


def test_a_rehearsal_that_timed_the_forwards_makes_the_plans_validation_measured(tmp_path) -> None:
    """`cockpit plan --rehearsal RUN` with a record whose depths timed validation forwards (the story's H200
    call): the passes as the rehearsal forecast them, said beside the modelled ones, and in the run's
    hours; a record without them keeps the modelled passes, scaled to its measured step."""
    from cockpit.plan import build_plan
    from cockpit.rehearse.calibrate import calibrate
    from cockpit.rehearse.run import forecast_run
    from tests.test_plan_calibrate import _as_rehearsal, _text

    profile, _ = load_profile(STORY)
    plan = build_plan(profile)
    timed = _as_rehearsal(tmp_path, "offload_4-16_register", [])
    (mine,) = calibrate(plan, profile, [timed]).values()
    assert mine.validation_s == pytest.approx(forecast_run(timed).wall["validation_s"])
    assert mine.validation_s != pytest.approx(plan.run.validation_s, rel=0.05)
    text = " ".join(_text(plan, {"as configured": mine}).split())
    assert f"measured by rehearsal {timed.name}: {mine.validation_s / 3600:.2f} h" in text
    hours = (plan.run.train_s * mine.step_s / plan.run.optimizer_step_s + mine.validation_s) / 3600
    assert f"training and validation ~{hours:.2f} h (step and validation measured by" in text
    untimed = _as_rehearsal(tmp_path, "offload_1-16_mb8", [])
    (older,) = calibrate(plan, profile, [untimed]).values()
    assert older.validation_s is None
    assert "(step measured by rehearsal" in " ".join(_text(plan, {"as configured": older}).split())
