"""Where the host's time goes in a kept trace: Python frames, per step, and while the GPU waits.

Reads a chrome trace that `benchmarks/step_speed.py --keep-traces` brought back from a row profiled with
Python stacks (`COCKPIT_PROFILE_STACK=1`, the row `after-4096-stack`). For each frame named on the
command line (a substring of the trace's frame names), the outermost calls a step and their inclusive
milliseconds a step; and the GPU's idle time (gaps of more than 20 us between kernels, copies and fills)
with the share of it spent inside each frame. The profiler slows the host: the figures are relative.

    python benchmarks/trace_frames.py trace-after-4096-stack-trace-rank0.json.gz [--steps 2]
    python benchmarks/trace_frames.py benchmarks/results/trace_frames.json --rebuild   # the report again

Writes trace_frames.md and .json (or --name's) under $OUT (else benchmarks/results/). The offload
traces of benchmarks/results/trace_frames_offload_*.md: DeepSpeed's own fetch with the embeddings on the
host (`earlier`, row offload-sync-4096-stack), the overlapped fetch with the embeddings on the GPU
(`now`, offload-4096-stack), and the same with 2 layers prefetched (`prefetch2`).
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# (label, where, what): a frame is counted when its name holds both substrings; the step's host work,
# outermost first
FRAMES = (
    ("training step (HF)", "trainer.py(", "training_step"),
    ("DeepSpeed engine step", "engine.py(", ": step"),
    ("  ZeRO-3: release every parameter", "release_and_reset_all", ""),
    ("backward", "engine.py(", ": backward"),
    ("forward with chunked loss", "trainer/layers/loss.py(", "_forward_with_chunked_loss"),
    ("PEFT LoRA on 4-bit linears", "peft/tuners/lora/bnb.py(", "forward"),
    ("  bitsandbytes Linear4bit", "bitsandbytes/nn/modules.py(", "forward"),
    ("DeepSpeed F.linear wrapper", "deepspeed/runtime/zero/linear.py(", "forward"),
    ("ZeRO-3 pre-forward hooks", "_pre_forward_module_hook", ""),
    ("  ZeRO-3 fetch wait", "partition_parameters.py(", ": wait"),
    ("ZeRO-3 post-forward hooks", "_post_forward_module_hook", ""),
    ("routing (trainer/layers/routing.py)", "trainer/layers/routing.py(", ""),
    ("experts (trainer/layers/experts4bit.py)", "trainer/layers/experts4bit.py(", ""),
    ("HF FLOP count (num_parameters)", "floating_point_ops", ""),
    ("module.train()", "module.py(", ": train"),
    ("step callbacks", "callback", "on_step_end"),
)


def outermost(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Calls not nested in another call of the same frame set."""
    out, end = [], -1.0
    for e in sorted(events, key=lambda e: e["ts"]):
        if e["ts"] >= end:
            out.append(e)
            end = e["ts"] + e["dur"]
    return out


def gaps(device: list[dict[str, Any]], min_us: float = 20.0) -> list[tuple[float, float]]:
    """Intervals where nothing ran on the GPU."""
    device = sorted(device, key=lambda e: e["ts"])
    out, end = [], device[0]["ts"] + device[0]["dur"]
    for e in device[1:]:
        if e["ts"] - end > min_us:
            out.append((end, e["ts"]))
        end = max(end, e["ts"] + e["dur"])
    return out


def overlap(calls: list[dict[str, Any]], idle: list[tuple[float, float]]) -> float:
    """Microseconds of GPU idle time inside these calls."""
    starts = [a for a, _ in idle]
    total = 0.0
    for c in calls:
        lo, hi = c["ts"], c["ts"] + c["dur"]
        for a, b in idle[max(0, bisect.bisect_left(starts, lo) - 1) : bisect.bisect_right(starts, hi)]:
            total += max(0.0, min(b, hi) - max(a, lo))
    return total


