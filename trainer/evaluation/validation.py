"""Validation loss during training, and early stopping.

Every `validation.eval_steps` optimizer steps (and at the first and the last), the loss of a small
held-out sample per tenant, with no generation. The sample's examples, of every tenant, are packed
together and each token carries its tenant's number (`loss_groups`): one forward a micro-batch gives every
tenant's summed loss and target count (`trainer.layers.loss.grouped_cross_entropy`, the logits never whole).
The ranks share the micro-batches, each running as many forwards (ZeRO-3 gathers weights in every one), and
one all-reduce sums their counts. A tenant's loss is its token-weighted mean; the run's validation loss is
the plain mean over tenants (each counts alike), and that is what early stopping watches.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import TrainerCallback

from cockpit.record import EventWriter
from trainer.evaluation.best_adapter import AdapterKeeper
from trainer.inputs.data import IGNORE
from trainer.inputs.packing import pack_rows


@dataclass
class EarlyStopping:
    """Stop once the validation loss has not improved on its best by more than `min_delta` for `patience`
    validations in a row (`patience` 0: never)."""

    patience: int
    min_delta: float
    best: float | None = None
    best_step: int = 0
    waited: int = 0

    def observe(self, step: int, loss: float) -> str | None:
        """Fold one validation; the reason to stop, or None."""
        if self.best is None or loss < self.best - self.min_delta:
            self.best, self.best_step, self.waited = loss, step, 0
            return None
        self.waited += 1
        if self.patience and self.waited >= self.patience:
            by = f" by more than {self.min_delta:g}" if self.min_delta else ""
            return (
                f"validation loss {loss:.4f} has not improved on its best, {self.best:.4f} at step "
                f"{self.best_step},{by} in {self.waited} validation{'s' if self.waited > 1 else ''} "
                f"(patience {self.patience})"
            )
        return None


def validation_batches(
    rows: Sequence[dict[str, list[int]]],
    groups: Sequence[int],
    seq_len: int,
    micro_batch: int,
    collator: Callable[[list[dict[str, Any]]], dict[str, Any]],
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Tokenized examples packed into rows of `seq_len` (whatever the training's packing), collated
    `micro_batch` rows at a time, each with `loss_groups` [B, T]: every token's group (-1: padding)."""
    tagged = [{**r, "groups": [g] * len(r["input_ids"])} for r, g in zip(rows, groups, strict=True)]
    packed = pack_rows(tagged, seq_len, seed=seed, token_keys=("groups",))
    batches = []
    for i in range(0, len(packed), micro_batch):
        chunk = packed[i : i + micro_batch]
        batch = collator(chunk)
        width = batch["input_ids"].shape[1]
        batch["loss_groups"] = torch.tensor(
            [r["groups"] + [-1] * (width - len(r["groups"])) for r in chunk], dtype=torch.long
        )
        batches.append(batch)
    return batches


def _empty_like(batch: dict[str, Any]) -> dict[str, Any]:
    """A batch that counts for nothing: a rank with no batch left runs it, so every rank's forwards match."""
    empty = dict(batch)
    empty["labels"] = torch.full_like(batch["labels"], IGNORE)
    empty["loss_groups"] = torch.full_like(batch["loss_groups"], -1)
    return empty


