"""DeepSpeed's CPU all-reduce buffers are removed once their launch has ended, and only theirs."""

from __future__ import annotations

import os
from pathlib import Path

from cockpit.service.shm import PREFIX, allreduce_buffers, remove_allreduce_buffers


def test_only_the_launch_s_own_buffers_are_removed(tmp_path: Path) -> None:
    uid = os.getuid()
    mine = [tmp_path / f"{PREFIX}_{uid}_127.0.0.1_29512_{rank}" for rank in (0, 1)]
    others = [
        tmp_path / f"{PREFIX}_{uid}_127.0.0.1_2951_0",  # a port that shares the digits
        tmp_path / f"{PREFIX}_{uid}_127.0.0.1_129512_0",
        tmp_path / f"{PREFIX}_{uid + 1}_127.0.0.1_29512_0",  # another user's
        tmp_path / "unrelated_29512_0",
    ]
    for path in [*mine, *others]:
        path.write_bytes(b"x" * 100)
    assert allreduce_buffers(29512, tmp_path) == mine
    assert remove_allreduce_buffers(29512, tmp_path) == 200
    assert not any(p.exists() for p in mine)
    assert all(p.exists() for p in others)
    assert remove_allreduce_buffers(29512, tmp_path) == 0