def busy(events: list[dict[str, Any]], lo: float, hi: float) -> float:
    """Microseconds in [lo, hi) covered by at least one of the events."""
    spans = sorted((max(lo, e["ts"]), min(hi, e["ts"] + e["dur"])) for e in events)
    spans = [(a, b) for a, b in spans if b > a]
    total, end = 0.0, lo
    for a, b in spans:
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


OPTIMIZER = "optimizer step and the next batch"  # a phase of `copy_timeline`


def copy_timeline(events: list[dict[str, Any]], steps: int) -> list[dict[str, Any]]:
    """With parameter offload: per phase of a step (forward, head and loss, backward, and the optimizer
    step with the next step's data), milliseconds a step of host-to-device copies, of kernels, of both at
    once, and of the copy engine idle. Phases are cut at the trace's own marks: the trainer's
    `cockpit:head_loss`, the optimizer's `Optimizer.step` and the data loader's `__next__`."""
    xs = [e for e in events if e.get("ph") == "X"]
    copies = [e for e in xs if e.get("cat") == "gpu_memcpy" and "HtoD" in e["name"]]
    kernels = [e for e in xs if e.get("cat") == "kernel"]
    if not copies:
        return []
    marks = sorted(
        (e["ts"], e["ts"] + e["dur"], kind)
        for e in xs
        if e.get("cat") == "user_annotation"
        for kind in [
            "head" if e["name"] == "cockpit:head_loss"
            else "optimizer" if e["name"].startswith("Optimizer.step")
            else "data" if "DataLoader" in e["name"]
            else ""
        ]
        if kind
    )  # fmt: skip
    start = min(e["ts"] for e in copies + kernels)
    end = max(e["ts"] + e["dur"] for e in copies + kernels)
    cuts: list[tuple[str, float, float]] = []
    edge, phase = start, "forward"
    for lo, hi, kind in marks:
        if kind == "head":
            cuts += [("forward", edge, lo), ("head and loss", lo, hi)]
            edge, phase = hi, "backward"
        elif kind == "optimizer" and phase == "backward":
            cuts.append(("backward", edge, lo))
            edge, phase = lo, OPTIMIZER
        elif kind == "data" and phase == OPTIMIZER:
            cuts.append((OPTIMIZER, edge, hi))
            edge, phase = hi, "forward"
    cuts.append((phase, edge, end))
    rows: dict[str, dict[str, float]] = {}
    for name, lo, hi in cuts:
        if hi <= lo:
            continue
        r = rows.setdefault(name, {"wall": 0.0, "copy": 0.0, "kernel": 0.0, "both": 0.0})
        c, k, either = busy(copies, lo, hi), busy(kernels, lo, hi), busy(copies + kernels, lo, hi)
        r["wall"] += hi - lo
        r["copy"] += c
        r["kernel"] += k
        r["both"] += c + k - either
    return [
        {
            "phase": name,
            "wall_ms": v["wall"] / steps / 1e3,
            "copy_ms": v["copy"] / steps / 1e3,
            "kernel_ms": v["kernel"] / steps / 1e3,
            "overlap_ms": v["both"] / steps / 1e3,
            "copy_idle_ms": (v["wall"] - v["copy"]) / steps / 1e3,
        }
        for name, v in rows.items()
    ]


def phase_bound(copies: list[dict[str, Any]]) -> dict[str, float]:
    """Milliseconds a step with copies and kernels overlapped perfectly within each phase (the larger of
    the two, summed over the phases), beside the copies alone (the host-to-device floor). A step between
    the two is short of perfect overlap; the distance from the first to the second is the schedule's
    own: phases whose kernels have few copies to hide (a slice's backward, its layers still gathered)."""
    return {
        "phase_bound_ms": sum(max(r["copy_ms"], r["kernel_ms"]) for r in copies),
        "copies_ms": sum(r["copy_ms"] for r in copies),
    }


