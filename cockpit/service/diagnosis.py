"""One line that says why a run ended: from the exit status, the output's tail and the record.

Pure functions over facts the supervisor gathered, so every branch is testable without a run; and
`read_tail`, the output's tail they read.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cockpit.units import memory

CUDA_OOM = re.compile(
    r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED"
)
NCCL_TIMEOUT = re.compile(
    r"Watchdog caught collective operation timeout|NCCL.{0,80}[Tt]imeout"
    r"|[Tt]imed out.{0,40}(collective|barrier)"
    r"|DistBackendError.{0,200}[Tt]imeout"
)
TAIL_BYTES = 256 * 1024  # of the output, read for its last error and the launcher's exit words
HOST_OOM_FRACTION = 0.90
DISK_FULL_MIB = 2.0
DISK_FULL = re.compile(r"No space left on device|\[Errno 28\]|ENOSPC")
# The DeepSpeed launcher reports a dead rank as "exits with return code = -9" and exits with it.
LAUNCHER_RC = re.compile(r"exits with return code = (-?\d+)")
TRACEBACK_LAST = re.compile(
    r"^(?:\[rank\d+\]:\s*)?(\w+(?:\.\w+)*(?:Error|Exception|Interrupt)\b.*)$", re.MULTILINE
)


# What a rank says when another rank went away first: gloo's closed connections, NCCL's errors and
# timeouts. Never the cause when a rank failed on its own.
COLLECTIVE_ERROR = re.compile(
    r"gloo|nccl|DistBackendError|DistNetworkError|DistStoreError|Connection (?:closed|reset) by peer"
    r"|Broken pipe|collective",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class RankFault:
    """The rank that failed first on its own, where it ran, and how it ended."""

    rank: int
    host: str
    node: int | None  # its node, when the job spans several
    kind: str  # signal, oom, error, exit, collective
    how: str  # "killed by SIGKILL", "RuntimeError: ...", "exit code 3"
    signal: int | None = None

    @property
    def who(self) -> str:
        """`rank 1 on gpu-b (node 1)`: the rank, its host, and its node when there are several."""
        return rank_words(self.rank, self.host, self.node)


def rank_words(rank: int, host: str, node: int | None) -> str:
    """`rank 1 on gpu-b (node 1)`: a rank, its host, and its node when the job has several."""
    return f"rank {rank}" + (f" on {host}" if host else "") + (f" (node {node})" if node is not None else "")


def placed(rank: int, info: Mapping[str, Any]) -> str:
    """`rank_words` from a rank's `rank_start` (or `rank_exit`) fields."""
    several = int(info.get("nodes") or 1) > 1
    node = int(info["node_rank"]) if several and info.get("node_rank") is not None else None
    return rank_words(rank, str(info.get("host") or ""), node)


# A Python stack (faulthandler's dump, innermost frame first) whose innermost frames are a collective's:
# the rank waits for the others.
COLLECTIVE_FRAME = re.compile(
    r"torch/distributed/|deepspeed/comm/|in (?:all_reduce|all_gather\w*|barrier|broadcast|reduce_scatter\w*"
    r"|wait|_wait|synchronize)$"
)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)', re.MULTILINE)


def main_stack(dump: str) -> list[tuple[str, int, str]]:
    """The dumping thread's frames, innermost first, from `faulthandler`'s text: (file, line, function)."""
    blocks = re.split(r"^(?=(?:Current thread|Thread) 0x)", dump, flags=re.MULTILINE)
    current = [b for b in blocks if b.startswith("Current thread")] or [b for b in blocks if b.strip()]
    block = current[-1] if current else ""
    return [(m["file"], int(m["line"]), m["func"]) for m in _FRAME.finditer(block)]


def waits_in_collective(frames: list[tuple[str, int, str]], depth: int = 4) -> bool:
    """Whether one of the innermost frames is a collective (or a wait on one)."""
    return any(COLLECTIVE_FRAME.search(f"{file} in {func}") for file, _, func in frames[:depth])


def stall_where(stacks: Mapping[int, str], ranks: Mapping[int, Mapping[str, Any]]) -> str:
    """Which rank stalled, from each rank's stack when the stall was judged: the ranks that do not wait in
    a collective while others do. "" when the stacks say nothing (none dumped, or all alike)."""
    frames = {r: main_stack(text) for r, text in stacks.items()}
    frames = {r: f for r, f in frames.items() if f}
    waiting = {r for r, f in frames.items() if waits_in_collective(f)}
    stuck = sorted(set(frames) - waiting)
    if not frames or not waiting or not stuck:
        if frames and len(waiting) == len(frames):
            return "every rank here waits in a collective (the one that stalled is elsewhere)"
        return ""
    rank = stuck[0]
    file, line, func = frames[rank][0]
    short = "/".join(Path(file).parts[-2:])
    others = "the others wait in a collective" if len(stuck) == 1 else f"{len(waiting)} wait in a collective"
    return f"{placed(rank, ranks.get(rank, {}))} is stuck in {func} ({short}:{line}), {others}"


