"""The GPU a kernel launches on: Triton launches on the current device, and a layer may sit on another."""

from __future__ import annotations

import contextlib
from typing import Any

import torch


def on_device(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The tensors' GPU as the current device while a kernel launches (nothing to switch off CUDA)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
