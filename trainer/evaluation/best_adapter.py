"""The best adapter: the one of lowest validation loss, kept while training goes on.

When a validation (`trainer.evaluation.validation`) beats every earlier one at a trained step (after step 0,
which is the base model: evaluation scores that anyway), every rank saves the adapter the way the final save
does (under ZeRO-3 the LoRA weights are gathered, rank 0 writes) into `adapter-best/step-<N>/`. Rank 0
then points `adapter-best/best.json` at it (an atomic rename: a reader sees the old best or the new,
never half of one) and removes the older copy. At the last step no copy is made: the final save is that
adapter. At the end (`trainer.recipe`), the best copy becomes the run's `adapter/` and the last
adapter goes to `adapter-last/`. `validation.early_stopping_min_delta` only says when to stop: the
adapter kept is the one of lowest loss, by any margin (a tie keeps the earlier one).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cockpit.record import EventWriter
from cockpit.record.atomic import write_json_atomic

POINTER = "best.json"


@dataclass(frozen=True)
class Best:
    """The lowest validation loss so far at a trained step, and where its adapter is."""

    step: int | None = None
    loss: float | None = None
    path: Path | None = None  # its copy; None for the last step's (the final save keeps that one)

    def beaten_by(self, step: int, loss: float) -> bool:
        """Whether a validation at `step` makes a new best: a trained step, a finite loss strictly lower."""
        return step > 0 and math.isfinite(loss) and (self.loss is None or loss < self.loss)


def read_best(folder: Path) -> Best:
    """The best a run kept before (a resumed run goes on from it); nothing when there is no readable
    pointer or its copy is gone."""
    try:
        data = json.loads((Path(folder) / POINTER).read_text(encoding="utf-8"))
        path = Path(folder) / str(data["path"])
        step, loss = int(data["step"]), float(data["val_loss"])
    except (OSError, ValueError, KeyError, TypeError):
        return Best()
    return Best(step, loss, path) if path.is_dir() else Best()


def _one_rank(value: int) -> int:
    return value


class AdapterKeeper:
    """Keeps a copy of the best adapter in `folder` as validations come (every rank calls `offer`)."""

    def __init__(
        self,
        folder: Path,
        save: Callable[[Path], None],
        writer: EventWriter,
        rank: int,
        agree: Callable[[int], int] = _one_rank,
    ) -> None:
        self.folder = Path(folder)
        self.save = save  # saves the adapter into a folder: a collective under ZeRO-3, rank 0 writes
        self.writer = writer
        self.rank = rank
        self.agree = agree  # rank 0's answer on every rank (their validation losses are the same sums)
        self.best = read_best(self.folder) if rank == 0 else Best()

    def offer(self, step: int, loss: float, last: bool) -> dict[str, Any] | None:
        """Fold one validation: when it is the new best, keep its adapter (a copy, unless `last`) and
        say so (a `best_adapter` event); returns the event's fields, or None."""
        if not self.agree(int(self.best.beaten_by(step, loss))):
            return None
        t0 = time.perf_counter()
        path = None if last else self.folder / f"step-{step:06d}"
        if path is not None:
            if self.rank == 0:
                shutil.rmtree(path, ignore_errors=True)  # a copy a crashed attempt left half-written
            self.save(path)
            if self.rank == 0:
                write_json_atomic(self.folder / POINTER, {"step": step, "val_loss": loss, "path": path.name})
                self._remove_others(keep=path)
        self.best = Best(step, loss, path)
        fields = {
            "step": step,
            "val_loss": loss,
            "path": str(path) if path is not None else None,
            "save_s": round(time.perf_counter() - t0, 3),
        }
        if self.rank == 0:
            self.writer.write("best_adapter", **fields)
            where = f"kept in {path}" if path is not None else "the last step's: the final save keeps it"
            print(f"[cockpit] best adapter: step {step}, validation loss {loss:.4f} ({where})", flush=True)
        return fields

    def _remove_others(self, keep: Path | None) -> None:
        for old in self.folder.glob("step-*"):
            if old != keep:
                shutil.rmtree(old, ignore_errors=True)

    def finish(self, last: int, adapter: Path, last_adapter: Path) -> dict[str, Any]:
        """At the end of a finished run, save the run's adapter into `adapter`: the best one when a
        validation picked one, else the last. Every rank saves once whichever way (which way is rank 0's
        business: the others write nothing). When the best is an earlier step's, the last adapter goes to
        `last_adapter` and the best copy is renamed to `adapter`. Returns the `adapter` event's fields:
        `step` (the adapter's), and with a best `val_loss`, `last_step`, `last_path`."""
        best = self.best
        fields: dict[str, Any] = {"step": last}
        if best.step is None:
            self.save(adapter)
            self.discard()
            return fields
        fields.update(step=best.step, val_loss=best.loss, last_step=last)
        if best.path is None or best.step == last:
            self.save(adapter)
            self.discard()
            return fields
        self.save(last_adapter)
        if self.rank != 0:
            return fields
        if not best.path.is_dir():  # the copy was removed by hand: the last adapter is the run's
            print(f"[cockpit] the best adapter's copy {best.path} is gone: keeping the last", flush=True)
            shutil.rmtree(adapter, ignore_errors=True)
            last_adapter.rename(adapter)
            return {"step": last}
        shutil.rmtree(adapter, ignore_errors=True)
        best.path.rename(adapter)
        self.discard()
        print(
            f"[cockpit] adapter: step {best.step}'s (validation loss {best.loss:.4f}, the lowest), not the "
            f"last step {last}'s (kept in {last_adapter})",
            flush=True,
        )
        return {**fields, "last_path": str(last_adapter)}

    def discard(self) -> None:
        """Rank 0: no copy is needed any more."""
        if self.rank == 0:
            shutil.rmtree(self.folder, ignore_errors=True)
