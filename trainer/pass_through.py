"""Exceptions that are control flow, never a sign that a fast path does not work here.

Out of memory, and the signal with which non-reentrant gradient checkpointing stops a recomputation once
it has what backward needs. A fast path (a Triton kernel, the packed attention) that catches its own
failures to fall back for good must raise these instead (`trainer.fast_path.FastPath` does).
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint

PASS_THROUGH: tuple[type[BaseException], ...] = (
    torch.OutOfMemoryError,
    getattr(torch.utils.checkpoint, "_StopRecomputationError", torch.OutOfMemoryError),
)
