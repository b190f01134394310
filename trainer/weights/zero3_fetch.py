"""ZeRO-3's parameter fetch with offload, overlapped with compute: what DeepSpeed serializes, and where
the embeddings live.

Profiled on the story's slice with parameter offload (one H200; `benchmarks/step_speed.py`, rows
`offload-*-stack`, read with `benchmarks/trace_frames.py`), DeepSpeed's copies and the layers' kernels
took turns instead of overlapping:

- **Whole-stream waits.** Before a module computes, the coordinator makes the compute stream wait for
  the whole all-gather stream (`wait_stream`), so the module also waits for every prefetch already
  queued behind its own copies: the next layer's, in the backward the one after it too.
- **Host waits.** At a partition of one rank the "gather" is a host-to-device copy on the all-gather
  stream, and its handle's `wait()` synchronizes that stream on the host; and after every waited
  parameter the coordinator lets at most two recorded fetch events stay pending, synchronizing the host
  on the oldest. Either way the host stops until queued copies land and queues no kernels meanwhile.
- **Embeddings from the host.** The input embedding and the lm_head (1.2 GB each for the story) crossed
  the link three times a micro-batch: the embedding for a lookup of a few thousand rows, again for its
  backward hook, and the head.

`install()` changes the first two for a run of one rank, without changing what is fetched or when it
is released. Several ranks gather through collectives (`AllGatherCoalescedHandle`) whose completion only
the whole-stream wait orders, so there DeepSpeed's fetch stays as it is (`configure_training` installs
this for one rank only):

- each single-rank handle records a CUDA event after its copies, and `wait()` only notes it;
- the coordinator's all-gather stream is a `FetchStream`, whose `record_event()` (what `wait_stream`
  waits on) answers the latest event noted since the last call: the copies of the parameters that module
  waited for, not the prefetches queued behind them;
- the pending-event limit is raised from 2 to `PENDING_FETCH_EVENTS`; the host runs ahead as far as
  DeepSpeed's live-parameter budget (`stage3_max_live_parameters`) lets it prefetch, and that bound.

Parameter offload to the CPU only: with NVMe, a released partition's pinned swap buffer goes back to the
pool for the next disk read at once, which only the host wait kept behind its copy.

A released parameter's memory is already held by DeepSpeed's `record_stream` until the kernels that
read it are done. When DeepSpeed releases every parameter before the optimizer step, the host waits for
the device once, so the optimizer never writes a host partition a copy may still be reading.

`keep_embeddings_on_gpu()` moves the two embeddings' partitions to the GPU and keeps them gathered
(`ds_persist`): the profile's `deepspeed.embeddings_on_gpu`.

`COCKPIT_ASYNC_FETCH=0` keeps DeepSpeed's own fetch (the speed benchmark's control).
"""

from __future__ import annotations

import itertools
import os
from typing import Any

ENV = "COCKPIT_ASYNC_FETCH"
_ORDER = itertools.count()  # copies are queued in this order on one stream: the largest is the latest
# CUDA stream handle -> the latest copy waited for on it: by handle, not by stream object, since two
# torch stream objects (two coordinators: training and evaluation) can wrap one pooled CUDA stream.
_LATEST: dict[int, LatestCopy] = {}
# Fetch events a coordinator lets stay pending before the host waits on the oldest: DeepSpeed's 2 made the
# host wait at nearly every layer; this many (about ten a layer) only bounds how far the host runs ahead.
PENDING_FETCH_EVENTS = 256


class LatestCopy:
    """The latest copy event a module waited for since the stream last answered: copies are queued in
    order on one stream, so waiting for the latest covers every earlier one and none queued after it."""

    def __init__(self) -> None:
        self._noted: tuple[int, Any] | None = None

    def note(self, order: int, event: Any) -> None:
        """A parameter's copy, `order`-th queued, was waited for."""
        if self._noted is None or order > self._noted[0]:
            self._noted = (order, event)

    def take(self) -> Any | None:
        """The latest event noted since the last take, or None when nothing was waited for."""
        noted, self._noted = self._noted, None
        return None if noted is None else noted[1]


def wanted() -> bool:
    """On unless `COCKPIT_ASYNC_FETCH=0`."""
    return os.environ.get(ENV, "1") != "0"


