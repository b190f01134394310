"""RunView: the fold every viewer shares."""

from __future__ import annotations

import json
import math

import numpy as np

from cockpit.record.bulk import Block
from cockpit.record.columns import columns_of, parse_uniform
from cockpit.record.fold import split
from cockpit.record.series import RunSeries
from cockpit.record.view import RunView


def step(t: float, n: int, loss: float, rank: int = 0, dt: float = 2.0) -> dict:
    return {"t": t, "kind": "step", "rank": rank, "step": n, "max_steps": 10, "loss": loss, "step_time_s": dt}


def test_steps_progress_eta_and_trend() -> None:
    view = RunView()
    view.apply([{"t": 0.0, "kind": "train_begin", "rank": 0, "max_steps": 10, "start_step": 0}])
    view.apply([step(float(i), i, 10.0 - i) for i in range(1, 5)])
    assert view.step == 4 and view.max_steps == 10
    assert view.last_loss == 6.0
    assert view.eta_s() == 6 * 2.0
    first, last = view.loss_trend(fraction=0.25)
    assert first == 9.0 and last == 6.0


def test_other_ranks_give_memory_not_steps() -> None:
    view = RunView()
    event = step(1.0, 1, 5.0, rank=1) | {"cuda_peak_alloc_mib": 123.0}
    view.apply([event])
    assert view.steps == []
    assert view.memory[1]["cuda_peak_alloc_mib"] == 123.0


def test_resume_replaces_steps_after_the_checkpoint() -> None:
    view = RunView()
    view.apply([step(float(i), i, 1.0) for i in range(1, 8)])
    view.apply([{"t": 10.0, "kind": "train_begin", "rank": 0, "max_steps": 10, "start_step": 5}])
    view.apply([step(10.0 + i, i, 0.5) for i in range(6, 11)])
    assert [s.step for s in view.steps] == list(range(1, 11))
    assert [s.loss for s in view.steps][5:] == [0.5] * 5


def test_audit_warnings_and_phase() -> None:
    view = RunView()
    view.apply(
        [
            {"t": 1.0, "kind": "phase", "rank": 0, "phase": "load"},
            {"t": 2.0, "kind": "audit", "rank": 0, "warnings": ["experts: not in 4 bit"]},
        ]
    )
    assert view.phase == "load"
    assert view.warnings == ["experts: not in 4 bit"]


# --- one fold per kind: events go through the block fold -----------------------------------------------
def _kinds(items: list) -> list[tuple]:
    return [(i.kind, i.rank, len(i)) if isinstance(i, Block) else (i["kind"],) for i in items]


def test_split_gathers_rows_into_blocks_and_keeps_other_events_in_place() -> None:
    events = [
        step(1.0, 1, 3.0),
        step(1.1, 1, 3.0, rank=1),
        {"t": 1.2, "kind": "telemetry", "ram_used_mib": 5.0, "gpu_mem_used_mib": [1.0, 2.0]},
        step(2.0, 2, 2.0),
        {"t": 3.0, "kind": "train_begin", "rank": 0, "max_steps": 10, "start_step": 1},
        step(4.0, 2, 1.0),
        step(5.0, 3, 1.0) | {"grad_norm": 0.5},  # another layout: a new block, after the first
    ]
    items = list(split(events))
    assert _kinds(items) == [
        ("step", 0, 2),
        ("step", 1, 1),
        ("telemetry", None, 1),
        ("train_begin",),
        ("step", 0, 1),
        ("step", 0, 1),
    ]
    telemetry = items[2].columns
    assert telemetry["gpu_mem_used_mib[1]"].tolist() == [2.0] and "kind" not in telemetry


def test_columns_of_events_equal_the_columns_parsed_from_their_lines() -> None:
    events = [
        {"t": 1e9 + i, "kind": "telemetry", "n": i, "x": None if i % 3 else 0.5, "g": [float(i), None]}
        for i in range(100)
    ]
    parsed = parse_uniform([json.dumps(e).encode() for e in events])
    built = columns_of(events)
    assert parsed is not None and list(built) == list(parsed)
    for key in parsed:
        assert np.array_equal(built[key], parsed[key], equal_nan=True), key
    assert np.isnan(columns_of([{"t": 1.0, "v": {"a": 1}}])["v"][0])  # not a number: NaN, like a null


def test_event_by_event_and_block_folds_agree() -> None:
    """The same events, applied one at a time and as one block of columns, give the same state."""
    events = [
        step(float(i), i, 1.0 / i) | {"tokens_per_s": 100.0 + i, "cuda_peak_alloc_mib": 10.0 * i}
        for i in range(1, 80)
    ]
    events[40]["loss"] = None
    one_view, one_series = RunView(), RunSeries()
    for e in events:
        one_view.apply([e])
        one_series.apply([e])
    block = Block("step", 0, parse_uniform([json.dumps(e).encode() for e in events]))
    bulk_view, bulk_series = RunView(), RunSeries()
    bulk_view.apply_block(block)
    bulk_series.apply_block(block, 0, len(block))
    # A step's null loss is the NaN an older writer wrote as null (it writes "nan" now): shown as nan.
    assert all(math.isnan(v.steps[40].loss) for v in (one_view, bulk_view))
    for v in (one_view, bulk_view):
        v.steps[40].loss = None  # NaN != NaN: the rest must be equal
    assert one_view == bulk_view and one_view.events_seen == 79
    for name in ("loss", "loss_smooth", "tokens_per_s"):
        a, b = getattr(one_series, name), getattr(bulk_series, name)
        assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y), name
    assert np.array_equal(one_series.rank_peak[0].y, bulk_series.rank_peak[0].y)


def test_a_block_of_any_kind_counts_its_rows_and_times() -> None:
    view = RunView()
    t = np.array([5.0, 6.0, 7.0])
    view.apply_block(Block("telemetry", None, {"t": t, "ram_used_mib": t}), 1, 3)
    assert (view.events_seen, view.first_t, view.last_t) == (2, 6.0, 7.0) and view.steps == []
    view.apply([{"t": 2.0, "kind": "note", "message": "hi"}])
    assert (view.events_seen, view.first_t, view.last_t) == (3, 2.0, 7.0)
