"""`cockpit.record.scalars`: every scalar of a record, exactly, as compare and export read it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cockpit.record import EventWriter, RunPaths
from cockpit.record.bulk import Block, merge_blocks
from cockpit.record.scalars import load_scalars

T0 = 1_796_000_000.0


def test_merged_blocks_of_another_rank_keep_their_rank() -> None:
    """Rank 1's step rows lose their `rank` column when slimmed; merged, they are still rank 1's."""
    parts = [Block("step", 1, {"t": np.array([1.0, 2.0]), "step": np.array([1.0, 2.0])}) for _ in range(2)]
    parts[1] = Block("step", 1, {"t": np.array([3.0, 4.0]), "step": np.array([3.0, 4.0])})
    (merged,) = merge_blocks(parts)
    assert merged.rank == 1 and merged.t.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_two_ranks_and_a_resume(tmp_path: Path) -> None:
    """Rank 0's steps, the memory peak over both ranks at each step, and a resume's repeated steps
    replacing the first attempt's (as the viewers show them); enough lines for the bulk reader's columns."""
    paths = RunPaths(tmp_path / "run")
    n = 100
    with (
        EventWriter(paths.events("trainer-rank0"), rank=0) as r0,
        EventWriter(paths.events("trainer-rank1"), rank=1) as r1,
    ):
        for w in (r0, r1):
            w.write("train_begin", at=T0, start_step=0, max_steps=n)
        for s in range(1, n + 1):
            r0.write(
                "step", at=T0 + s, step=s, loss=10.0 - s / 100, rss_mib=100.0 + s, cuda_peak_alloc_mib=500.0
            )
            r1.write("step", at=T0 + s + 0.01, step=s, rss_mib=90.0, cuda_peak_alloc_mib=500.0 + s)
        resume_t = T0 + n + 10
        r0.write("train_begin", at=resume_t, start_step=80, max_steps=n)  # resumed from step 80
        for s in range(81, n + 1):
            r0.write("step", at=resume_t + s, step=s, loss=1.0, rss_mib=100.0, cuda_peak_alloc_mib=400.0)
    scalars = load_scalars(paths.root)
    steps = scalars.column("step").tolist()
    assert steps == list(range(1, n + 1))
    loss = scalars.column("loss")
    assert loss[:80].tolist() == [10.0 - s / 100 for s in range(1, 81)] and set(loss[80:].tolist()) == {1.0}
    peaks = scalars.memory["cuda_peak_alloc_mib"]
    assert peaks[:80].tolist() == [500.0 + s for s in range(1, 81)]  # rank 1's, the higher
    assert set(peaks[80:].tolist()) == {400.0}  # the resumed attempt's: the first one's are replaced
