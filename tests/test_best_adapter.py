"""The best adapter: which validation's adapter is kept, where, and which one the run ends with.

The keeper's `save` here writes a stand-in adapter (a file naming the step it was saved at), as the
trainer's would write PEFT's files; what is checked is which of them the keeper keeps, moves and drops.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from cockpit.record import read_events
from cockpit.record.writer import EventWriter
from trainer.evaluation.best_adapter import POINTER, AdapterKeeper, Best, read_best


class Model:
    """What is being trained: the step it has reached, saved as the adapter's content."""

    def __init__(self) -> None:
        self.step = 0
        self.saves: list[Path] = []

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True)  # a fresh folder every time, as the keeper promises
        (folder / "adapter_model.safetensors").write_text(f"step {self.step}")
        self.saves.append(folder)


def saved_step(folder: Path) -> int:
    return int((folder / "adapter_model.safetensors").read_text().split()[1])


@pytest.fixture
def run(tmp_path: Path) -> Path:
    (tmp_path / "events").mkdir()
    return tmp_path


def keeper_for(run: Path, model: Model, writer: EventWriter, rank: int = 0) -> AdapterKeeper:
    return AdapterKeeper(run / "adapter-best", model.save, writer, rank)


def train(keeper: AdapterKeeper, model: Model, losses: dict[int, float], last: int) -> None:
    """Validations at the steps of `losses`, as `ValidationCallback` offers them."""
    for step, loss in losses.items():
        model.step = step
        keeper.offer(step, loss, last=step == last)


def test_a_new_best_is_a_trained_step_with_a_strictly_lower_finite_loss() -> None:
    assert not Best().beaten_by(0, 1.0), "step 0 is the base model: evaluation scores it anyway"
    assert Best().beaten_by(1, 5.0)
    best = Best(40, 1.0, None)
    assert best.beaten_by(80, 0.999) and not best.beaten_by(80, 1.0) and not best.beaten_by(80, 1.5)
    assert not Best().beaten_by(40, math.nan) and not best.beaten_by(80, math.inf)


def test_only_the_best_copy_is_kept_and_the_run_ends_with_it(run: Path) -> None:
    """Loss falls to its lowest at step 120, then rises: step 120's adapter is the run's, the last (160)
    goes beside it; the copies' folder is gone and the events say which step and loss."""
    model = Model()
    with EventWriter(run / "events" / "trainer-rank0.jsonl", rank=0) as writer:
        keeper = keeper_for(run, model, writer)
        train(keeper, model, {0: 3.0, 40: 1.0, 80: 1.2, 120: 0.9, 160: 0.95}, last=160)
        copy = run / "adapter-best" / "step-000120"
        assert sorted(p.name for p in (run / "adapter-best").iterdir()) == [POINTER, copy.name]
        assert json.loads((run / "adapter-best" / POINTER).read_text()) == {
            "step": 120, "val_loss": 0.9, "path": copy.name,
        }  # fmt: skip
        assert saved_step(copy) == 120 and read_best(run / "adapter-best") == Best(120, 0.9, copy)
        model.step = 160
        fields = keeper.finish(160, run / "adapter", run / "adapter-last")
    assert fields == {"step": 120, "val_loss": 0.9, "last_step": 160, "last_path": str(run / "adapter-last")}
    assert saved_step(run / "adapter") == 120 and saved_step(run / "adapter-last") == 160
    assert not (run / "adapter-best").exists()
    assert [(e["step"], e["val_loss"]) for e in read_events(run, "best_adapter")] == [(40, 1.0), (120, 0.9)]
    assert len(model.saves) == 3, "two copies and the last adapter: one save each"


def test_a_best_last_step_is_the_final_save_with_no_copy(run: Path) -> None:
    model = Model()
    with EventWriter(run / "events" / "trainer-rank0.jsonl", rank=0) as writer:
        keeper = keeper_for(run, model, writer)
        train(keeper, model, {0: 3.0, 40: 1.0, 80: 0.7}, last=80)
        assert keeper.best == Best(80, 0.7, None)
        fields = keeper.finish(80, run / "adapter", run / "adapter-last")
    assert fields == {"step": 80, "val_loss": 0.7, "last_step": 80}
    assert saved_step(run / "adapter") == 80
    assert not (run / "adapter-last").exists() and not (run / "adapter-best").exists()
    events = read_events(run, "best_adapter")
    assert [(e["step"], e["path"]) for e in events] == [
        (40, str(run / "adapter-best" / "step-000040")),
        (80, None),
    ]


