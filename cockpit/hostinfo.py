"""Facts about this machine and its libraries, for the manifest. Cheap: imports no torch."""

from __future__ import annotations

import contextlib
import platform
import socket
import sys
from importlib import metadata
from typing import Any

import psutil

LIBRARIES = ("cockpit", "torch", "transformers", "peft", "bitsandbytes", "deepspeed", "accelerate", "textual")


def library_versions() -> dict[str, str | None]:
    """Installed versions of the libraries a run depends on (None where missing)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def nvml_gpus(free: bool = False) -> tuple[list[dict[str, Any]], str]:
    """Every GPU NVML sees (index, name, total memory; with `free`, free memory too), and why the list is
    empty or short ("" when NVML answered)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:
        return [], f"NVML not available ({type(exc).__name__}: {exc})"
    gpus: list[dict[str, Any]] = []
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpu = {
                "index": index,
                "name": name.decode() if isinstance(name, bytes) else name,
                "mem_total_mib": round(memory.total / 2**20),
            }
            if free:
                gpu["mem_free_mib"] = round(memory.free / 2**20)
            gpus.append(gpu)
    except Exception as exc:
        return gpus, f"NVML failed while listing GPUs ({exc})"
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return gpus, ""


def gpu_inventory() -> list[dict[str, Any]]:
    """Name and memory of every GPU NVML sees; empty without a GPU or without NVML."""
    return nvml_gpus()[0]


def host_facts() -> dict[str, Any]:
    """Hostname, CPUs, RAM and GPUs of this machine."""
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python_executable": sys.executable,
        "cpu_count": psutil.cpu_count(logical=True),
        "ram_total_mib": round(psutil.virtual_memory().total / 2**20),
        "gpus": gpu_inventory(),
    }
