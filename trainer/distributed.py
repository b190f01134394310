"""Where this rank stands in the job: its global rank, node, local index and host; and the CPU ranks' setup.

The DeepSpeed launcher (`deepspeed.launcher.launch`) sets `RANK`, `LOCAL_RANK`, `WORLD_SIZE`,
`CROSS_RANK` (the node's rank) and `CROSS_SIZE` (the number of nodes) in every rank's environment.
"""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass
from typing import Any


def _env_int(name: str, default: int) -> int:
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
        rank=_env_int("RANK", 0),
        local_rank=_env_int("LOCAL_RANK", 0),
        world_size=_env_int("WORLD_SIZE", 1),
        node_rank=_env_int("CROSS_RANK", 0),
        nodes=_env_int("CROSS_SIZE", 1),
        host=socket.gethostname(),
    )


def cpu_ranks_accelerator_config() -> dict[str, Any] | None:
    """Several ranks without CUDA: set up accelerate's state for DeepSpeed over gloo; None otherwise.

    Without a GPU, accelerate finds no distributed backend for DeepSpeed and counts one process, so the
    HF Trainer's batch size disagrees with DeepSpeed's world. Configured here first (gloo, DeepSpeed),
    the Trainer is told to use that state (`use_configured_state`) instead of making its own.
    """
    import torch

    if _env_int("WORLD_SIZE", 1) <= 1 or torch.cuda.is_available():
        return None
    from accelerate import PartialState

    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    PartialState(backend="gloo")
    return {"use_configured_state": True}


def rank0_says(value: int) -> int:
    """Rank 0's `value` on every rank: one all-reduce of a sum to which the other ranks give 0 (`value`
    itself with one rank, or with no process group). A decision that makes every rank join a collective
    (a save under ZeRO-3) is taken once, by rank 0, so no rank waits alone."""
    import torch

    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
        return value
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    flag = torch.tensor([value if dist.get_rank() == 0 else 0], dtype=torch.long, device=device)
    dist.all_reduce(flag)
    return int(flag.item())