def test_without_a_validation_at_a_trained_step_the_last_adapter_is_the_run_s(run: Path) -> None:
    model = Model()
    with EventWriter(run / "events" / "trainer-rank0.jsonl", rank=0) as writer:
        keeper = keeper_for(run, model, writer)
        train(keeper, model, {0: 3.0}, last=50)
        model.step = 50
        assert keeper.finish(50, run / "adapter", run / "adapter-last") == {"step": 50}
    assert saved_step(run / "adapter") == 50 and not read_events(run, "best_adapter")


def test_a_resumed_run_goes_on_from_the_best_it_kept(run: Path) -> None:
    model = Model()
    with EventWriter(run / "events" / "trainer-rank0.jsonl", rank=0) as writer:
        train(keeper_for(run, model, writer), model, {0: 3.0, 40: 1.0}, last=200)
        resumed = keeper_for(run, model, writer)  # a new process, after a stop at step 60
        assert resumed.best.step == 40
        train(resumed, model, {60: 1.1, 80: 0.8}, last=200)
    assert resumed.best.step == 80 and saved_step(run / "adapter-best" / "step-000080") == 80
    assert not (run / "adapter-best" / "step-000040").exists()


def test_other_ranks_follow_rank_0_and_write_nothing(run: Path) -> None:
    """Rank 1 joins every save rank 0 makes (a collective under ZeRO-3), told by `agree`; its own view
    does not count, and it writes no file, pointer or event."""
    model = Model()
    said = [1, 0, 1]
    with EventWriter(run / "events" / "trainer-rank1.jsonl", rank=1) as writer:
        keeper = AdapterKeeper(run / "adapter-best", model.save, writer, rank=1, agree=lambda _: said.pop(0))
        for step in (40, 80, 120):
            model.step = step
            keeper.offer(step, 2.0, last=False)  # never better by its own count after the first
    assert [p.name for p in model.saves] == ["step-000040", "step-000120"]
    assert not (run / "adapter-best" / POINTER).exists() and not read_events(run, "best_adapter")


def test_the_validation_callback_offers_each_validation_with_the_last_one_marked(run: Path) -> None:
    """The real callback over a small model whose head changes between validations (as training would
    change it): at 2 the first trained step (a copy), at 4 a worse head (none), at 6, the last, the best
    (no copy: the final save is it). The copy's save is left out of the step clock like a validation."""
    from types import SimpleNamespace

    from tests.test_loss import _model
    from tests.test_validation import _examples
    from trainer.evaluation.validation import EarlyStopping, ValidationCallback, validation_batches
    from trainer.inputs.packing import PackedCollator

    net = _model()
    rows, groups = _examples(6)
    batches = validation_batches(rows, groups, seq_len=64, micro_batch=2, collator=PackedCollator(0))
    head = net.lm_head.weight.detach().clone()
    heads = {2: head, 4: head * 50, 6: torch.zeros_like(head)}  # random, confidently wrong, uniform
    model, paused = Model(), []
    with EventWriter(run / "events" / "trainer-rank0.jsonl", rank=0) as writer:
        keeper = keeper_for(run, model, writer)
        callback = ValidationCallback(
            writer, batches, ["a", "b", "c"], eval_steps=2, model=lambda: net, chunked=False,
            early=EarlyStopping(0, 0.0), facts={}, pause_clock=paused.append, keeper=keeper,
        )  # fmt: skip
        args = SimpleNamespace(device=torch.device("cpu"), process_index=0, world_size=1)
        state = SimpleNamespace(global_step=0, max_steps=6, epoch=0.0, is_world_process_zero=True)
        control = SimpleNamespace(should_training_stop=False)
        callback.on_train_begin(args, state, control)
        for step in range(1, 7):
            state.global_step = model.step = step
            if step in heads:
                net.lm_head.weight.data.copy_(heads[step])
            callback.on_step_end(args, state, control)
    vals = {e["step"]: e["loss"] for e in read_events(run, "val_loss")}
    assert list(vals) == [0, 2, 4, 6] and vals[4] > vals[2] > vals[6], vals
    best = read_events(run, "best_adapter")
    assert [(e["step"], e["val_loss"]) for e in best] == [(2, vals[2]), (6, vals[6])]
    assert best[-1]["path"] is None, "the last step's adapter is the final save's"
    assert [p.name for p in model.saves] == ["step-000002"] and len(paused) == 4 + 1
