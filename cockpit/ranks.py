"""Where a rank stands in the job: its global rank, node, local index and host, from its environment.

The DeepSpeed launcher (`deepspeed.launcher.launch`) sets `RANK`, `LOCAL_RANK`, `WORLD_SIZE`,
`CROSS_RANK` (the node's rank) and `CROSS_SIZE` (the number of nodes) in every rank's environment; the
trainer and each rank's guard (`cockpit.service.guard`) read it here.
"""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass
from typing import Any


def env_int(name: str, default: int) -> int:
    """An integer from the environment, or `default` where it is unset or not a number."""
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


@dataclass(frozen=True)
class RankIdentity:
    """One rank of the job, as the launcher placed it."""

    rank: int
    local_rank: int
    world_size: int
    node_rank: int
    nodes: int
    host: str

    def fields(self) -> dict[str, Any]:
        """The `rank_start` event's fields (the event writer adds `rank` itself)."""
        fields = asdict(self)
        fields.pop("rank")
        return fields


def rank_identity() -> RankIdentity:
    """This process's place in the job, from the launcher's environment (rank 0 of 1 without one)."""
    return RankIdentity(
        rank=env_int("RANK", 0),
        local_rank=env_int("LOCAL_RANK", 0),
        world_size=env_int("WORLD_SIZE", 1),
        node_rank=env_int("CROSS_RANK", 0),
        nodes=env_int("CROSS_SIZE", 1),
        host=socket.gethostname(),
    )
