"""The plotted side of a run, folded from its events: loss (training, and validation overall and per
tenant), throughput, GPU memory, host RAM.

`RunView` holds what a header shows; `RunSeries` holds the curves, each a bounded `Series`, so a
viewer's memory does not grow with the length of the run. Both are fed the same events, as events
(`apply`) or as columns (`apply_block`, from `record.bulk`): the step and telemetry folds take columns
only (see `record.fold`), so either way gives the same result.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cockpit.record.bulk import Block
from cockpit.record.columns import list_width
from cockpit.record.downsample import DEFAULT_CAPACITY, Series, ema
from cockpit.record.fold import Fold
from cockpit.record.reader import Event
from cockpit.record.schema import CUDA_PEAK_ALLOC_MIB, LOSS, RSS_MIB, STEP, TOKENS_PER_S

LOSS_SMOOTHING = 0.9
GPU_FIELDS = ("gpu_mem_used_mib", "gpu_mem_total_mib", "gpu_util_pct", "gpu_power_w", "gpu_temp_c")
HOST_FIELDS = (
    "ram_used_mib",
    "ram_available_mib",
    "ram_total_mib",
    "swap_used_mib",
    "swap_total_mib",
    "run_rss_mib",
    "run_processes",
    "cpu_pct",
    "run_cpu_pct",
)


def _value(v: Any) -> float | None:
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


class RunSeries(Fold):
    """Curves and last readings of a run, updated event by event or block by block."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self.loss = Series(capacity)
        self.loss_smooth = Series(capacity, mode="mean")
        self._ema: tuple[float, int] = (0.0, 0)
        self.val_loss = Series(capacity)  # the trainer's validation loss (mean over tenants): val_loss events
        self.val_tenant_loss: dict[str, Series] = {}  # each tenant's validation loss
        self.tokens_per_s = Series(capacity)
        self.rank_peak: dict[int, Series] = {}  # trainer's CUDA peak allocation per rank (step events)
        self.rank_rss: dict[int, Series] = {}  # each rank's process RSS (step events)
        self.gpu_used: dict[int, Series] = {}
        self.gpu_total: dict[int, Series] = {}
        self.ram_used = Series(capacity)
        self.ram_total = Series(capacity)
        self.run_rss = Series(capacity)
        self.swap_used = Series(capacity)
        self.last_gpu: dict[int, dict[str, float | None]] = {}
        self.last_host: dict[str, float | None] = {}
        self.telemetry_info: dict[str, Any] | None = None
        self.telemetry_samples = 0
        self.output_log_bytes: int | None = None  # output.log's size at the last sample (None: not recorded)
        self.status: str | None = None  # from the supervisor's events: running, then the final status
        self.diagnosis: str | None = None
        self.end_t: float | None = None
        self.stop_requested = False

    def _series(self, table: dict[int, Series], key: int) -> Series:
        if key not in table:
            table[key] = Series(self.capacity)
        return table[key]

    # --- one fold per kind: step and telemetry rows in blocks, the rest event by event --------------
    def apply_block(self, block: Block, lo: int = 0, hi: int | None = None) -> None:
        """Rows `lo:hi` of a block (all of it by default)."""
        hi = len(block) if hi is None else hi
        if hi <= lo:
            return
        if block.kind == STEP:
            self._fold_steps(block.rank or 0, block.columns, lo, hi)
        elif block.kind == "telemetry":
            self._fold_telemetry(block.columns, lo, hi)

    def _fold_steps(self, rank: int, cols: dict[str, np.ndarray], lo: int, hi: int) -> None:
        t = cols["t"][lo:hi]
        if CUDA_PEAK_ALLOC_MIB in cols:
            self._series(self.rank_peak, rank).extend(t, cols[CUDA_PEAK_ALLOC_MIB][lo:hi])
        if RSS_MIB in cols:
            self._series(self.rank_rss, rank).extend(t, cols[RSS_MIB][lo:hi])
        if rank != 0:
            return
        if LOSS in cols:
            loss = cols[LOSS][lo:hi]
            self.loss.extend(t, loss)
            ok = np.isfinite(loss)
            smooth, self._ema = ema(loss[ok], LOSS_SMOOTHING, self._ema)
            self.loss_smooth.extend(t[ok], smooth)
        if TOKENS_PER_S in cols:
            self.tokens_per_s.extend(t, cols[TOKENS_PER_S][lo:hi])

    def _fold_telemetry(self, cols: dict[str, np.ndarray], lo: int, hi: int) -> None:
        t = cols["t"][lo:hi]
        self.telemetry_samples += hi - lo
        last = hi - 1
        for i in range(list_width(cols, "gpu_mem_used_mib")):
            used = cols[f"gpu_mem_used_mib[{i}]"]
            total = cols.get(f"gpu_mem_total_mib[{i}]")
            self._series(self.gpu_used, i).extend(t, used[lo:hi])
            if total is not None:
                self._series(self.gpu_total, i).extend(t, total[lo:hi])
            self.last_gpu[i] = {
                f: _value(c[last]) if (c := cols.get(f"{f}[{i}]")) is not None else None for f in GPU_FIELDS
            }
        self.last_host = {f: _value(cols[f][last]) for f in HOST_FIELDS if f in cols}
        if "output_log_bytes" in cols:
            self._note_output(cols["output_log_bytes"][last])
        for name, series in (
            ("ram_used_mib", self.ram_used),
            ("ram_total_mib", self.ram_total),
            ("run_rss_mib", self.run_rss),
            ("swap_used_mib", self.swap_used),
        ):
            if name in cols:
                series.extend(t, cols[name][lo:hi])

    def _on_val_loss(self, e: Event) -> None:
        if e.get("rank", 0) != 0:
            return
        self.val_loss.append(e["t"], _value(e.get("loss")))
        for tenant, loss in (e.get("tenant_loss") or {}).items():
            if tenant not in self.val_tenant_loss:
                self.val_tenant_loss[tenant] = Series(self.capacity)
            self.val_tenant_loss[tenant].append(e["t"], _value(loss))

    def _on_telemetry_start(self, e: Event) -> None:
        self.telemetry_info = e
        self._note_output(e.get("output_log_bytes"))

    def _note_output(self, size: Any) -> None:
        value = _value(size)
        if value is not None:
            self.output_log_bytes = int(value)

    def _on_supervisor_start(self, e: Event) -> None:
        self.status, self.diagnosis, self.end_t, self.stop_requested = "running", None, None, False

    def _on_stop_request(self, e: Event) -> None:
        self.stop_requested = True

    def _on_end(self, e: Event) -> None:
        self.status = e.get("status")
        self.diagnosis = e.get("diagnosis")
        self.end_t = e["t"]

    @property
    def has_gpus(self) -> bool:
        return bool(self.gpu_used)

    def nbytes(self) -> int:
        """Memory held by the curves."""
        tables = [self.rank_peak, self.rank_rss, self.gpu_used, self.gpu_total, self.val_tenant_loss]
        singles = [
            self.loss,
            self.loss_smooth,
            self.val_loss,
            self.tokens_per_s,
            self.ram_used,
            self.ram_total,
            self.run_rss,
        ]
        return sum(s.nbytes() for s in singles + [s for t in tables for s in t.values()])
