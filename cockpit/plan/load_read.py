"""What a load reads from disk: the 16-bit checkpoint the first time, the NF4 cache after.

The layer-by-layer loader keeps what it quantized (`trainer/weights/nf4_cache.py`, docs/load_cache.md): the
next load of the same checkpoint and settings (a second run, a resume, evaluation's reload) reads the packed
model instead, with no quantization. The cache holds exactly what the weights hold after load: NF4
codes, their scales and bitsandbytes' quantization state of every quantized tensor, and the rest in the
compute dtype, so its bytes are the plan's `Weights.stored_bytes` (measured on the story's 8-layer slice:
the plan 12,762,544,256 bytes, the cache 12,762,630,560 with its headers). Both are read at one assumed
disk rate (`Assumptions.disk_gbps`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cockpit import model_cache
from cockpit.units import about, size

GB = 1e9


@dataclass(frozen=True)
class LoadRead:
    """The checkpoint's and the NF4 cache's bytes, and reading each at the assumed disk rate."""

    checkpoint_bytes: int
    cache_bytes: int  # the packed model as the cache keeps it; 0 when no cache is kept
    disk_gbps: float
    cache_off: str = ""  # why no cache is kept ("" when one is)

    @property
    def checkpoint_s(self) -> float:
        """Seconds to read the 16-bit checkpoint once."""
        return self.checkpoint_bytes / (self.disk_gbps * GB)

    @property
    def cache_s(self) -> float | None:
        """Seconds to read the NF4 cache once (None without a cache)."""
        return self.cache_bytes / (self.disk_gbps * GB) if self.cache_bytes else None

    def words(self) -> str:
        """One line: the first load's read, the cached load's, and the cache's disk use."""
        first = (
            f"first: the checkpoint {size(self.checkpoint_bytes, binary=False)} at {self.disk_gbps:g} GB/s"
        )
        first += f", {about(self.checkpoint_s)}, then quantized"
        if self.cache_s is None:
            return f"{first}; no NF4 cache ({self.cache_off})"
        return (
            f"{first}; a second run, a resume or evaluation's reload reads the NF4 cache: "
            f"{size(self.cache_bytes, binary=False)}, {about(self.cache_s)}, no quantization "
            f"({self.cache_bytes / self.checkpoint_bytes:.0%} of the bytes); the cache needs "
            f"{size(self.cache_bytes, binary=False)} of disk beside the checkpoint"
        )

    def to_dict(self) -> dict[str, Any]:
        """As the plan's JSON carries it (`load`)."""
        return {
            "checkpoint_bytes": self.checkpoint_bytes,
            "cache_bytes": self.cache_bytes,
            "disk_gbps": self.disk_gbps,
            "checkpoint_read_s": self.checkpoint_s,
            "cache_read_s": self.cache_s,
            "cache_off": self.cache_off,
        }


def load_read(profile: Any, weights: Any, loader: str, disk_gbps: float) -> LoadRead:
    """What a load of `profile` reads (`weights`: the plan's `Weights`; `loader`: the setup's)."""
    off = model_cache.off_reason(profile, loader)
    return LoadRead(
        checkpoint_bytes=weights.checkpoint_bytes,
        cache_bytes=0 if off else weights.stored_bytes,
        disk_gbps=disk_gbps,
        cache_off=off,
    )
