"""One line that says why a run ended: from the exit status, the output's tail and the record.

Pure functions over facts the supervisor gathered, so every branch is testable without a run.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

CUDA_OOM = re.compile(
    r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED"
)
NCCL_TIMEOUT = re.compile(
    r"Watchdog caught collective operation timeout|NCCL.{0,80}[Tt]imeout"
    r"|[Tt]imed out.{0,40}(collective|barrier)"
    r"|DistBackendError.{0,200}[Tt]imeout"
)
HOST_OOM_FRACTION = 0.90
# The DeepSpeed launcher reports a dead rank as "exits with return code = -9" and exits with it.
LAUNCHER_RC = re.compile(r"exits with return code = (-?\d+)")
TRACEBACK_LAST = re.compile(r"^(\w+(?:\.\w+)*(?:Error|Exception|Interrupt)\b.*)$", re.MULTILINE)


@dataclass(frozen=True)
class EndFacts:
    """What is known when the training processes have ended."""

    returncode: int | None
    output_tail: str
    stop_requested: bool = False
    stalled: bool = False
    stall_detail: str = ""
    host_ram_peak_fraction: float | None = None
    host_ram_peak_mib: float | None = None
    gpu_peak_mib: dict[int, float] | None = None
    trainer_outcome: str | None = None  # from the trainer's trainer_end event
    last_step: int | None = None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def killing_signal(facts: EndFacts) -> int | None:
    """The signal that killed a rank or the launcher, if one did."""
    rc = facts.returncode
    if rc is not None and rc < 0:
        return -rc
    found = LAUNCHER_RC.findall(facts.output_tail)
    for value in reversed(found):
        if int(value) < 0:
            return -int(value)
    if rc is not None and 128 < rc < 128 + 65:
        return rc - 128
    return None


def last_error_line(output: str) -> str:
    """The last `SomethingError: message` line of the output, trimmed."""
    matches = TRACEBACK_LAST.findall(output)
    return matches[-1].strip()[:300] if matches else ""


def _gpu_peaks(facts: EndFacts) -> str:
    if not facts.gpu_peak_mib:
        return ""
    parts = ", ".join(f"GPU{i} {mib / 1024:.1f} GiB" for i, mib in sorted(facts.gpu_peak_mib.items()))
    return f" (peak {parts})"


def diagnose(facts: EndFacts) -> tuple[str, str]:
    """(status, one-line diagnosis) for a run whose training processes have ended."""
    step = f" at step {facts.last_step}" if facts.last_step else ""
    if facts.stalled:
        return "stalled", f"stalled{step}: {facts.stall_detail}".rstrip(": ")
    if facts.returncode == 0 and facts.trainer_outcome in ("finished", None) and not facts.stop_requested:
        return "finished", f"finished{step}"
    if facts.stop_requested and (facts.returncode == 0 or facts.trainer_outcome == "stopped"):
        return "stopped", f"stopped by user{step}, checkpoint saved"
    if facts.stop_requested:
        return "stopped", f"stopped by user{step} (processes killed, exit {facts.returncode})"
    if CUDA_OOM.search(facts.output_tail):
        return "failed", f"CUDA out of memory{step}{_gpu_peaks(facts)}"
    if NCCL_TIMEOUT.search(facts.output_tail):
        return "failed", f"NCCL/collective timeout{step}: a rank stopped answering"
    sig = killing_signal(facts)
    if sig is not None:
        name = _signal_name(sig)
        if sig == signal.SIGKILL and (facts.host_ram_peak_fraction or 0) >= HOST_OOM_FRACTION:
            peak = f"{facts.host_ram_peak_mib / 1024:.1f} GiB, " if facts.host_ram_peak_mib else ""
            return "failed", (
                f"killed by SIGKILL{step} with host RAM at {peak}{facts.host_ram_peak_fraction:.0%} "
                "of total: likely host out-of-memory (kernel OOM killer)"
            )
        return "failed", f"killed by {name}{step}"
    error = last_error_line(facts.output_tail)
    detail = f": {error}" if error else ""
    return "failed", f"crashed{step} with exit code {facts.returncode}{detail}"
