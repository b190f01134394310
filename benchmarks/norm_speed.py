"""Benchmark: RMSNorm at the story's shapes, torch's fused kernel against the cockpit's Triton kernel.

A story step is 32,768 tokens (8 rows of 4,096). Each decoder layer normalizes the hidden state twice
(4,096 wide), the query heads (64 x 128 wide) and the key heads (4 x 128); in forward, in recompute and
in backward. torch's `rms_norm` gives each row a thread block; `trainer.kernels.rms_norm` a tile of rows.

For each norm and each path: forward ms, forward + backward ms (the weight frozen, as in QLoRA), the
bandwidth those reach (bytes: x read and y written forward; x and the upstream gradient read and dx
written backward; the weight and the per-row statistics left out), and the largest error against a
float32 reference relative to the reference's largest value. Then one layer-step's norms: forward twice
(forward and recompute) and backward once. CUDA events, median of `--iters` after 3 warm-ups.

    python benchmarks/norm_speed.py --out DIR    # DIR/norm_speed.{md,json} (committed as _h200)
    python benchmarks/norm_speed.py --smoke      # CPU, tiny shapes, the torch path only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOKENS = 32768
EPS = 1e-6
# (name, row shape, calls a layer-step: forward and recompute)
NORMS = (("hidden", (4096,), 2), ("query heads", (64, 128), 1), ("key heads", (4, 128), 1))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=None, help="folder for the .md and .json")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, torch's path only")
    args = parser.parse_args(argv)
    import torch
    import torch.nn.functional as F

    from benchmarks.attention_speed import median_ms

    if not args.smoke and not torch.cuda.is_available():
        log("no CUDA device: run with --smoke for the CPU check of this script")
        return 2
    device = torch.device("cpu" if args.smoke else "cuda")
    tokens = 64 if args.smoke else TOKENS
    paths: dict[str, Any] = {"torch": lambda x, w: F.rms_norm(x, (x.shape[-1],), w, EPS)}
    if not args.smoke:
        from trainer.kernels import rms_norm

        paths["triton"] = lambda x, w: rms_norm.rms_norm(x, w, EPS)

    def timed(fn: Any) -> float:
        return median_ms(torch, device, fn, args.iters)

    gen = torch.Generator().manual_seed(0)

    def measure(name: str, shape: tuple[int, ...], calls: int) -> list[dict[str, Any]]:
        x = (torch.randn(tokens, *shape, generator=gen) * 2).to(device, torch.bfloat16)
        w = (1 + 0.2 * torch.randn(shape[-1], generator=gen)).to(device, torch.bfloat16)
        g = torch.randn(tokens, *shape, generator=gen).to(device, torch.bfloat16)
        xr = x.float().requires_grad_(True)
        yr = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + EPS) * w.float()
        yr.backward(g.float())
        nbytes = x.numel() * x.element_size()
        out = []
        for path, fn in paths.items():
            xi = x.clone().requires_grad_(True)
            y = fn(xi, w)
            y.backward(g)
            row: dict[str, Any] = {"norm": name, "path": path, "shape": [tokens, *shape], "calls": calls}
            row["err_y"] = float((y.float() - yr).abs().max() / yr.abs().max())
            row["err_dx"] = float((xi.grad.float() - xr.grad).abs().max() / xr.grad.abs().max())
            row["fwd_ms"] = timed(lambda fn=fn: fn(x, w))

            def both(fn: Any = fn) -> None:
                fn(x.detach().requires_grad_(True), w).backward(g)

            row["fwd_bwd_ms"] = timed(both)
            row["bwd_ms"] = row["fwd_bwd_ms"] - row["fwd_ms"]
            row["fwd_gbs"] = 2 * nbytes / row["fwd_ms"] / 1e6
            row["bwd_gbs"] = 3 * nbytes / max(row["bwd_ms"], 1e-6) / 1e6
            row["layer_ms"] = calls * (2 * row["fwd_ms"] + row["bwd_ms"])
            log(json.dumps(row))
            out.append(row)
        return out

    rows = [row for name, shape, calls in NORMS for row in measure(name, shape, calls)]
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    meta = {"gpu": gpu, "torch": torch.__version__}
    text = table(meta, rows)
    print(text)
    out_dir = args.out or Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "norm_speed.md").write_text(text)
    (out_dir / "norm_speed.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


def table(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The results as markdown: a row a norm and path, then a layer-step's norms by path."""
    lines = [
        "# RMSNorm at the story's shapes (bf16, the weight frozen)",
        "",
        f"{meta['gpu']}, torch {meta['torch']}. Bandwidth: forward reads x and writes y, backward reads x "
        "and the upstream gradient and writes dx. Error: the largest difference from a float32 "
        "reference over the reference's largest value.",
        "",
        "| norm | rows x width | path | forward ms | GB/s | backward ms | GB/s | error y / dx |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        shape = r["shape"]
        n_rows = shape[0] * (shape[1] if len(shape) == 3 else 1)
        lines.append(
            f"| {r['norm']} | {n_rows:,} x {shape[-1]} | {r['path']} "
            f"| {r['fwd_ms']:.3f} | {r['fwd_gbs']:.0f} | {r['bwd_ms']:.3f} | {r['bwd_gbs']:.0f} "
            f"| {r['err_y']:.1e} / {r['err_dx']:.1e} |"
        )
    lines += [
        "",
        "A layer-step's norms (each forward twice, backward once; the hidden state's norm twice):",
        "",
    ]
    lines += ["| path | ms a layer-step |", "|---|---|"]
    for path in dict.fromkeys(r["path"] for r in rows):
        total = sum(r["layer_ms"] for r in rows if r["path"] == path)
        lines.append(f"| {path} | {total:.2f} |")
    lines += ["", "Reproduce: `python benchmarks/norm_speed.py` on the GPU (under a minute)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