def culprit(
    ranks: Mapping[int, Mapping[str, Any]],
    exits: Mapping[int, Mapping[str, Any]],
    errors: Mapping[int, Mapping[str, Any]],
) -> RankFault | None:
    """Which rank failed on its own, from the record: each rank's `rank_start` (host, node), its guard's
    `rank_exit` and its own `error` event.

    A rank ended by a signal other than SIGTERM (the launcher's and the supervisor's way of ending the
    others) or SIGABRT (NCCL's watchdog's) comes first: nothing another rank does sends it. Then a rank's
    own error (CUDA out of memory, a crash), then an exit code with no error said, and last the collective
    errors and aborts a rank gets when a peer went away. Within each, the earliest. None when no rank
    failed.
    """
    found: list[tuple[int, float, int, str, str, int | None]] = []
    for rank, e in exits.items():
        name = e.get("signal")
        if name and name != "SIGTERM":
            number = _signal_number(name)
            how = ended_by(number) if number is not None else f"ended by {name}"
            # NCCL's watchdog aborts the ranks left waiting for one that stopped answering: an abort is
            # as likely a consequence as a cause, and ranks after the collectives' own complaints.
            if name == "SIGABRT":
                found.append((3, e["t"], rank, "collective", how, number))
            else:
                found.append((0, e["t"], rank, "signal", how, number))
        elif not name and e.get("exit_code") not in (0, None) and rank not in errors:
            found.append((2, e["t"], rank, "exit", f"exit code {e['exit_code']}", None))
    for rank, e in errors.items():
        text = f"{e.get('type', 'Error')}: {e.get('message', '')}".rstrip(": ")
        if CUDA_OOM.search(text):
            found.append((1, e["t"], rank, "oom", text, None))
        elif COLLECTIVE_ERROR.search(text):
            found.append((3, e["t"], rank, "collective", text, None))
        else:
            found.append((1, e["t"], rank, "error", text, None))
    if not found:
        return None
    _, _, rank, kind, how, number = min(found)
    where = {**exits.get(rank, {}), **ranks.get(rank, {})}
    several = int(where.get("nodes") or 1) > 1
    node = int(where["node_rank"]) if several and where.get("node_rank") is not None else None
    return RankFault(rank, str(where.get("host") or ""), node, kind, how, number)


