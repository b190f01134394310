"""Benchmark: pinning host memory as the offloaded load does, by torch's host allocator's two ways.

With parameter offload, ZeRO-3 keeps each rank's partitions in pinned host memory: at load every
partition is copied into a pinned block (`tensor.pin_memory()`), which torch's caching host allocator
takes from `cudaHostAlloc` by default, or, with `PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:
True,pinned_num_register_threads:N`, from `malloc` then `cudaHostRegister` with N threads mapping the
pages. The story's offloaded load spends about a second a layer placing its partitions
(`benchmarks/story_forecast.py`'s load split), so this times the pinning alone: `--layers` tensors of a
layer's stored bytes (the story plan's `zero3.blocks`), each pinned in a process of its own per way, the
first apart (the allocator's start), then the seconds a layer and the rate, and what the process's RSS
grew by (the allocator's rounding shows there). Beside it, the story's offloaded load itself, rehearsed
at 4, 8 and 16 layers with each way in two calls (`RECORDS`, `rehearsal_accuracy.py --configs nf4-offload
--depths ...`, the second with `PYTORCH_CUDA_ALLOC_CONF` set to the registered way): its seconds, the
slope a further layer (in sample), and the steps' (unchanged by the way).

    python benchmarks/pin_speed.py --out DIR   # on a GPU; DIR/pin_speed.{md,json}
    python benchmarks/pin_speed.py --report    # the committed results (pin_speed_h200.json) again
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WAYS = {
    "cudaHostAlloc (torch's default)": "",
    "cudaHostRegister, 8 threads": "pinned_use_cuda_host_register:True,pinned_num_register_threads:8",
    "cudaHostRegister, 16 threads": "pinned_use_cuda_host_register:True,pinned_num_register_threads:16",
}
CHILD = """
import json, sys, time, psutil, torch
size, layers = int(sys.argv[1]), int(sys.argv[2])
torch.cuda.init()
rss0, seconds, kept = psutil.Process().memory_info().rss, [], []
for _ in range(layers):
    x = torch.ones(size, dtype=torch.uint8)
    t0 = time.perf_counter()
    kept.append(x.pin_memory())
    seconds.append(time.perf_counter() - t0)
    del x
print(json.dumps({"seconds": seconds, "rss_added": psutil.Process().memory_info().rss - rss0}))
"""


RESULTS = ROOT / "benchmarks/results"
ALLOC_CONFS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
RECORDS = {  # the rehearsed loads (results/forecast/records/), each way's
    "cudaHostAlloc (torch's default)": "offload_1-16_mb8_val",
    "cudaHostRegister, 8 threads (as shipped)": "offload_4-16_register",
}


def layer_bytes() -> int:
    """A decoder layer's stored bytes in the story's plan (what ZeRO-3 partitions and a rank pins)."""
    from cockpit.plan import build_plan
    from cockpit.profiles import load_profile

    blocks = build_plan(load_profile("qwen3-235b-a22b-thinking-4xh100")[0]).to_dict()["zero3"]["blocks"]
    sizes = [v for k, v in blocks.items() if k.startswith("layer.")]
    return int(sum(sizes) / len(sizes))


def measure(layers: int) -> dict:
    """Each way's pinning in a process of its own: `layers` tensors of a story layer's bytes."""
    size = layer_bytes()
    rows = []
    for way, conf in WAYS.items():
        env = {k: v for k, v in os.environ.items() if k not in ALLOC_CONFS}  # each way alone
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        argv = [sys.executable, "-c", CHILD, str(size), str(layers)]
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        if done.returncode:
            why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            rows.append({"way": way, "conf": conf, "error": why})
            continue
        got = json.loads(done.stdout.strip().splitlines()[-1])
        after = statistics.median(got["seconds"][1:])
        rows.append({
            "way": way, "conf": conf, "first_s": got["seconds"][0], "layer_s": after,
            "gb_per_s": size / after / 1e9, "rss_added_gib": got["rss_added"] / 2**30,
        })  # fmt: skip
    return {"layer_bytes": size, "layers": layers, "rows": rows}


def rehearsed_loads() -> list[dict]:
    """The story's offloaded load and step at 4, 8 and 16 layers, rehearsed with each way."""
    from benchmarks.forecast_consistency import measures_of
    from benchmarks.marginal_layer import slope

    out = []
    for way, record in RECORDS.items():
        by_depth = measures_of([record])
        depths = [d for d in (4, 8, 16) if d in by_depth]
        loads = [float(by_depth[d].load_s) for d in depths]
        steps = [float(by_depth[d].step_s) for d in depths]
        out.append({
            "way": way, "record": record, "depths": depths, "load_s": loads, "step_s": steps,
            "load_layer_s": slope(list(zip(depths, loads, strict=True))),
            "step_layer_s": slope(list(zip(depths, steps, strict=True))),
        })  # fmt: skip
    return out


def render(data: dict) -> str:
    lines = [
        "# Pinning a layer's partitions, by torch's host allocator's two ways",
        "",
        f"{data.get('layers', 8)} tensors of a story layer's {data['layer_bytes'] / 1e9:.2f} GB, each "
        "`pin_memory()`d, a process a way, on an H200 host. `python benchmarks/pin_speed.py`.",
        "",
        "| way | first s | s a layer (median of the rest) | GB/s | RSS added GiB |",
        "|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        if "error" in r:
            lines.append(f"| {r['way']} | failed: {r['error']} | | | |")
        else:
            lines.append(
                f"| {r['way']} | {r['first_s']:.3f} | {r['layer_s']:.3f} | {r['gb_per_s']:.2f} | "
                f"{r['rss_added_gib']:.1f} |"
            )
    lines += [
        "",
        "The story's offloaded load, rehearsed (random weights: drawn, quantized, partitioned and pinned a "
        "layer at a time; one H200, two calls). A further layer is each line's slope over its depths (in "
        "sample).",
        "",
        "| way | record | load s at 4 / 8 / 16 layers | load s a further layer | step s at 4 / 8 / 16 | "
        "step s a further layer |",
        "|---|---|---|---|---|---|",
    ]
    for r in data.get("rehearsed", []):
        loads = " / ".join(f"{x:.2f}" for x in r["load_s"])
        steps = " / ".join(f"{x:.3f}" for x in r["step_s"])
        lines.append(
            f"| {r['way']} | `{r['record']}` | {loads} | {r['load_layer_s']:.3f} | {steps} | "
            f"{r['step_layer_s']:.4f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--report", action="store_true", help="no GPU: the committed results again")
    args = parser.parse_args()
    if args.report:
        data = json.loads((RESULTS / "pin_speed_h200.json").read_text())
        args.out, name = RESULTS, "pin_speed_h200"
    else:
        data, name = measure(args.layers), "pin_speed"
    data["rehearsed"] = rehearsed_loads()
    text = render(data)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.md").write_text(text)
    (args.out / f"{name}.json").write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
