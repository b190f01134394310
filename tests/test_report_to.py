"""`training.report_to`: the user's own trackers, passed through to the HF Trainer beside the record."""

from __future__ import annotations

from pathlib import Path

import pytest

from cockpit.profiles import ProfileError, load_profile, profile_to_dict
from cockpit.record import write_manifest


def training_args(tmp_path: Path, overrides: list[str]):
    """The TrainingArguments the trainer builds for a run of the tiny profile with `overrides`."""
    from trainer.recipe import Recipe

    profile, _ = load_profile("tiny-cpu", overrides)
    run_dir = tmp_path / "20261201-000000-tiny-cpu-0000"
    (run_dir / "events").mkdir(parents=True)
    write_manifest(run_dir, {"run_id": run_dir.name, "profile": profile_to_dict(profile)})
    recipe = Recipe(run_dir, resume=False)
    try:
        return recipe.training_args()
    finally:
        recipe.events.close()


def test_report_to_reaches_the_trainer(tmp_path: Path) -> None:
    args = training_args(tmp_path, ['training.report_to=["tensorboard", "trackio"]'])
    assert args.report_to == ["tensorboard", "trackio"]
    assert args.run_name == "20261201-000000-tiny-cpu-0000"  # the tracker's run is named after the record


def test_report_to_is_empty_by_default(tmp_path: Path) -> None:
    assert training_args(tmp_path, []).report_to == []


def test_an_unknown_tracker_is_refused_with_its_field() -> None:
    with pytest.raises(ProfileError, match=r"training\.report_to"):
        load_profile("tiny-cpu", ['training.report_to=["tensorbord"]'])


def test_a_plain_string_is_taken_as_the_trainer_takes_it() -> None:
    named, _ = load_profile("tiny-cpu", ["training.report_to=tensorboard"])
    assert named.training.report_to == ["tensorboard"]
    for none in ("none", '["none"]', "[]"):
        assert load_profile("tiny-cpu", [f"training.report_to={none}"])[0].training.report_to == []
    with pytest.raises(ProfileError, match=r"training\.report_to"):
        load_profile("tiny-cpu", ["training.report_to=tensorbord"])


def _missing_tracker() -> str:
    """A tracker whose package is not installed here (most of them are not)."""
    import importlib.util

    return next(
        n for n in ("wandb", "swanlab", "dvclive", "clearml", "neptune") if not importlib.util.find_spec(n)
    )


def test_a_tracker_without_its_package_stops_run_and_doctor_before_anything_starts(tmp_path: Path) -> None:
    """In a process of its own, as a user runs it: stderr holds the one line (transformers, imported for
    the Trainer's checks, loads libraries that log as they import)."""
    import subprocess
    import sys

    from cockpit.service import doctor

    name = _missing_tracker()
    runs = tmp_path / "runs"
    argv = ["run", "--no-ui", "--set", f'training.report_to=["{name}"]', "--runs-dir", str(runs)]
    done = subprocess.run(
        [sys.executable, "-m", "cockpit", *argv], capture_output=True, text=True, timeout=300
    )
    err = done.stderr.strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1, err
    assert err.endswith(
        f"training.report_to: {name} needs the `{name}` package, not here (install it, or leave {name} out)"
    )
    assert not runs.exists(), "refused before a run record was made"
    profile, _ = load_profile("tiny-cpu", [f"training.report_to={name}"])
    check = doctor.check_model_and_data(profile, "mine.toml")
    assert check.status == "fail" and f"training.report_to: {name} needs" in check.reason
    installed, _ = load_profile("tiny-cpu", ["training.report_to=tensorboard"])
    assert doctor.check_model_and_data(installed, "mine.toml").status == "ok"


def test_every_tracker_has_the_trainers_own_check() -> None:
    from transformers.integrations import integration_utils

    from cockpit.trackers import AVAILABLE, Tracker

    assert (
        set(AVAILABLE) | {"all"}
        == set(Tracker.__args__)
        == set(integration_utils.INTEGRATION_TO_CALLBACK) | {"all"}
    )
    assert all(callable(getattr(integration_utils, check)) for check, _ in AVAILABLE.values())


def test_the_validation_loss_reaches_the_trackers(tmp_path: Path) -> None:
    """A real Trainer with TensorBoard: each validation is an `eval/loss` scalar at its step, equal to the
    record's `val_loss`, with each tenant's beside it (the training loss alone was there before), and
    the training loss of every step still there."""
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers import Trainer, TrainingArguments

    from cockpit.record import read_events
    from cockpit.record.writer import EventWriter
    from tests.test_loss import _model
    from tests.test_validation import _examples
    from trainer.evaluation.validation import EarlyStopping, ValidationCallback, validation_batches
    from trainer.inputs.packing import PackedCollator

    model = _model()
    rows, groups = _examples(6)
    batches = validation_batches(rows, groups, seq_len=64, micro_batch=2, collator=PackedCollator(0))
    train = [{**r, "position_ids": list(range(len(r["input_ids"])))} for r in rows]
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=2,
        report_to=["tensorboard"],
        logging_steps=1,
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    (tmp_path / "events").mkdir()
    with EventWriter(tmp_path / "events" / "trainer-rank0.jsonl", rank=0) as writer:
        trainer: Trainer | None = None
        callback = ValidationCallback(
            writer, batches, ["a", "b", "c"], eval_steps=1, model=lambda: model, chunked=False,
            early=EarlyStopping(0, 0.0), facts={}, log=lambda logs: trainer.log(logs),
        )  # fmt: skip
        trainer = Trainer(
            model=model, args=args, train_dataset=train, data_collator=PackedCollator(0), callbacks=[callback]
        )
        torch.manual_seed(0)
        trainer.train()
    vals = read_events(tmp_path, "val_loss")
    assert [e["step"] for e in vals] == [0, 1, 2]
    (logdir,) = {p.parent for p in (tmp_path / "out").rglob("events.out.tfevents.*")}
    scalars = EventAccumulator(str(logdir)).Reload()
    # every step's own loss is still logged: the Trainer's `log` clears `should_log`, put back
    assert [s.step for s in scalars.Scalars("train/loss")] == [1, 2]
    seen = [(s.step, s.value) for s in scalars.Scalars("eval/loss")]
    assert [step for step, _ in seen] == [0, 1, 2]
    assert [value for _, value in seen] == pytest.approx([e["loss"] for e in vals], abs=1e-4)
    assert {"eval/loss/a", "eval/loss/b", "eval/loss/c"} <= set(scalars.Tags()["scalars"])
