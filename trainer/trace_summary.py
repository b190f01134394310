"""Where a training step's time goes, from a `torch.profiler` Chrome trace (no torch needed to read it).

Every device kernel and copy is put in one category by its name; the categories' times, the time the
device was busy at all (the union of its intervals) and the bytes copied host-to-device are summed over
the profiled steps and given per step. Time the device is idle during a step is the host's: Python,
ZeRO-3's hooks, kernel launches, synchronizations.
"""

from __future__ import annotations

from typing import Any

# (category, substrings of a lower-cased kernel name), first match wins: order matters.
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("host-to-device copies", ("memcpy htod",)),
    ("device-to-host copies", ("memcpy dtoh",)),
    ("device copies and fills", ("memcpy dtod", "memset", "memcpy ptop")),
    ("collectives (ZeRO-3 gathers, reductions)", ("nccl",)),
    ("expert GEMMs, fused NF4", ("nf4_grouped", "nf4_gemm", "nf4_mm")),
    ("dequantization", ("dequant", "nf4")),
    ("expert GEMMs", ("grouped", "groupproblemshape")),  # the latter: torch._grouped_mm (CUTLASS)
    ("attention", ("flash", "fmha", "attention", "attn", "sdpa", "softmax_warp")),
    ("optimizer", ("adam", "multi_tensor", "fused_optim")),
    (
        "other GEMMs (projections, LoRA, head)",
        ("gemm", "xmma", "cutlass", "nvjet", "cublas", "matmul", "mm_"),
    ),
)
OTHER = "other kernels"
TOP_KERNELS = 30  # the kernels a profile event lists, longest first
TOP_OPS = 30  # the launching operators a profile event lists, longest first
HOST_CATS = ("cpu_op", "python_function", "user_annotation")  # host ranges a kernel's launch nests in
# Python frames in torch's own code: an operator is attributed to the nearest frame outside them.
TORCH_FRAMES = ("torch/", "<built-in", "<string>", "threading.py", "nn.Module: ")
SAME_US = 0.01  # trace times are float microseconds: ends this close are one end (rounding)
KERNEL_NAME = 240  # characters of a name kept: enough for an elementwise kernel's functor
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")  # host-side CUDA calls: launches, synchronizations
# record_function ranges the trainer opens, as they appear on the device timeline.
ANNOTATIONS = {"cockpit:head_loss": "logits and loss (within the above)"}


def category(name: str) -> str:
    """The category of one device activity, by its name."""
    lowered = name.lower()
    for label, needles in CATEGORIES:
        if any(n in lowered for n in needles):
            return label
    return OTHER


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def summarize_trace(trace: dict[str, Any], steps: int, wall_s: float) -> dict[str, Any]:
    """Per-step seconds by category, device busy time, host idle time, host-to-device bytes, and the host's
    CUDA calls (launches, synchronizations: calls and seconds a step).

    `trace` is the JSON of `prof.export_chrome_trace`; `wall_s` the wall time of the `steps` steps.
    """
    by_cat: dict[str, float] = {}
    kernels: dict[str, float] = {}
    intervals: list[tuple[float, float]] = []
    h2d_bytes = 0
    annotated: dict[str, float] = {}
    runtime: dict[str, list[float]] = {}  # CUDA runtime/driver call -> [calls, seconds]
    for event in trace.get("traceEvents", []):
        if event.get("ph") != "X":
            continue
        cat, name, dur = event.get("cat", ""), event.get("name", ""), float(event.get("dur", 0.0))
        if cat == "gpu_user_annotation" and name in ANNOTATIONS:
            annotated[ANNOTATIONS[name]] = annotated.get(ANNOTATIONS[name], 0.0) + dur
            continue
        if cat in RUNTIME_CATS:
            entry = runtime.setdefault(name, [0, 0.0])
            entry[0] += 1
            entry[1] += dur
            continue
        if cat not in DEVICE_CATS:
            continue
        label = category(name)
        by_cat[label] = by_cat.get(label, 0.0) + dur
        kernels[name] = kernels.get(name, 0.0) + dur
        start = float(event.get("ts", 0.0))
        intervals.append((start, start + dur))
        if label == "host-to-device copies":
            h2d_bytes += int((event.get("args") or {}).get("bytes", 0))
    n = max(1, steps)
    busy = _union(intervals) / 1e6 / n
    wall = wall_s / n
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:TOP_KERNELS]
    return {
        "steps": steps,
        "step_wall_s": round(wall, 5),
        "device_busy_s": round(busy, 5),
        "host_bound_s": round(max(0.0, wall - busy), 5),
        "categories_s": {k: round(v / 1e6 / n, 5) for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1])},
        "annotations_s": {k: round(v / 1e6 / n, 5) for k, v in annotated.items()},
        "h2d_bytes_per_step": h2d_bytes // n,
        "top_kernels_s": [[name[:KERNEL_NAME], round(t / 1e6 / n, 5)] for name, t in top],
        "top_ops_s": device_time_by_op(trace, n),
        "runtime_calls": {
            k: [v[0] // n, round(v[1] / 1e6 / n, 5)]
            for k, v in sorted(runtime.items(), key=lambda kv: -kv[1][1])[:12]
        },
    }