def install() -> bool:
    """Overlapped fetches (see the module docstring), once; False where there is no CUDA device, no
    DeepSpeed, or the switch is off."""
    if not wanted():
        return False
    try:
        import torch
        from deepspeed.runtime.zero import partition_parameters as pp
        from deepspeed.runtime.zero import partitioned_param_coordinator as ppc
    except ImportError:
        return False
    if not torch.cuda.is_available():
        return False
    if getattr(pp.NoGatherHandle, "cockpit_async", False):
        return True
    status = pp.ZeroParamStatus

    class FetchStream(torch.cuda.Stream):
        """The all-gather stream; `record_event()` answers the copies the current module waited for."""

        def __new__(cls, *args: Any, **kwargs: Any) -> FetchStream:
            stream = super().__new__(cls, *args, **kwargs)
            _LATEST.setdefault(stream.cuda_stream, LatestCopy())
            return stream

        def record_event(self, event: Any = None) -> Any:
            if event is not None:  # a caller's own event: record it, as torch would
                return super().record_event(event)
            latest = _LATEST[self.cuda_stream].take()
            if latest is not None:
                return latest
            # Nothing waited on since the last call: every parameter the module uses was ordered before.
            return torch.cuda.Event()  # never recorded: waiting on it waits for nothing

    class _Ordered:
        """The copies were queued on the stream current at creation; an event marks their end."""

        cockpit_async = True

        def _record(self, params: list[Any]) -> None:
            self._cockpit_params = params
            self._cockpit_event = torch.cuda.Event()
            self._cockpit_event.record()
            self._cockpit_order = next(_ORDER)
            self._cockpit_latest = _LATEST.get(torch.cuda.current_stream().cuda_stream)
            self._cockpit_done = False

        def wait(self, **_: Any) -> None:
            if self._cockpit_done:
                return
            if self._cockpit_latest is not None:
                self._cockpit_latest.note(self._cockpit_order, self._cockpit_event)
            # Outside the coordinator (a GatheredParameters block, a checkpoint save) the caller's stream
            # reads the parameter next: order it after the copies here.
            torch.cuda.current_stream().wait_event(self._cockpit_event)
            for param in self._cockpit_params:
                param.ds_status = status.AVAILABLE
            self._cockpit_done = True

    class NoGatherHandle(_Ordered, pp.NoGatherHandle):
        def __init__(self, param: Any) -> None:
            super().__init__(param)
            self._record([param])

    class NoGatherCoalescedHandle(_Ordered, pp.NoGatherCoalescedHandle):
        def __init__(self, params: list[Any]) -> None:
            super().__init__(params)
            self._record(list(params))

    pp.NoGatherHandle = NoGatherHandle
    pp.NoGatherCoalescedHandle = NoGatherCoalescedHandle

    coordinator = ppc.PartitionedParameterCoordinator
    init, release_all = coordinator.__init__, coordinator.release_and_reset_all

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        stream = getattr(self, "_PartitionedParameterCoordinator__allgather_stream", None)
        if isinstance(stream, torch.cuda.Stream) and stream != torch.cuda.default_stream():
            self._PartitionedParameterCoordinator__allgather_stream = FetchStream()
            self._PartitionedParameterCoordinator__max_ongoing_fetch_events = PENDING_FETCH_EVENTS

    def release_and_reset_all(self: Any, module: Any) -> None:
        release_all(self, module)
        torch.cuda.synchronize()  # no copy still reads a host partition the optimizer is to write

    coordinator.__init__ = __init__
    coordinator.release_and_reset_all = release_and_reset_all
    return True


def keep_embeddings_on_gpu(model: Any) -> int:
    """Move the input embedding's and the lm_head's ZeRO-3 partitions from the host to this rank's GPU
    and keep them gathered once used; returns how many parameters moved (0 without CUDA, or where ZeRO-3
    did not partition them at load)."""
    import torch

    if not torch.cuda.is_available():
        return 0
    device = torch.device("cuda", torch.cuda.current_device())
    moved = 0
    seen: set[int] = set()
    for module in (model.get_input_embeddings(), model.get_output_embeddings()):
        param = getattr(module, "weight", None)
        if param is None or id(param) in seen or getattr(param, "ds_tensor", None) is None:
            continue
        seen.add(id(param))
        if param.ds_tensor.device.type != "cuda":
            param.ds_tensor.data = param.ds_tensor.data.to(device)
        param.ds_persist = True
        moved += 1
    return moved
