"""Small pure pieces of the trainer: where a resume starts, where a generated thought ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cockpit.record.checkpoints import last_complete_checkpoint
from trainer.evaluation.evaluate import cut_at_end


def test_resume_skips_a_checkpoint_cut_short(tmp_path: Path) -> None:
    for step, complete in ((50, True), (100, True), (150, False), (9, True)):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        if complete:
            (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (tmp_path / "checkpoint-x").mkdir()  # not a checkpoint name
    chosen, skipped = last_complete_checkpoint(tmp_path)
    assert chosen == str(tmp_path / "checkpoint-100")  # numeric order: 100 after 9, 150 incomplete
    assert skipped == [tmp_path / "checkpoint-150"]
    assert last_complete_checkpoint(tmp_path / "none") == (None, [])


def test_a_thought_ends_at_its_own_end_not_at_its_batch_mates() -> None:
    end, eos, pad = 5, 2, 0
    rows = [[7, 8, end, pad, pad], [7, eos, pad, pad, pad], [7, 8, 9, 9, 9]]
    assert cut_at_end(rows, {end, eos, pad}) == [[7, 8], [7], [7, 8, 9, 9, 9]]


def test_a_stop_request_on_the_last_step_does_not_turn_a_finished_run_into_a_stopped_one(tmp_path: Path):
    from types import SimpleNamespace

    from transformers import TrainerControl

    from cockpit.record import EventWriter
    from trainer.callbacks import StopRequestCallback

    request = tmp_path / "stop"
    request.touch()
    callback = StopRequestCallback(request, EventWriter(tmp_path / "events.jsonl"))
    args = SimpleNamespace(process_index=0, world_size=1)
    last = SimpleNamespace(global_step=40, max_steps=40)
    control = TrainerControl()
    callback.on_step_end(args, last, control)
    assert callback.stopped_at is None and not control.should_training_stop
    earlier = SimpleNamespace(global_step=39, max_steps=40)
    callback.on_step_end(args, earlier, control)
    assert callback.stopped_at == 39 and control.should_save and control.should_training_stop


def test_alternating_callbacks_act_in_every_other_block() -> None:
    """The overhead benchmark's control: inner callbacks see steps of on-blocks only, and per-step
    logging is off in the off-blocks."""
    from types import SimpleNamespace

    from transformers import TrainerCallback

    from trainer.callbacks import AlternatingCallbacks

    class Seen(TrainerCallback):
        def __init__(self) -> None:
            self.ended: list[int] = []

        def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            self.ended.append(state.global_step)

    seen = Seen()
    ab = AlternatingCallbacks([seen], block=2)
    logged = []
    for step in range(1, 9):  # global_step after each optimizer step
        control = SimpleNamespace(should_log=True)
        ab.on_step_end(None, SimpleNamespace(global_step=step), control)
        logged.append(control.should_log)
    assert seen.ended == [1, 2, 5, 6]
    assert logged == [True, True, False, False, True, True, False, False]


def test_the_setup_phase_says_when_it_builds_the_built_in_assets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first run in an environment builds the tiny model, tokenizer and data: the viewers say so."""
    from cockpit.data import builtin
    from cockpit.profiles import load_profile
    from trainer.inputs import tiny
    from trainer.inputs.assets import setup_words

    monkeypatch.setenv("COCKPIT_CACHE", str(tmp_path))
    profile, _ = load_profile("tiny-cpu")
    assert setup_words(profile).startswith("building the built-in model, tokenizer and data")
    d = profile.data
    tiny.model_dir(0).mkdir(parents=True)  # what the first run leaves in the cache
    builtin.data_dir(d.seed, d.train_examples_per_tenant, d.eval_examples_per_tenant).mkdir()
    assert setup_words(profile) == "reading and tokenizing the training data"


def test_a_nan_loss_is_logged_as_nan_not_a_crash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A diverged step: rank 0's line and the record both say nan (the record's writer turned it into
    null, and the line's `:.4f` of that null raised in the trainer) (issue 27, item 22)."""
    from types import SimpleNamespace

    from cockpit.record import EventWriter, read_events
    from trainer.callbacks import RecordCallback

    writer = EventWriter(tmp_path / "events" / "trainer-rank0.jsonl", rank=0)
    callback = RecordCallback(writer, audit=dict, samples_per_step=1)
    state = SimpleNamespace(global_step=3, max_steps=10, epoch=0.3)
    callback.on_log(SimpleNamespace(), state, None, logs={"loss": float("nan"), "learning_rate": 1e-4})
    writer.close()
    assert "step 3/10 loss nan" in capsys.readouterr().out
    (step,) = read_events(tmp_path, "step")
    assert step["loss"] != step["loss"]  # NaN, read back from the word the line holds
