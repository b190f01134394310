"""TrainerCallbacks that write the run record: load peaks, the audit, one event per optimizer step,
checkpoints; and one that stops training cleanly when the cockpit asks."""

from __future__ import annotations

import errno
import functools
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch
from transformers import TrainerCallback

from cockpit.record import EventWriter
from cockpit.record.schema import (
    CUDA_ALLOC_MIB,
    CUDA_PEAK_ALLOC_MIB,
    CUDA_PEAK_RESERVED_MIB,
    CUDA_RESERVED_MIB,
    EPOCH,
    GRAD_NORM,
    LEARNING_RATE,
    LOSS,
    MAX_STEPS,
    RSS_MIB,
    RSS_PEAK_MIB,
    SAMPLES_PER_S,
    STEP,
    STEP_TIME_S,
    TOKENS,
    TOKENS_PER_S,
)
from cockpit.units import MIB


def memory_fields() -> dict[str, float]:
    """This process's memory now: RSS, its peak since start, and CUDA allocator figures for this rank."""
    fields: dict[str, float] = {
        RSS_MIB: psutil.Process().memory_info().rss / MIB,
        RSS_PEAK_MIB: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if torch.cuda.is_available():
        fields[CUDA_ALLOC_MIB] = torch.cuda.memory_allocated() / MIB
        fields[CUDA_RESERVED_MIB] = torch.cuda.memory_reserved() / MIB
        fields[CUDA_PEAK_ALLOC_MIB] = torch.cuda.max_memory_allocated() / MIB
        fields[CUDA_PEAK_RESERVED_MIB] = torch.cuda.max_memory_reserved() / MIB
    return {k: round(v, 1) for k, v in fields.items()}


class RecordCallback(TrainerCallback):
    """Writes `load_peak`, `audit`, `train_begin`, `step` and `checkpoint` events for this rank."""

    def __init__(
        self,
        writer: EventWriter,
        audit: Callable[[], dict[str, Any]],
        samples_per_step: int,
        step_offset: int = 0,
    ) -> None:
        self.writer = writer
        self.step_offset = step_offset
        self.audit = audit
        self.samples_per_step = samples_per_step
        self._step_start = 0.0
        self._tokens_before = 0
        self._step_times: list[float] = []
        self._pending: dict[str, float] = {}
        self._logged_at = 0.0  # when the last step event was written: a save that follows is timed from it
        self.is_main = True

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.is_main = state.is_world_process_zero
        # Load is over once the engine is built: its peaks are the load phase's. Reset for training.
        self.writer.write("load_peak", **memory_fields())
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        audit = self.audit()
        self.writer.write("audit", **audit)
        if self.is_main:
            for warning in audit["warnings"]:
                print(f"[cockpit] AUDIT WARNING: {warning}", flush=True)
        self.writer.write(
            "train_begin",
            max_steps=state.max_steps + self.step_offset,
            num_train_epochs=args.num_train_epochs,
            start_step=state.global_step + self.step_offset,
            world_size=args.world_size,
            micro_batch_size=args.per_device_train_batch_size,
            grad_accum=args.gradient_accumulation_steps,
        )
        self.writer.sync()

    def exclude(self, seconds: float) -> None:
        """Leave out of the next step's time what ran between steps (a validation)."""
        if self._step_start:
            self._step_start += seconds

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._step_start:
            self._step_start = time.perf_counter()
            self._tokens_before = state.num_input_tokens_seen

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = time.perf_counter()
        dt = now - self._step_start
        tokens = state.num_input_tokens_seen - self._tokens_before
        self._step_start = now
        self._tokens_before = state.num_input_tokens_seen
        self._step_times.append(dt)
        self._pending = {
            STEP_TIME_S: round(dt, 4),
            TOKENS_PER_S: round(tokens / dt, 2) if dt > 0 else 0.0,
            SAMPLES_PER_S: round(self.samples_per_step / dt, 3) if dt > 0 else 0.0,
            TOKENS: tokens,
        }

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any
    ) -> None:
        if not logs or "loss" not in logs:
            return
        fields = {  # the step event's own fields (`cockpit.record.schema`), from the Trainer's log
            STEP: state.global_step + self.step_offset,
            MAX_STEPS: state.max_steps + self.step_offset,
            EPOCH: round(state.epoch or 0.0, 4),
            LOSS: logs["loss"],
            LEARNING_RATE: logs.get("learning_rate"),
            GRAD_NORM: logs.get("grad_norm"),
        }
        event = self.writer.write(STEP, **fields, **self._pending, **memory_fields())
        if self.is_main:
            median = statistics.median(self._step_times[-50:]) if self._step_times else 0.0
            print(
                f"step {event[STEP]}/{event[MAX_STEPS]} loss {event[LOSS]:.4f} "
                f"lr {event[LEARNING_RATE] or 0:.2e} {event.get(TOKENS_PER_S, 0):.0f} tok/s "
                f"({median:.2f} s/step)",
                flush=True,
            )
        self._logged_at = time.perf_counter()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        save_s = time.perf_counter() - self._logged_at if self._logged_at else None
        self.writer.write(
            "checkpoint",
            step=state.global_step + self.step_offset,
            path=str(path),
            save_s=round(save_s, 3) if save_s is not None else None,
        )
        self.writer.sync()


