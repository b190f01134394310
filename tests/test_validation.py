"""Validation loss during training: per-tenant losses from one forward, shared by ranks; early stopping."""

from __future__ import annotations

import pytest
import torch

from devtools.faults import Watch, communicate_watched
from tests.test_loss import _model
from trainer.evaluation.validation import (
    EarlyStopping,
    group_sums,
    tenant_losses,
    time_forwards,
    validation_batches,
)
from trainer.inputs.packing import PackedCollator
from trainer.layers.loss import grouped_cross_entropy, use_chunked_loss


def _examples(n: int, seed: int = 3) -> tuple[list[dict[str, list[int]]], list[int]]:
    """Tokenized examples of three tenants: a prompt (no target), then an answer."""
    g = torch.Generator().manual_seed(seed)
    rows, groups = [], []
    for i in range(n):
        length = int(torch.randint(8, 30, (1,), generator=g))
        ids = torch.randint(0, 300, (length,), generator=g).tolist()
        cut = length // 2
        rows.append({"input_ids": ids, "labels": [-100] * cut + ids[cut:]})
        groups.append(i % 3)
    return rows, groups


def _one_by_one(
    model: torch.nn.Module, rows: list[dict[str, list[int]]], groups: list[int]
) -> dict[int, float]:
    """Each group's token-weighted loss, one example a forward, by Transformers' own loss."""
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    with torch.no_grad():
        for row, group in zip(rows, groups, strict=True):
            ids = torch.tensor([row["input_ids"]])
            labels = torch.tensor([row["labels"]])
            n = int((labels[:, 1:] != -100).sum())
            loss = model(input_ids=ids, labels=labels).loss
            sums[group] = sums.get(group, 0.0) + float(loss) * n
            counts[group] = counts.get(group, 0) + n
    return {g: sums[g] / counts[g] for g in sums}


def test_grouped_cross_entropy_sums_each_group_in_chunks() -> None:
    torch.manual_seed(0)
    hidden = torch.randn(2, 9, 16)
    weight = torch.randn(50, 16)
    labels = torch.randint(0, 50, (2, 9))
    labels[0, :3] = -100
    groups = torch.tensor([[0] * 5 + [1] * 4, [2] * 7 + [-1] * 2])
    whole = grouped_cross_entropy(hidden, weight, labels, groups, 3, chunk=1000)
    pieces = grouped_cross_entropy(hidden, weight, labels, groups, 3, chunk=2)
    torch.testing.assert_close(pieces, whole)
    logp = torch.log_softmax(hidden[:, :-1] @ weight.t(), dim=-1)
    token_loss = -logp.gather(2, labels[:, 1:].clamp(min=0).unsqueeze(-1)).squeeze(-1)
    owner, valid = groups[:, 1:], (labels[:, 1:] != -100) & (groups[:, 1:] >= 0)
    for g in range(3):
        mask = valid & (owner == g)
        assert float(whole[0, g]) == pytest.approx(float(token_loss[mask].sum()), rel=1e-5)
        assert int(whole[1, g]) == int(mask.sum())


@pytest.mark.parametrize("chunked", [True, False])
def test_packed_tenants_in_one_forward_equal_one_example_at_a_time(chunked: bool) -> None:
    """Packing the tenants together changes nothing: no token attends across an example."""
    model = _model()
    reference = _one_by_one(model, *_examples(7))
    if chunked:
        assert use_chunked_loss(model)
    rows, groups = _examples(7)
    batches = validation_batches(rows, groups, seq_len=64, micro_batch=2, collator=PackedCollator(0))
    assert len(batches) >= 2 and all(b["loss_groups"].shape == b["input_ids"].shape for b in batches)
    totals = group_sums(model, batches, 3, torch.device("cpu"), chunked)
    losses = tenant_losses(totals, ["a", "b", "c"])
    assert losses == pytest.approx({"a": reference[0], "b": reference[1], "c": reference[2]}, rel=1e-4)
    assert model.training, "the model is put back in training mode"


