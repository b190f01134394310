"""Benchmark: pinning host memory as the offloaded load does, by torch's host allocator's two ways.

With parameter offload, ZeRO-3 keeps each rank's partitions in pinned host memory: at load every
partition is copied into a pinned block (`tensor.pin_memory()`), which torch's caching host allocator
takes from `cudaHostAlloc` by default, or, with `PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:
True,pinned_num_register_threads:N`, from `malloc` then `cudaHostRegister` with N threads mapping the
pages. The story's offloaded load spends about a second a layer placing its partitions
(`benchmarks/story_forecast.py`'s load split), so this times the pinning alone: `--layers` tensors of a
layer's stored bytes (the story plan's `zero3.blocks`), each pinned in a process of its own per way, the
first apart (the allocator's start), then the seconds a layer and the rate, and what the process's RSS
grew by (the allocator's rounding shows there).

    python benchmarks/pin_speed.py --out DIR   # on a GPU; DIR/pin_speed.{md,json}
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


def layer_bytes() -> int:
    """A decoder layer's stored bytes in the story's plan (what ZeRO-3 partitions and a rank pins)."""
    from cockpit.plan import build_plan
    from cockpit.profiles import load_profile

    blocks = build_plan(load_profile("qwen3-235b-a22b-thinking-4xh100")[0]).to_dict()["zero3"]["blocks"]
    sizes = [v for k, v in blocks.items() if k.startswith("layer.")]
    return int(sum(sizes) / len(sizes))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    args = parser.parse_args()
    size = layer_bytes()
    rows = []
    for way, conf in WAYS.items():
        env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": conf} if conf else dict(os.environ)
        argv = [sys.executable, "-c", CHILD, str(size), str(args.layers)]
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        if done.returncode:
            rows.append({"way": way, "conf": conf, "error": done.stderr.strip().splitlines()[-1]})
            continue
        got = json.loads(done.stdout.strip().splitlines()[-1])
        after = statistics.median(got["seconds"][1:])
        rows.append({
            "way": way, "conf": conf, "first_s": got["seconds"][0], "layer_s": after,
            "gb_per_s": size / after / 1e9, "rss_added_gib": got["rss_added"] / 2**30,
        })  # fmt: skip
    lines = [
        "# Pinning a layer's partitions, by torch's host allocator's two ways",
        "",
        f"{args.layers} tensors of a story layer's {size / 1e9:.2f} GB, each `pin_memory()`d, a process a "
        "way. `python benchmarks/pin_speed.py`.",
        "",
        "| way | first s | s a layer (median of the rest) | GB/s | RSS added GiB |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['way']} | failed: {r['error']} | | | |")
        else:
            lines.append(
                f"| {r['way']} | {r['first_s']:.3f} | {r['layer_s']:.3f} | {r['gb_per_s']:.2f} | "
                f"{r['rss_added_gib']:.1f} |"
            )
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pin_speed.md").write_text(text)
    (args.out / "pin_speed.json").write_text(json.dumps({"layer_bytes": size, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