class StepClock(TrainerCallback):
    """When each optimizer step ended, kept in memory (no I/O, no sync) and reported once, at the end:
    the overhead benchmark times the bare trainer and the cockpit's with this one clock."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.ends.append(time.perf_counter())

    def step_times(self) -> list[float]:
        return [round(b - a, 5) for a, b in zip(self.ends, self.ends[1:], strict=False)]


class AlternatingCallbacks(TrainerCallback):
    """The overhead benchmark's in-process control: the cockpit's callbacks and per-step logging act in
    blocks of `block` steps and are off in the blocks between (`COCKPIT_OVERHEAD_AB=block`; a real run
    never sets it). `StepClock` times every step, so both kinds of block are timed in one process."""

    def __init__(self, inner: list[TrainerCallback], block: int) -> None:
        self.inner = inner
        self.block = block

    def _on(self, step: int) -> bool:
        return (step // self.block) % 2 == 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        for callback in self.inner:
            callback.on_train_begin(args, state, control, **kwargs)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._on(state.global_step):
            for callback in self.inner:
                callback.on_step_begin(args, state, control, **kwargs)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = state.global_step - 1  # the step that just ended
        if self._on(step):
            for callback in self.inner:
                callback.on_step_end(args, state, control, **kwargs)
        else:
            control.should_log = False

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        for callback in self.inner:
            callback.on_log(args, state, control, **kwargs)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        for callback in self.inner:
            callback.on_save(args, state, control, **kwargs)


class StopRequestCallback(TrainerCallback):
    """Stops training at a step boundary, with a checkpoint, once the stop-request file appears.

    Rank 0 looks at the file and, with several ranks, every rank learns its answer through one
    all-reduce, so all ranks stop after the same step (a rank that stopped alone would hang the others
    in a collective). One rank alone asks nobody: no collective, no device sync.
    """

    def __init__(self, request: Path, writer: EventWriter) -> None:
        self.request = request
        self.writer = writer
        self.stopped_at: int | None = None

    def _requested(self, args: Any) -> bool:
        wanted = self.request.exists() if args.process_index == 0 else False
        if args.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
            flag = torch.tensor([1 if wanted else 0], device=device)
            torch.distributed.all_reduce(flag)
            wanted = bool(flag.item())
        return wanted

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step >= state.max_steps:
            return  # the last step: training ends here anyway, and finished (adapter saved, evaluated)
        if self.stopped_at is None and self._requested(args):
            self.stopped_at = state.global_step
            control.should_save = True
            control.should_training_stop = True
            self.writer.write("stop_ack", step=state.global_step)


class FaultInjectionCallback(TrainerCallback):
    """Test-only faults, off unless COCKPIT_TEST_FAULT is set: `hang:N`, `oom:N`, `crash:N`, `exit:N`,
    `enospc:N` (a simulated full disk, for file systems where a real small one cannot be mounted),
    `leak:N` (host memory that grows by `LEAK_CHUNK` at every step from N on, up to `LEAK_MAX`).

    The fault fires on rank 0 (or on the rank named as `kind:N:rank`) when step N ends.
    """

    LEAK_CHUNK = 512 * 2**20
    LEAK_MAX = 6  # chunks: 3 GiB at most, whatever happens to the run

    def __init__(self, spec: str) -> None:
        parts = spec.split(":")
        self.kind = parts[0]
        self.step = int(parts[1])
        self.rank = int(parts[2]) if len(parts) > 2 else 0
        self.leaked: list[bytes] = []

    @classmethod
    def from_env(cls) -> FaultInjectionCallback | None:
        spec = os.environ.get("COCKPIT_TEST_FAULT", "")
        return cls(spec) if spec else None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.kind == "leak" and state.global_step >= self.step and args.process_index == self.rank:
            if len(self.leaked) < self.LEAK_MAX:
                self.leaked.append(b"\x01" * self.LEAK_CHUNK)  # written, so resident
            return
        if state.global_step != self.step or args.process_index != self.rank:
            return
        print(f"[cockpit] test fault '{self.kind}' at step {self.step}", flush=True)
        if self.kind == "hang":
            while True:
                time.sleep(3600)
        if self.kind == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (test fault)")
        if self.kind == "crash":
            raise RuntimeError("test fault: trainer crashed")
        if self.kind == "enospc":
            raise OSError(errno.ENOSPC, "No space left on device (test fault)")
        if self.kind == "exit":
            sys.stdout.flush()
            os._exit(3)


@functools.cache
def _path_roots() -> tuple[Path, ...]:
    return tuple(Path(p or ".").resolve() for p in sys.path)


def _package_of(file: str) -> str:
    """The top-level package a profiled function belongs to: the first directory under the longest
    `sys.path` entry holding the file (site-packages, a `--target` folder, the project)."""
    if file == "~":
        return "builtins"
    path = Path(file)
    roots = _path_roots()
    best = max((r for r in roots if path.is_relative_to(r)), key=lambda r: len(r.parts), default=None)
    if best is None or len(path.parts) <= len(best.parts) + 1:
        return "other"
    return path.parts[len(best.parts)]


class ProfilerCallback(TrainerCallback):
    """Profiles optimizer steps `first`..`last` with `torch.profiler` and writes one `profile` event.

    On when `COCKPIT_PROFILE_STEPS=first:last` is set (the speed benchmarks set it): the event says
    where each step's time went (`trainer.trace_summary`). The device is synchronized at both ends, so
    the profiled steps' wall time is exact; the trace itself is kept only with `COCKPIT_PROFILE_KEEP=1`.
    """

    def __init__(self, first: int, last: int, writer: EventWriter, out_dir: Path) -> None:
        self.first, self.last = first, last
        self.writer = writer
        self.out_dir = out_dir
        self._profiler: Any = None
        self._python: Any = None  # cProfile over the same steps, with COCKPIT_PROFILE_PYTHON=1
        self._t0 = 0.0

    @classmethod
    def from_env(cls, writer: EventWriter, out_dir: Path) -> ProfilerCallback | None:
        spec = os.environ.get("COCKPIT_PROFILE_STEPS", "")
        if not spec:
            return None
        first, _, last = spec.partition(":")
        return cls(int(first), int(last or first), writer, out_dir)

    @staticmethod
    def _sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._profiler is None and state.global_step + 1 == self.first:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            self._sync()
            # COCKPIT_PROFILE_STACK=1: Python frames in the trace too (where the host's time goes; slower)
            stack = os.environ.get("COCKPIT_PROFILE_STACK") == "1"
            self._profiler = profile(activities=activities, with_stack=stack)
            self._profiler.__enter__()
            if os.environ.get("COCKPIT_PROFILE_PYTHON") == "1":
                import cProfile

                self._python = cProfile.Profile()
                self._python.enable()
            self._t0 = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._profiler is None or state.global_step != self.last:
            return
        import json

        from trainer.trace_summary import summarize_trace

        self._sync()
        wall = time.perf_counter() - self._t0
        self.out_dir.mkdir(parents=True, exist_ok=True)
        python = self._python_summary() if self._python is not None else None
        self._profiler.__exit__(None, None, None)
        path = self.out_dir / f"trace-rank{self.writer.rank or 0}.json"
        self._profiler.export_chrome_trace(str(path))
        summary = summarize_trace(json.loads(path.read_text()), self.last - self.first + 1, wall)
        if os.environ.get("COCKPIT_PROFILE_KEEP") != "1":
            path.unlink()
        if python is not None:
            summary["python_top"], summary["python_packages"] = python
        self.writer.write("profile", first_step=self.first, last_step=self.last, **summary)
        self._profiler = None

    def _python_summary(self, count: int = 30) -> tuple[list[list[Any]], dict[str, list[float]]]:
        """The host functions that took the most time of their own (seconds a step), with call counts; and
        own seconds and calls a step by top-level package."""
        import pstats

        self._python.disable()
        if os.environ.get("COCKPIT_PROFILE_KEEP") == "1":  # the whole profile, callers included
            self._python.dump_stats(str(self.out_dir / f"python-rank{self.writer.rank or 0}.pstats"))
        steps = self.last - self.first + 1
        stats = pstats.Stats(self._python).stats  # (file, line, name) -> (cc, nc, tottime, cumtime, callers)
        rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:count]
        self._python = None
        packages: dict[str, list[float]] = {}
        for (file, _, _), (_, calls, own, _, _) in stats.items():
            entry = packages.setdefault(_package_of(file), [0.0, 0])
            entry[0] += own / steps
            entry[1] += calls // steps
        by_package = {
            k: [round(v[0], 5), v[1]] for k, v in sorted(packages.items(), key=lambda kv: -kv[1][0])
        }
        top = [
            [
                f"{Path(k[0]).name}:{k[1]}:{k[2]}",
                round(v[2] / steps, 5),
                round(v[3] / steps, 5),
                v[1] // steps,
            ]
            for k, v in rows
        ]
        return top, by_package
