"""The trace reader's copy timeline and the bound it derives, on a small synthetic trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import trace_frames

ROOT = Path(__file__).resolve().parent.parent


def ev(cat: str, name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_copy_timeline_cuts_phases_and_bounds_the_step() -> None:
    """Forward: 10 ms of copies beside 4 of kernels; head: 2 of kernels; backward: 3 of copies beside 6
    of kernels (microseconds in the trace). Perfect overlap per phase: 10 + 2 + 6 = 18 ms; copies: 13."""
    events = [
        ev("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 0, 10_000),
        ev("kernel", "gemm", 2_000, 4_000),
        ev("user_annotation", "cockpit:head_loss", 12_000, 2_000),
        ev("kernel", "lm_head", 12_000, 2_000),
        ev("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 14_000, 3_000),
        ev("kernel", "gemm_backward", 15_000, 6_000),
        ev("user_annotation", "Optimizer.step#AdamW.step", 21_000, 500),
    ]
    rows = {r["phase"]: r for r in trace_frames.copy_timeline(events, steps=1)}
    assert rows["forward"]["copy_ms"] == pytest.approx(10) and rows["forward"]["kernel_ms"] == pytest.approx(
        4
    )
    assert rows["forward"]["overlap_ms"] == pytest.approx(4)
    assert rows["head and loss"]["kernel_ms"] == pytest.approx(2) and rows["head and loss"]["copy_ms"] == 0
    assert rows["backward"]["copy_ms"] == pytest.approx(3) and rows["backward"]["kernel_ms"] == pytest.approx(
        6
    )
    bound = trace_frames.phase_bound(list(rows.values()))
    assert bound == pytest.approx({"phase_bound_ms": 18.0, "copies_ms": 13.0})


@pytest.mark.parametrize("name", ["trace_frames_offload_now", "trace_frames_offload_prefetch2"])
def test_committed_reports_are_their_results_rendered(name: str) -> None:
    """The committed .md is what the committed .json renders to (`--rebuild`), the bound line included."""
    result = json.loads((ROOT / f"benchmarks/results/{name}.json").read_text())
    source = result.pop("trace")
    text = trace_frames.table(result, source)
    assert text == (ROOT / f"benchmarks/results/{name}.md").read_text()
    assert "overlapped perfectly within each phase" in text
