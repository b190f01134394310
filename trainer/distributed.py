"""The CPU ranks' setup and what the ranks agree on; where a rank stands is `cockpit.ranks`."""

from __future__ import annotations

import os
from typing import Any

from cockpit.ranks import RankIdentity, env_int, rank_identity

__all__ = ["RankIdentity", "cpu_ranks_accelerator_config", "rank0_says", "rank_identity"]


def cpu_ranks_accelerator_config() -> dict[str, Any] | None:
    """Several ranks without CUDA: set up accelerate's state for DeepSpeed over gloo; None otherwise.

    Without a GPU, accelerate finds no distributed backend for DeepSpeed and counts one process, so the
    HF Trainer's batch size disagrees with DeepSpeed's world. Configured here first (gloo, DeepSpeed),
    the Trainer is told to use that state (`use_configured_state`) instead of making its own.
    """
    import torch

    if env_int("WORLD_SIZE", 1) <= 1 or torch.cuda.is_available():
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
