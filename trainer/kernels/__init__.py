"""Kernels of the packed NF4 experts: a pure-torch reference (`nf4_ref`) and Triton kernels (`nf4_triton`).

`nf4_ref` imports only torch; `nf4_triton` needs Triton, which runs on CUDA GPUs, or on the CPU under
`TRITON_INTERPRET=1` (numpy-backed, slow: tests only). `triton_status` says whether they run for a device.
"""

from __future__ import annotations

from functools import cache

import torch


@cache
def _interpreted() -> bool | str:
    """True/False: the kernels were built for Triton's interpreter or not; a str: why they do not import."""
    try:
        from triton.runtime.interpreter import InterpretedFunction

        from trainer.kernels import nf4_triton
    except Exception as exc:  # no triton, or one that does not load here
        return f"Triton does not import ({type(exc).__name__}: {exc})"
    return isinstance(nf4_triton._nf4_grouped_mm_kernel, InterpretedFunction)


def triton_status(device: torch.device) -> tuple[bool, str]:
    """(whether the Triton kernels run on tensors of `device`, why not)."""
    interpreted = _interpreted()
    if isinstance(interpreted, str):
        return False, interpreted
    if device.type == "cpu":
        return (True, "") if interpreted else (False, "Triton runs on the CPU only under TRITON_INTERPRET=1")
    if device.type != "cuda":
        return False, f"no Triton kernels for {device.type} tensors"
    if interpreted:
        return False, "TRITON_INTERPRET=1 with CUDA tensors"
    if torch.cuda.get_device_capability(device) < (8, 0):
        return False, "a GPU older than compute capability 8.0"
    return True, ""
