"""The telemetry sampler: about once a second, GPU and host readings into `events/telemetry.jsonl`.

Started by the supervisor with the run and stopped at its end; it owns its own event file.

Per GPU (NVML): memory used and total, utilization, power, temperature, as lists indexed by GPU
(`gpu_mem_used_mib: [..]`). A field a device does not support is null for that GPU ("not
available"), a field no GPU supports is absent, and without a GPU or without NVML every GPU field
is absent: nothing here raises because of a missing or old driver. The host (psutil): RAM used,
available and total, swap, CPU utilization, and the resident memory and CPU of the run's process
tree (the root pid and all its descendants: the launcher and every rank).

Usage: `python -m cockpit.service.telemetry RUN_DIR --root-pid PID [--interval 1.0]`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from cockpit.record import EventWriter, RunPaths

MIB = 2**20
INTERVAL_S = 1.0
GPU_FIELDS = ("gpu_mem_used_mib", "gpu_mem_total_mib", "gpu_util_pct", "gpu_power_w", "gpu_temp_c")


def _try(fn: Callable[..., Any], *args: Any) -> Any:
    """Call an NVML function; any error (not supported, lost GPU, ...) becomes None."""
    try:
        return fn(*args)
    except Exception:
        return None


class Nvml:
    """NVML, wrapped so that every reading is a number or None and nothing raises."""

    def __init__(self) -> None:
        self.error: str | None = None
        self.handles: list[Any] = []
        self.names: list[str] = []
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:  # no library, no driver, no GPU
            self.error = f"not available: {exc}".strip()
            self._nvml = None
            return
        self._nvml = pynvml
        count = _try(pynvml.nvmlDeviceGetCount) or 0
        for index in range(count):
            # A GPU whose handle fails keeps its place (None), so GPU i stays at index i in every list.
            handle = _try(pynvml.nvmlDeviceGetHandleByIndex, index)
            name = _try(pynvml.nvmlDeviceGetName, handle) if handle is not None else None
            self.handles.append(handle)
            self.names.append(name.decode() if isinstance(name, bytes) else str(name or f"GPU {index}"))

    @property
    def available(self) -> bool:
        return self._nvml is not None and any(h is not None for h in self.handles)

    def read(self, handle: Any) -> dict[str, float | None]:
        nv = self._nvml
        assert nv is not None
        if handle is None:
            return dict.fromkeys(GPU_FIELDS)
        memory = _try(nv.nvmlDeviceGetMemoryInfo, handle)
        util = _try(nv.nvmlDeviceGetUtilizationRates, handle)
        power_mw = _try(nv.nvmlDeviceGetPowerUsage, handle)
        temp = _try(nv.nvmlDeviceGetTemperature, handle, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
        return {
            "gpu_mem_used_mib": round(memory.used / MIB, 1) if memory is not None else None,
            "gpu_mem_total_mib": round(memory.total / MIB, 1) if memory is not None else None,
            "gpu_util_pct": float(util.gpu) if util is not None else None,
            "gpu_power_w": round(power_mw / 1000, 1) if power_mw is not None else None,
            "gpu_temp_c": float(temp) if temp is not None else None,
        }

    def sample(self) -> dict[str, list[float | None]]:
        """Per-GPU lists; a field that no GPU supports is left out."""
        if not self.available:
            return {}
        readings = [self.read(h) for h in self.handles]
        out: dict[str, list[float | None]] = {}
        for field in GPU_FIELDS:
            values = [r[field] for r in readings]
            if any(v is not None for v in values):
                out[field] = values
        return out

    def shutdown(self) -> None:
        if self._nvml is not None:
            _try(self._nvml.nvmlShutdown)


class ProcessTree:
    """The run's processes: a root pid and its descendants, remembered for CPU percentages."""

    def __init__(self, root_pid: int | None) -> None:
        self.root_pid = root_pid
        self._procs: dict[int, psutil.Process] = {}

    def sample(self) -> dict[str, float]:
        if self.root_pid is None:
            return {}
        try:
            root = psutil.Process(self.root_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return {"run_processes": 0, "run_rss_mib": 0.0}
        rss = 0
        cpu = 0.0
        alive: dict[int, psutil.Process] = {}
        me = os.getpid()
        for proc in procs:
            if proc.pid == me:  # the sampler is started under the supervisor: do not count itself
                continue
            proc = self._procs.get(proc.pid, proc)  # the same object keeps its CPU-time baseline
            try:
                rss += proc.memory_info().rss
                cpu += proc.cpu_percent(None)
            except psutil.Error:
                continue
            alive[proc.pid] = proc
        self._procs = alive
        return {"run_processes": len(alive), "run_rss_mib": round(rss / MIB, 1), "run_cpu_pct": round(cpu, 1)}


def host_sample() -> dict[str, float]:
    vm = psutil.virtual_memory()
    swap = psutil.swap_memory()
    return {
        "ram_used_mib": round((vm.total - vm.available) / MIB, 1),
        "ram_available_mib": round(vm.available / MIB, 1),
        "ram_total_mib": round(vm.total / MIB, 1),
        "swap_used_mib": round(swap.used / MIB, 1),
        "swap_total_mib": round(swap.total / MIB, 1),
        "cpu_pct": psutil.cpu_percent(None),
    }


class Sampler:
    """Writes a `telemetry_start` event, then one `telemetry` event per interval until stopped."""

    def __init__(self, run_dir: Path, root_pid: int | None, interval_s: float = INTERVAL_S) -> None:
        self.paths = RunPaths(Path(run_dir))
        self.interval_s = interval_s
        self.tree = ProcessTree(root_pid)
        self.nvml = Nvml()
        self.writer = EventWriter(self.paths.events("telemetry"))
        self._stop = False
        psutil.cpu_percent(None)  # the first call only sets the baseline

    def start_event(self) -> dict[str, Any]:
        return self.writer.write(
            "telemetry_start",
            pid=os.getpid(),
            root_pid=self.tree.root_pid,
            interval_s=self.interval_s,
            nvml="ok" if self.nvml.available else (self.nvml.error or "no GPU"),
            gpus=[{"index": i, "name": n} for i, n in enumerate(self.nvml.names)],
            output_log_bytes=self.output_log_bytes(),
        )

    def output_log_bytes(self) -> int:
        """How much the run has printed so far: `output.log`'s size (its lines carry no time; a replay's
        log pane shows what was printed by its clock from these)."""
        try:
            return self.paths.output_log.stat().st_size
        except OSError:
            return 0

    def sample(self) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        fields.update(self.nvml.sample())
        fields.update(host_sample())
        fields.update(self.tree.sample())
        fields["output_log_bytes"] = self.output_log_bytes()
        return self.writer.write("telemetry", **fields)

    def stop(self, *_args: Any) -> None:
        self._stop = True

    def run(self, max_samples: int | None = None) -> int:
        """Sample until stopped (SIGTERM/SIGINT), the root process is gone, or `max_samples` is reached."""
        parent = os.getppid()
        n = 0
        next_t = time.monotonic()
        try:
            self.start_event()
            while not self._stop:
                self.sample()
                n += 1
                if max_samples is not None and n >= max_samples:
                    break
                if self.tree.root_pid is not None and not psutil.pid_exists(self.tree.root_pid):
                    break
                if os.getppid() != parent:  # the supervisor is gone: do not outlive it
                    break
                next_t += self.interval_s
                delay = next_t - time.monotonic()
                if delay < 0:  # fell behind (a suspended machine): start afresh rather than burst
                    next_t, delay = time.monotonic(), 0.0
                end = time.monotonic() + delay
                while not self._stop and time.monotonic() < end:
                    time.sleep(min(0.1, max(0.0, end - time.monotonic())))
        except OSError as exc:  # a full disk: the run's own lines matter more than these
            print(f"telemetry: stopped writing: {exc}", file=sys.stderr)
            return 0
        finally:
            with contextlib.suppress(OSError):
                self.writer.write("telemetry_end", samples=n)
            with contextlib.suppress(OSError):
                self.writer.close()
            self.nvml.shutdown()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cockpit.service.telemetry", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument(
        "--root-pid", type=int, default=None, help="the run's root process (its tree's RSS is sampled)"
    )
    parser.add_argument("--interval", type=float, default=INTERVAL_S, help="seconds between samples")
    parser.add_argument("--samples", type=int, default=None, help="stop after this many samples")
    args = parser.parse_args(argv)
    sampler = Sampler(args.run_dir, args.root_pid, args.interval)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, sampler.stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    return sampler.run(args.samples)


if __name__ == "__main__":
    sys.exit(main())