def _end(event: dict[str, Any]) -> float:
    return float(event.get("ts", 0.0)) + float(event.get("dur", 0.0))


def _host_ranges(trace: dict[str, Any]) -> tuple[list[dict[str, Any]], list[int]]:
    """The host ranges (operators, Python frames, annotations) and each one's enclosing range (-1: none),
    by nesting in time on its own thread.

    Python frames still open when the profiler stopped are left out: the profiler closes them there, so
    a frame whose return it missed would seem to enclose everything after it on its thread (the outer
    frames of the training loop go too; a label needs the innermost frame only). A range that only
    overlaps the next one (a recorded end running past its caller's) encloses nothing from there on."""
    host = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and e.get("cat") in HOST_CATS]
    stop = max((_end(e) for e in host), default=0.0)
    events = [e for e in host if e.get("cat") != "python_function" or _end(e) < stop - SAME_US]
    events.sort(
        key=lambda e: (e.get("pid"), e.get("tid"), float(e.get("ts", 0.0)), -float(e.get("dur", 0.0)))
    )
    ends = [_end(e) for e in events]
    parent = [-1] * len(events)
    stack: list[int] = []
    thread: tuple[Any, Any] | None = None
    for i, event in enumerate(events):
        if (event.get("pid"), event.get("tid")) != thread:
            thread, stack = (event.get("pid"), event.get("tid")), []
        start = float(event.get("ts", 0.0))
        while stack and (start >= ends[stack[-1]] - SAME_US or ends[i] > ends[stack[-1]] + SAME_US):
            stack.pop()
        parent[i] = stack[-1] if stack else -1
        stack.append(i)
    return events, parent


def _op_label(events: list[dict[str, Any]], parent: list[int], i: int) -> str:
    """`op < enclosing op @ nearest frame outside torch`: what launched a kernel, in words."""
    label, outer, frame = events[i].get("name", ""), "", ""
    j = parent[i]
    while j >= 0 and not (outer and frame):
        event = events[j]
        if event.get("cat") == "python_function":
            name = event.get("name", "")
            if not frame and not any(t in name for t in TORCH_FRAMES):
                frame = name
        elif not outer:
            outer = event.get("name", "")
        j = parent[j]
    return label + (f" < {outer}" if outer else "") + (f" @ {frame}" if frame else "")


def device_time_by_op(trace: dict[str, Any], steps: int) -> list[list[Any]]:
    """Device seconds a step by the host operator that launched each kernel (the trace links them by
    `External id`), with its enclosing operator and, in a trace with Python frames, the nearest frame
    outside torch: the longest `TOP_OPS`, as [label, seconds]. Kernels with no launching operator (a
    CUDA graph's replay) are left out."""
    events, parent = _host_ranges(trace)
    by_id = {
        (e.get("args") or {}).get("External id"): i for i, e in enumerate(events) if e.get("cat") == "cpu_op"
    }
    by_id.pop(None, None)
    labels: dict[int, str] = {}
    totals: dict[str, float] = {}
    for event in trace.get("traceEvents", []):
        if event.get("ph") != "X" or event.get("cat") not in DEVICE_CATS:
            continue
        i = by_id.get((event.get("args") or {}).get("External id"))
        if i is None:
            continue
        if i not in labels:
            labels[i] = _op_label(events, parent, i)[:KERNEL_NAME]
        totals[labels[i]] = totals.get(labels[i], 0.0) + float(event.get("dur", 0.0))
    n = max(1, steps)
    top = sorted(totals.items(), key=lambda kv: -kv[1])[:TOP_OPS]
    return [[label, round(t / 1e6 / n, 5)] for label, t in top]
