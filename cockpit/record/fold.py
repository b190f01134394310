"""Folding events into a state, one way for every path the lines take.

The many-lined kinds (step, telemetry) are folded as `Block`s of numeric columns only: `record.bulk`
reads them so from a long record, and `split` gathers parsed events (a live poll, a preview) into the
same blocks, so each kind has one fold. Every other kind goes to an `_on_<kind>` handler, event by event.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from cockpit.record.bulk import FAST_KINDS, Block
from cockpit.record.columns import columns_of, layout
from cockpit.record.reader import Event


def _rank(event: Event) -> int | None:
    rank = event.get("rank")
    return int(rank) if isinstance(rank, int | float) and rank == rank else None


def split(events: Iterable[Event]) -> Iterator[Block | Event]:
    """The events in their order, except that step and telemetry events are gathered into blocks.

    A block holds consecutive rows of one kind, rank and layout, and is yielded before the next event
    of any other kind, so those see every row before them folded. Rows of different kinds or ranks
    between two such events may be folded in either order: no fold depends on that order (the bulk
    reader folds its blocks the same way).
    """
    runs: dict[tuple[str, int | None], tuple[tuple[Any, ...], list[Event]]] = {}
    for e in events:
        kind = e["kind"]
        if kind not in FAST_KINDS:
            yield from _flush(runs)
            yield e
            continue
        key = (kind, _rank(e))
        shape = layout(e)
        run = runs.get(key)
        if run is not None and run[0] != shape:
            yield Block(kind, key[1], columns_of(run[1], run[0]))
            run = None
        if run is None:
            runs[key] = (shape, [e])
        else:
            run[1].append(e)
    yield from _flush(runs)


def _flush(runs: dict[tuple[str, int | None], tuple[tuple[Any, ...], list[Event]]]) -> Iterator[Block]:
    for (kind, rank), (shape, rows) in runs.items():
        yield Block(kind, rank, columns_of(rows, shape))
    runs.clear()


class Fold:
    """A state folded from events in time order: `apply` for events, `apply_block` for column rows."""

    def apply(self, events: Iterable[Event]) -> None:
        """Fold new events (already merged by time)."""
        for item in split(events):
            self.fold(item)

    def fold(self, item: Block | Event) -> None:
        """Fold one item of `split`."""
        if isinstance(item, Block):
            self.apply_block(item)
        else:
            self.apply_event(item)

    def apply_event(self, e: Event) -> None:
        """Fold one event of a kind that is not folded in blocks."""
        handler = getattr(self, f"_on_{e['kind']}", None)
        if handler is not None:
            handler(e)

    def apply_block(self, block: Block, lo: int = 0, hi: int | None = None) -> None:
        """Fold rows `lo:hi` of a block (all of it by default)."""
        raise NotImplementedError