def test_ranks_share_the_batches_and_their_sums_add_up() -> None:
    """Two ranks each take every other batch (one runs an empty batch to match forwards): their sums add
    up to one rank's."""
    model = _model()
    use_chunked_loss(model)
    rows, groups = _examples(9)
    batches = validation_batches(rows, groups, seq_len=40, micro_batch=1, collator=PackedCollator(0))
    assert len(batches) % 2 == 1, "an odd number, so the second rank runs an empty batch"
    whole = group_sums(model, batches, 3, torch.device("cpu"), True)
    shared = sum(group_sums(model, batches, 3, torch.device("cpu"), True, rank=r, world=2) for r in range(2))
    torch.testing.assert_close(shared, whole)


def test_validation_forwards_are_timed_a_round_at_a_time_the_first_apart() -> None:
    """A rehearsal times a validation pass's forwards: each round one micro-batch a rank, the first round
    (the warm-up) apart from the median of the rest; its shape is the rank's micro-batch, padding left
    out; fewer than two rounds time nothing."""
    model = _model()
    use_chunked_loss(model)
    seen: list[tuple[int, ...]] = []
    model.register_forward_pre_hook(lambda _, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)),
                                    with_kwargs=True)  # fmt: skip
    rows, groups = _examples(30)
    batches = validation_batches(rows, groups, seq_len=40, micro_batch=2, collator=PackedCollator(0))
    assert len(batches) >= 5
    for world, rank in ((1, 0), (2, 1)):
        seen.clear()
        timed = time_forwards(model, batches[:5], torch.device("cpu"), True, rank=rank, world=world)
        rounds = 5 // world
        assert timed is not None and timed["forwards"] == rounds - 1
        assert seen == [tuple(b["input_ids"].shape) for b in batches[rank : rounds * world : world]]
        mine = batches[rank]
        assert timed["rows"] == mine["input_ids"].shape[0] == 2
        assert timed["tokens"] == int((mine["loss_groups"] >= 0).sum()) < mine["input_ids"].numel()
        assert timed["first_s"] > 0 and timed["forward_s"] > 0 and model.training
    assert time_forwards(model, batches[:3], torch.device("cpu"), True, rank=0, world=2) is None


@pytest.mark.parametrize(
    ("steps", "eval_tokens", "timed"),
    [(0, 8, ["evaluation"]), (3, 0, ["validation"]), (3, 8, ["validation", "evaluation"])],
)
def test_a_rehearsal_depth_times_validation_after_steps_only(steps, eval_tokens, timed) -> None:
    """A depth that only times the evaluation (`cockpit rehearse --eval-only`) trained no model: it has no
    validation forwards to time; a depth that trained times them before the evaluation."""
    from trainer.rehearsal import Depth, Rehearsal

    depth = object.__new__(Rehearsal)
    depth.depth = Depth(layers=2, steps=steps, eval_tokens=eval_tokens)
    calls: list[str] = []
    depth.time_validation = lambda: calls.append("validation")
    depth.time_evaluation = lambda: calls.append("evaluation")
    depth.save_checkpoint()
    assert calls == timed


def test_early_stopping_waits_for_patience_and_min_delta() -> None:
    early = EarlyStopping(patience=2, min_delta=0.05)
    assert early.observe(0, 2.0) is None
    assert early.observe(50, 1.5) is None  # better: the best
    assert early.observe(100, 1.47) is None  # not better by more than 0.05: one
    reason = early.observe(150, 1.6)  # two: stop
    assert reason is not None
    assert "1.5000 at step 50" in reason and "0.05" in reason and "patience 2" in reason
    never = EarlyStopping(patience=0, min_delta=0.0)
    assert all(never.observe(s, 1.0 + s) is None for s in range(10))


def test_an_improvement_resets_the_wait() -> None:
    early = EarlyStopping(patience=2, min_delta=0.0)
    for step, loss in ((0, 1.0), (1, 1.1), (2, 0.9), (3, 0.95)):
        assert early.observe(step, loss) is None
    assert early.observe(4, 0.95) is not None and early.best_step == 2


