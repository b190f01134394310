"""Triton kernels in the tests: built for Triton's CPU interpreter where no GPU is, skipped where Triton
does not import. Import this module before anything defines a kernel: without CUDA it sets
`TRITON_INTERPRET=1`, which Triton reads when a kernel is defined."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def interpreted(name: str) -> ModuleType:
    """`trainer.kernels.<name>`, its kernels running on the CPU; skips where Triton does not import, fails
    where it imports and its kernels still do not run here."""
    pytest.importorskip("triton")
    from trainer.kernels import triton_status

    module = importlib.import_module(f"trainer.kernels.{name}")
    ok, why = triton_status(torch.device("cpu"))
    assert ok, f"Triton imports but its kernels do not run on the CPU here: {why}"
    return module
