"""`training.report_to`: the user's own trackers, passed through to the HF Trainer beside the record."""

from __future__ import annotations

from pathlib import Path

import pytest

from cockpit.profiles import ProfileError, load_profile, profile_to_dict
from cockpit.record import write_manifest


def training_args(tmp_path: Path, overrides: list[str]):
    """The TrainingArguments the trainer builds for a run of the tiny profile with `overrides`."""
    from trainer.__main__ import Recipe

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