def analyse(trace: dict[str, Any], steps: int) -> dict[str, Any]:
    events = trace["traceEvents"]
    python = [e for e in events if e.get("ph") == "X" and e.get("cat") == "python_function"]
    device = [
        e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    if not python:
        raise SystemExit("no Python frames in this trace: profile the row with COCKPIT_PROFILE_STACK=1")
    idle = gaps(device)
    rows = []
    for label, where, what in FRAMES:
        calls = outermost([e for e in python if where in e["name"] and what in e["name"]])
        rows.append(
            {
                "frame": label,
                "calls_per_step": len(calls) / steps,
                "ms_per_step": sum(c["dur"] for c in calls) / steps / 1e3,
                "gpu_idle_ms_per_step": overlap(calls, idle) / steps / 1e3,
            }
        )
    return {
        "copies": copy_timeline(events, steps),
        "steps": steps,
        "gpu_busy_ms_per_step": sum(e["dur"] for e in device) / steps / 1e3,
        "gpu_idle_ms_per_step": sum(b - a for a, b in idle) / steps / 1e3,
        "frames": rows,
    }


def table(result: dict[str, Any], source: str) -> str:
    out = [
        "# Host frames in a profiled step (torch.profiler with Python stacks)",
        "",
        f"Trace: `{source}`, {result['steps']} steps. GPU busy {result['gpu_busy_ms_per_step']:.1f} ms a "
        f"step, idle {result['gpu_idle_ms_per_step']:.1f} ms a step (the profiler slows the host: relative "
        "figures).",
        "",
        "| frame | calls a step | ms a step (inclusive) | GPU idle inside, ms a step |",
        "|---|---|---|---|",
    ]
    for r in result["frames"]:
        cells = (f"{r['calls_per_step']:.0f}", f"{r['ms_per_step']:.2f}", f"{r['gpu_idle_ms_per_step']:.2f}")
        out.append(f"| {r['frame']} | " + " | ".join(cells) + " |")
    if result.get("copies"):
        out += [
            "",
            "Host-to-device copies by phase of the step (parameter offload; ms a step):",
            "",
            "| phase | wall | copies | kernels | both at once | copy engine idle |",
            "|---|---|---|---|---|---|",
        ]
        for r in result["copies"]:
            cells = [f"{r[k]:.1f}" for k in ("wall_ms", "copy_ms", "kernel_ms", "overlap_ms", "copy_idle_ms")]
            out.append(f"| {r['phase']} | " + " | ".join(cells) + " |")
        bound = phase_bound(result["copies"])
        if bound["copies_ms"] >= 1.0:  # parameter offload: a copy floor to compare with
            out += [
                "",
                "Copies and kernels overlapped perfectly within each phase: "
                f"{bound['phase_bound_ms']:.1f} ms a step; the copies alone (the host-to-device floor): "
                f"{bound['copies_ms']:.1f} ms.",
            ]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "trace", type=Path, help="a chrome trace, .json or .json.gz; or with --rebuild, a result"
    )
    parser.add_argument(
        "--rebuild", action="store_true", help="read an earlier result's .json: its report again"
    )
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps the trace covers")
    parser.add_argument("--name", default="trace_frames", help="results file name, without suffix")
    args = parser.parse_args(argv)
    if not args.trace.is_file():
        print(f"trace_frames: no such file: {args.trace}", file=sys.stderr)
        return 2
    if args.rebuild:
        result = json.loads(args.trace.read_text())
        source = result.pop("trace")
    else:
        opener = gzip.open if args.trace.suffix == ".gz" else open
        with opener(args.trace, "rt") as f:
            trace = json.load(f)
        result, source = analyse(trace, args.steps), args.trace.name
    report = table(result, source)
    print(report)
    out = Path(os.environ.get("OUT") or ROOT / "benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.md").write_text(report)
    (out / f"{args.name}.json").write_text(json.dumps({"trace": source, **result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
