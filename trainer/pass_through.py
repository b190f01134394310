"""Exceptions that are control flow, never a sign that a fast path does not work here.

Out of memory, and the signal with which non-reentrant gradient checkpointing stops a recomputation once
it has what backward needs. A fast path (a Triton kernel, the packed attention) that catches its own
failures to fall back for good must raise these instead; `FastPath` does both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.utils.checkpoint

log = logging.getLogger(__name__)
T = TypeVar("T")

PASS_THROUGH: tuple[type[BaseException], ...] = (
    torch.OutOfMemoryError,
    getattr(torch.utils.checkpoint, "_StopRecomputationError", torch.OutOfMemoryError),
)


class FastPath:
    """A fast path (a Triton kernel) tried first and, from its first failure here on, left for the slow
    one: the failure is logged once, and `PASS_THROUGH` is raised rather than taken for a failure."""

    def __init__(self, name: str, instead: str) -> None:
        self.name, self.instead, self.failed = name, instead, False

    def run(self, fast: Callable[[], T]) -> T | None:
        """`fast()`; None where it fails, now or before (the caller then takes the slow path)."""
        if self.failed:
            return None
        try:
            return fast()
        except PASS_THROUGH:
            raise
        except Exception as exc:  # a kernel that does not build or run here
            self.failed = True
            log.warning("%s unavailable (%s: %s); %s", self.name, type(exc).__name__, exc, self.instead)
            return None