def _to(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


@torch.no_grad()
def group_sums(
    model: Any,
    batches: Sequence[dict[str, Any]],
    n_groups: int,
    device: torch.device,
    chunked: bool,
    rank: int = 0,
    world: int = 1,
) -> torch.Tensor:
    """Summed loss and target count per group, [2, n_groups], over this rank's share of `batches`, summed
    over ranks when a process group is up. `chunked`: the model takes `loss_groups` (the chunked head)."""
    from trainer.layers.loss import grouped_cross_entropy_from_logits

    totals = torch.zeros(2, n_groups, dtype=torch.float32, device=device)
    mine = list(batches[rank::world])
    rounds = math.ceil(len(batches) / world) if batches else 0
    was_training = model.training
    model.eval()
    try:
        for i in range(rounds):
            batch = _to(mine[i] if i < len(mine) else _empty_like(batches[0]), device)
            groups = batch.pop("loss_groups")
            # No KV cache: with one, Transformers would not read the packed examples' borders.
            if chunked:
                out = model(**batch, use_cache=False, loss_groups=groups, n_groups=n_groups)
                totals += out.loss.float()
            else:
                labels = batch.pop("labels")
                out = model(**batch, use_cache=False)
                totals += grouped_cross_entropy_from_logits(out.logits, labels, groups, n_groups)
    finally:
        model.train(was_training)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(totals)
    return totals


def time_forwards(
    model: Any,
    batches: Sequence[dict[str, Any]],
    device: torch.device,
    chunked: bool,
    rank: int = 0,
    world: int = 1,
) -> dict[str, Any] | None:
    """A validation pass's forwards timed one round at a time (each rank one micro-batch of `batches`,
    then the all-reduce that ends a pass, then the summed totals read back: the device is done): the
    first round apart (`first_s`: the path warms up), the median of the others (`forward_s`), their
    spread, and the shape of a micro-batch (rows, tokens other than padding). None with fewer than two
    rounds of batches."""
    rounds = len(batches) // max(1, world)
    if rounds < 2:
        return None
    groups = 1 + max(int(b["loss_groups"].max()) for b in batches)
    seconds = []
    for i in range(rounds):
        chunk = batches[i * world : (i + 1) * world]
        t0 = time.perf_counter()
        group_sums(model, chunk, max(1, groups), device, chunked, rank, world).tolist()
        seconds.append(time.perf_counter() - t0)
    timed = seconds[1:]
    shape = batches[rank % len(batches)]
    return {
        "first_s": round(seconds[0], 4),
        "forward_s": round(statistics.median(timed), 4),
        "forward_sd_s": round(statistics.stdev(timed), 4) if len(timed) > 1 else None,
        "forwards": len(timed),
        "rows": int(shape["input_ids"].shape[0]),
        "tokens": int((shape["loss_groups"] >= 0).sum()),
    }


def tenant_losses(totals: torch.Tensor, tenants: Sequence[str]) -> dict[str, float]:
    """Each tenant's mean loss a target token (tenants with no target left out)."""
    sums, counts = totals.tolist()
    return {t: s / c for t, s, c in zip(tenants, sums, counts, strict=True) if c > 0}


class ValidationCallback(TrainerCallback):
    """Validation loss at the start, every `eval_steps` and at the last step; `val_loss` events (rank 0
    writes them), and an `early_stop` event when early stopping ends the run. With a `keeper`
    (`trainer.evaluation.best_adapter`), each validation is offered to it: the best adapter is kept as
    training goes on. With `log` (the Trainer's `log`), each validation also reaches the Trainer's callbacks
    as `eval_loss` and `eval_loss/TENANT`, as the Trainer's own evaluation does: the trackers of
    `training.report_to` get it (TensorBoard as `eval/loss`)."""

    def __init__(
        self,
        writer: EventWriter,
        batches: list[dict[str, Any]],
        tenants: list[str],
        eval_steps: int,
        model: Callable[[], Any],
        chunked: bool,
        early: EarlyStopping,
        facts: dict[str, Any],
        pause_clock: Callable[[float], None] | None = None,
        step_offset: int = 0,
        keeper: AdapterKeeper | None = None,
        log: Callable[[dict[str, float]], None] | None = None,
    ) -> None:
        self.writer = writer
        self.batches = batches
        self.tenants = tenants
        self.eval_steps = eval_steps
        self.model = model
        self.chunked = chunked
        self.early = early
        self.facts = facts  # examples, tokens, the split drawn from: written with every event
        self.pause_clock = pause_clock
        self.step_offset = step_offset
        self.keeper = keeper
        self.log = log
        self.stopped: str | None = None
        self._last_step = -1

    def validate(self, args: Any, state: Any) -> dict[str, Any] | None:
        step = state.global_step
        if step == self._last_step or not self.batches:
            return None
        self._last_step = step
        t0 = time.perf_counter()
        totals = group_sums(
            self.model(), self.batches, len(self.tenants), args.device, self.chunked,
            args.process_index, args.world_size,
        )  # fmt: skip
        per_tenant = tenant_losses(totals, self.tenants)
        seconds = time.perf_counter() - t0
        if self.pause_clock is not None:
            self.pause_clock(seconds)
        loss = sum(per_tenant.values()) / max(1, len(per_tenant))
        event = {
            "step": step + self.step_offset,
            "epoch": round(state.epoch or 0.0, 4),
            "loss": round(loss, 5),
            "tenant_loss": {t: round(v, 5) for t, v in per_tenant.items()},
            "eval_s": round(seconds, 3),
            **self.facts,
        }
        if state.is_world_process_zero:
            self.writer.write("val_loss", **event)
            shown = " ".join(f"{t} {v:.3f}" for t, v in per_tenant.items())
            print(f"val step {event['step']} loss {loss:.4f} ({shown}) in {seconds:.1f} s", flush=True)
        return event

    def report(self, event: dict[str, Any], control: Any) -> None:
        """The validation to the Trainer's callbacks through `log` (every rank, as the Trainer logs: they
        write on rank 0). The Trainer's `log` clears `should_log`, which the step's own loss line waits on
        after this step's callbacks: it is put back."""
        if self.log is None:
            return
        should_log = control.should_log
        self.log(
            {"eval_loss": event["loss"], **{f"eval_loss/{t}": v for t, v in event["tenant_loss"].items()}}
        )
        control.should_log = should_log

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        event = self.validate(args, state)
        if event is not None:
            self.report(event, control)
            self.early.observe(event["step"], event["loss"])
            self.keep(event, last=False)  # a resumed run's first validation is of a trained adapter

    def keep(self, event: dict[str, Any], last: bool) -> None:
        """Offer a validation to the keeper (every rank: keeping a copy is a collective save)."""
        if self.keeper is None:
            return
        kept = self.keeper.offer(event["step"], event["loss"], last)
        if kept is not None and kept["path"] is not None and self.pause_clock is not None:
            self.pause_clock(kept["save_s"])  # the copy's save is no training step's time either

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        last = state.global_step >= state.max_steps
        if not self.eval_steps or not (state.global_step % self.eval_steps == 0 or last):
            return
        event = self.validate(args, state)
        if event is None:
            return
        self.report(event, control)
        self.keep(event, last)
        if last:
            return
        reason = self.early.observe(event["step"], event["loss"])
        if reason is None:
            return
        self.stopped = reason
        control.should_training_stop = True
        if state.is_world_process_zero:
            self.writer.write(
                "early_stop",
                step=event["step"],
                best_step=self.early.best_step,
                best_loss=round(self.early.best or 0.0, 5),
                patience=self.early.patience,
                min_delta=self.early.min_delta,
                reason=reason,
            )
            print(f"[cockpit] early stop at step {event['step']}: {reason}", flush=True)
