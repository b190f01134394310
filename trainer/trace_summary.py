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
        "runtime_calls": {
            k: [v[0] // n, round(v[1] / 1e6 / n, 5)]
            for k, v in sorted(runtime.items(), key=lambda kv: -kv[1][1])[:12]
        },
    }