def test_the_callback_validates_on_schedule_and_stops_early(tmp_path) -> None:
    """At the start, every `eval_steps` and at the last step; with patience 1 and a min_delta no change can
    beat, the first validation after the start stops training and says why."""
    from types import SimpleNamespace

    from cockpit.record import read_events
    from cockpit.record.writer import EventWriter
    from trainer.evaluation.validation import ValidationCallback

    model = _model()
    use_chunked_loss(model)
    rows, groups = _examples(6)
    batches = validation_batches(rows, groups, seq_len=64, micro_batch=2, collator=PackedCollator(0))
    paused: list[float] = []
    (tmp_path / "events").mkdir()
    with EventWriter(tmp_path / "events" / "trainer-rank0.jsonl", rank=0) as writer:
        callback = ValidationCallback(
            writer, batches, ["a", "b", "c"], eval_steps=2, model=lambda: model, chunked=True,
            early=EarlyStopping(patience=1, min_delta=10.0), facts={"examples": 6},
            pause_clock=paused.append,
        )  # fmt: skip
        args = SimpleNamespace(device=torch.device("cpu"), process_index=0, world_size=1)
        state = SimpleNamespace(global_step=0, max_steps=10, epoch=0.0, is_world_process_zero=True)
        control = SimpleNamespace(should_training_stop=False)
        callback.on_train_begin(args, state, control)
        state.global_step = 1
        callback.on_step_end(args, state, control)  # not a validation step
        assert not control.should_training_stop
        state.global_step = 2
        callback.on_step_end(args, state, control)
    assert control.should_training_stop and callback.stopped is not None
    vals = read_events(tmp_path, "val_loss")
    assert [e["step"] for e in vals] == [0, 2] and len(paused) == 2
    assert vals[0]["loss"] == pytest.approx(vals[1]["loss"]) and set(vals[0]["tenant_loss"]) == {
        "a",
        "b",
        "c",
    }
    (stop,) = read_events(tmp_path, "early_stop")
    assert stop["step"] == 2 and stop["best_step"] == 0 and "patience 1" in stop["reason"]


TWO_RANKS = """
import json, os, sys
import torch
sys.path.insert(0, os.getcwd())
from tests.test_loss import _model
from tests.test_validation import _examples
from trainer.layers.loss import use_chunked_loss
from trainer.inputs.packing import PackedCollator
from trainer.evaluation.validation import group_sums, validation_batches

torch.distributed.init_process_group("gloo")
rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
model = _model()
use_chunked_loss(model)
rows, groups = _examples(9)
batches = validation_batches(rows, groups, seq_len=40, micro_batch=1, collator=PackedCollator(0))
totals = group_sums(model, batches, 3, torch.device("cpu"), True, rank=rank, world=world)
from trainer.distributed import rank0_says
print("rank 0 says", rank0_says(7 if rank == 0 else 3))  # every rank hears rank 0's answer
print(json.dumps(totals.tolist()))
torch.distributed.destroy_process_group()
"""


@pytest.mark.e2e  # two real processes over gloo
def test_two_ranks_all_reduce_to_one_ranks_sums(tmp_path) -> None:
    """Two real processes (gloo): each runs its share, one all-reduce, both hold the whole sums; and both
    hear rank 0's answer to a question (`rank0_says`, how the best adapter's saves are decided)."""
    import json
    import os
    import socket
    import subprocess
    import sys

    from tests.conftest import REPO

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
           "PYTHONPATH": str(REPO)}  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TWO_RANKS],
            env={**env, "RANK": str(r)},
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = [communicate_watched(p, Watch()) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    model = _model()
    use_chunked_loss(model)
    rows, groups = _examples(9)
    batches = validation_batches(rows, groups, seq_len=40, micro_batch=1, collator=PackedCollator(0))
    whole = group_sums(model, batches, 3, torch.device("cpu"), True)
    for out, _ in outs:
        torch.testing.assert_close(torch.tensor(json.loads(out.strip().splitlines()[-1])), whole)
        assert "rank 0 says 7" in out.splitlines(), "a decision every rank joins is rank 0's"