def read_tail(path: Path, size: int = TAIL_BYTES) -> str:
    """The last `size` bytes of a file as text ("" when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _signal_number(name: str) -> int | None:
    try:
        return int(signal.Signals[name])
    except KeyError:
        return None


@dataclass(frozen=True)
class EndFacts:
    """What is known when the training processes have ended."""

    returncode: int | None
    output_tail: str
    stop_requested: bool = False
    stop_reason: str = "user"
    ram_guard: str = (
        ""  # the host RAM guard's diagnosis when it asked for the stop (cockpit.service.ramguard)
    )
    stalled: bool = False
    disk_full: bool = False
    disk_free_mib: float | None = None
    stall_detail: str = ""
    host_ram_peak_fraction: float | None = None
    host_ram_peak_mib: float | None = None
    gpu_peak_mib: dict[int, float] | None = None
    trainer_outcome: str | None = None  # from the trainer's trainer_end event
    last_step: int | None = None
    stall_step: int | None = None  # this attempt's last step when the stall was judged (None: before any)
    culprit: RankFault | None = None  # with several ranks: the one that failed first (`culprit`)
    early_stop: str = ""  # why early stopping ended training (the trainer's early_stop event)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def exit_signal(returncode: int | None, output_tail: str = "") -> int | None:
    """The signal that ended a process (or, by the launcher's words in its output, one of its ranks)."""
    if returncode is not None and returncode < 0:
        return -returncode
    found = LAUNCHER_RC.findall(output_tail)
    for value in reversed(found):
        if int(value) < 0:
            return -int(value)
    if returncode is not None and 128 < returncode < 128 + 65:
        return returncode - 128
    return None


def killing_signal(facts: EndFacts) -> int | None:
    """The signal that killed a rank or the launcher, if one did."""
    return exit_signal(facts.returncode, facts.output_tail)


def ended_by(sig: int) -> str:
    """`killed by SIGKILL`, `terminated by SIGTERM`: a signal named, never a negative exit code."""
    return f"{'killed' if sig == signal.SIGKILL else 'terminated'} by {_signal_name(sig)}"


def describe_exit(returncode: int | None, output_tail: str = "") -> str:
    """How processes ended, in words: `terminated by SIGTERM`, or `exit code 1`."""
    sig = exit_signal(returncode, output_tail)
    if sig is not None:
        return ended_by(sig)
    return "no exit code" if returncode is None else f"exit code {returncode}"


def last_error_line(output: str) -> str:
    """The last `SomethingError: message` line of the output, trimmed."""
    matches = TRACEBACK_LAST.findall(output)
    return matches[-1].strip()[:300] if matches else ""


def _gpu_peaks(facts: EndFacts) -> str:
    if not facts.gpu_peak_mib:
        return ""
    parts = ", ".join(f"GPU{i} {memory(mib)}" for i, mib in sorted(facts.gpu_peak_mib.items()))
    return f" (peak {parts})"


def diagnose(facts: EndFacts) -> tuple[str, str]:
    """(status, one-line diagnosis) for a run whose training processes have ended."""
    step = f" at step {facts.last_step}" if facts.last_step else ""
    # A failure happens in the step after the last one recorded: say which step was last completed.
    after = f" after step {facts.last_step}" if facts.last_step else ""
    if facts.stalled:  # a stall before this attempt's first step names no step of an earlier attempt
        where = f" after step {facts.stall_step}" if facts.stall_step else ""
        return "stalled", f"stalled{where}: {facts.stall_detail}".rstrip(": ")
    if facts.returncode == 0 and facts.trainer_outcome in ("finished", None) and not facts.stop_requested:
        early = f": stopped early, {facts.early_stop}" if facts.early_stop else ""
        return "finished", f"finished{step}{early}"
    if facts.returncode == 0 and facts.trainer_outcome == "finished":  # the stop came after the last step
        return "finished", f"finished{step} (the stop request came after the last step)"
    if facts.stop_requested and facts.ram_guard:
        saved = facts.returncode == 0 or facts.trainer_outcome == "stopped"
        how = "checkpoint saved" if saved else describe_exit(facts.returncode, facts.output_tail)
        where = f"{step.strip()}, " if step else ""
        return "stopped", f"{facts.ram_guard} ({where}{how})"
    by = "by user" if facts.stop_reason == "user" else f"({facts.stop_reason})"
    if facts.stop_requested and (facts.returncode == 0 or facts.trainer_outcome == "stopped"):
        return "stopped", f"stopped {by}{step}, checkpoint saved"
    if facts.stop_requested:
        return "stopped", f"stopped {by}{step} ({describe_exit(facts.returncode, facts.output_tail)})"
    low_disk = facts.disk_free_mib is not None and facts.disk_free_mib < DISK_FULL_MIB
    if facts.disk_full or low_disk or DISK_FULL.search(facts.output_tail):
        free = f" ({facts.disk_free_mib:.1f} MiB free)" if facts.disk_free_mib is not None else ""
        return "failed", f"disk full{after}: no space left for the run record or checkpoints{free}"
    fault = facts.culprit
    on = f" in {fault.who}" if fault else ""
    if (fault and fault.kind == "oom") or (CUDA_OOM.search(facts.output_tail) and not fault):
        return "failed", f"CUDA out of memory{on}{after}{_gpu_peaks(facts)}"
    if NCCL_TIMEOUT.search(facts.output_tail) and (fault is None or fault.kind == "collective"):
        return "failed", f"NCCL/collective timeout{after}: a rank stopped answering"
    who = f"{fault.who} " if fault else ""
    sig = fault.signal if fault and fault.kind == "signal" else None
    if sig is None and (fault is None or fault.kind == "collective"):
        sig = killing_signal(facts)
    if sig is not None:
        if sig == signal.SIGKILL and (facts.host_ram_peak_fraction or 0) >= HOST_OOM_FRACTION:
            peak = f"{memory(facts.host_ram_peak_mib)}, " if facts.host_ram_peak_mib else ""
            return "failed", (
                f"{who}killed by SIGKILL{after} with host RAM at {peak}{facts.host_ram_peak_fraction:.0%} "
                "of total: likely host out-of-memory (kernel OOM killer)"
            )
        return "failed", f"{who}{ended_by(sig)}{after}"
    if fault and fault.kind == "exit":
        return "failed", f"{who}crashed{after} with {fault.how}"
    error = fault.how if fault else last_error_line(facts.output_tail)
    detail = f": {error}" if error else ""
    return "failed", f"{who}crashed{after} with exit code {facts.returncode}{detail}"


# A stall is judged against the run's own pace: no step for several median step times, and at least
# the profile's timeout before the run is stopped.
STALL_SUSPECT_FACTOR = 5.0
STALL_STOP_FACTOR = 10.0
STALL_SUSPECT_MIN_S = 30.0


def stall_verdict(
    idle_s: float, median_s: float | None, timeout_s: float, gpus_idle: bool | None
) -> tuple[str, str]:
    """`ok`, `suspect` (say so, keep going) or `stalled` (stop it), with the sentence that says why.

    Busy GPUs (a long evaluation or checkpoint inside a step) are never suspected, only timed out.
    """
    pace = f" ({idle_s / median_s:.0f}x the median step time of {median_s:.2f} s)" if median_s else ""
    gpu_text = {True: ", GPUs idle", False: ", GPUs busy", None: ""}[gpus_idle]
    stop_after = max(timeout_s, STALL_STOP_FACTOR * (median_s or 0.0))
    if idle_s > stop_after:
        advice = f"if a step can take this long here, raise {_timeout_field(timeout_s)}"
        return (
            "stalled",
            f"no step for {idle_s:.0f} s{pace}{gpu_text}; stopped after {stop_after:.0f} s; {advice}",
        )
    suspect_after = max(STALL_SUSPECT_FACTOR * (median_s or 0.0), min(STALL_SUSPECT_MIN_S, timeout_s / 2))
    if median_s and idle_s > suspect_after and gpus_idle is not False:
        return (
            "suspect",
            f"no step for {idle_s:.0f} s{pace}{gpu_text}: looks stalled; stop at {stop_after:.0f} s",
        )
    return "ok", ""


def _timeout_field(timeout_s: float) -> str:
    return f"training.stall_timeout_s (now {timeout_s:.0f} s)"


# What each phase before the first step does, where the trainer said nothing of it.
SETUP_PHASE_WORDS = {
    "starting": "the launcher and the trainer's imports",
    "build": "DeepSpeed's ops",
    "setup": "reading and tokenizing the data",
    "load": "loading the model",
    "train": "building the DeepSpeed engine",
}


def stall_advice(phase: str, timeout_s: float) -> str:
    """What to do about a stall before the first step, by the phase it came in."""
    if phase in ("build", "train"):  # DeepSpeed's ops: compiled in the build phase, loaded by the engine
        return (
            "`cockpit doctor` says what DeepSpeed would compile or wait for and `cockpit doctor --prebuild` "
            f"does it outside a run; or raise {_timeout_field(timeout_s)}"
        )
    return f"if this phase is this slow here, raise {_timeout_field(timeout_s)}"


def setup_stall_verdict(
    phase: str,
    words: str,
    quiet_s: float,
    silent_s: float,
    limits: tuple[float, float],
    timeout_s: float,
    resumed: bool = False,
) -> tuple[str, str]:
    """Before an attempt's first step: `ok`, `suspect` or `stalled`, with the sentence that names the phase
    and what to do. `quiet_s`: since the last progress (an event from rank 0, or the run's processes
    busy); `silent_s`: since rank 0's last event; `limits`: (quiet, ceiling) as `stall.SetupLimits`."""
    quiet_limit, ceiling = limits
    what = (words or SETUP_PHASE_WORDS.get(phase, "")).split("; ")[0]
    where = f"in phase {phase}" + (f" ({what})" if what else "")
    where += ", before the resumed run's first step" if resumed else ", before the first step"
    if silent_s > ceiling:
        return "stalled", (
            f"no event from rank 0 for {silent_s:.0f} s {where}, its processes busy; stopped after "
            f"{ceiling:.0f} s; {stall_advice(phase, timeout_s)}"
        )
    if quiet_s > quiet_limit:
        return "stalled", (
            f"no progress for {quiet_s:.0f} s {where} (no event, processes idle); stopped after "
            f"{quiet_limit:.0f} s; {stall_advice(phase, timeout_s)}"
        )
    if quiet_s > quiet_limit / 2:
        return (
            "suspect",
            f"no progress for {quiet_s:.0f} s {where}: looks stalled; stop at {quiet_limit:.0f} s",
        )
    return "ok", ""
