"""The trainer's fast paths (fused kernels, leaner forwards): put in place on a model's modules, and tried
first where they may not run here.

A fast path that fails here (a kernel that does not build for this GPU, a torch without the call) gives
way to the slow path for good, the failure logged once; out of memory and checkpointing's own stop
(`trainer.pass_through.PASS_THROUGH`) are raised, never taken for a failure.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from trainer.pass_through import PASS_THROUGH

log = logging.getLogger(__name__)
T = TypeVar("T")


class FastPath:
    """A fast path tried first and, from its first failure here on, left for the slow one."""

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


def swap_forwards(
    model: torch.nn.Module, matches: Callable[[torch.nn.Module], bool], forward: Callable[..., Any]
) -> int:
    """Give every module of `model` that `matches` the method `forward`; returns how many. A module whose
    forward accelerate has wrapped (`_hf_hook`: it moves the inputs to the module's GPU) keeps its own."""
    forward.cockpit_swapped = True  # type: ignore[attr-defined]
    count = 0
    for module in model.modules():
        if matches(module) and not hasattr(module, "_hf_hook"):
            module.forward = types.MethodType(forward, module)
            count += 1
    return count


def restore_forwards(model: torch.nn.Module, matches: Callable[[torch.nn.Module], bool]) -> int:
    """Undo `swap_forwards`: every module that `matches` and has a forward it gave takes its class's
    forward again (another instance forward, accelerate's, stays); returns how many."""
    count = 0
    for module in model.modules():
        own = vars(module).get("forward")
        if matches(module) and getattr(getattr(own, "__func__", None), "cockpit_swapped", False):
            del module.forward
            count += 1
    return count
