"""Benchmark: a decode step's attention projections in NF4, bitsandbytes against the NF4 decode kernel.

At the story's geometry a decoder layer's q, k, v and o projections are bitsandbytes `Linear4bit`s of
[8192, 4096], [512, 4096] twice and [4096, 8192] (71M weights, 37 MB in NF4). Past 4 rows bitsandbytes
(0.50, on Hopper, as its heuristic picks) dequantizes each weight to bf16 and multiplies;
`trainer.layers.linear4bit_rows` sends 5 to 28 rows to the NF4 decode kernel instead (past that, its 64-row
tile measured slower than bitsandbytes). This times the four
projections of `LAYERS` layers in turn (their weights together exceed the L2 cache, as a step through the
model's layers does), replayed as a CUDA graph as evaluation's decode step is, at batches of 1, 8 and 64
rows:

  bitsandbytes   `Linear4bit.forward` as it is (its own 4-bit kernel to 4 rows, then as its heuristic picks)
  kernel bnN     `linear4bit_rows.rows_mm` with N weight rows a tile (TILE_OUTPUTS is the default)

Beside each: the memory limit (the layer's NF4 codes and scales over the copy bandwidth measured here,
as `decode_speed.py` measures it)
and the error against float32 products of bitsandbytes' own dequantized weights.

    python benchmarks/projection_speed.py            # on a GPU, about a minute
    python benchmarks/projection_speed.py --smoke    # the CPU: Triton's interpreter, tiny shapes

Writes projection_speed_<gpu>.md and .json under --out (default $OUT, else benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The story's attention projections (Qwen3-235B-A22B: hidden 4096, 64 query heads and 4 key-value heads
# of 128): name -> (out, in).
STORY = {"q": (8192, 4096), "k": (512, 4096), "v": (512, 4096), "o": (4096, 8192)}
SMOKE = {"q": (256, 128), "k": (128, 128), "o": (128, 256)}
LAYERS = 4  # 148 MB of NF4 weights: past an H100's or H200's L2 cache
TILES = (32, 64, 128)


def build(torch: Any, shapes: dict[str, tuple[int, int]], layers: int, device: Any) -> list[dict[str, Any]]:
    """`layers` sets of projections, each a bitsandbytes `Linear4bit` (double-quantized NF4, bf16 compute)."""
    import bitsandbytes as bnb

    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(layers):
        layer = {}
        for name, (o, i) in shapes.items():
            lin = bnb.nn.Linear4bit(i, o, bias=False, compute_dtype=torch.bfloat16, compress_statistics=True,
                                    quant_type="nf4", device="meta")  # fmt: skip
            weight = torch.randn(o, i, generator=gen) * 0.02
            lin.weight = bnb.nn.Params4bit(
                weight, requires_grad=False, compress_statistics=True, quant_type="nf4", module=lin
            ).to(device)
            layer[name] = lin
        out.append(layer)
    return out


def nf4_bytes(shapes: dict[str, tuple[int, int]]) -> int:
    """A layer's projections in NF4: codes, one scale byte a 64-block, float32 nested scales."""
    return sum(o * i // 2 + o * i // 64 + 4 * (o * i // 64 // 256 + 1) for o, i in shapes.values())


def reference(torch: Any, lin: Any, x: Any) -> Any:
    import bitsandbytes.functional as bnbf

    w = bnbf.dequantize_4bit(lin.weight.data, lin.weight.quant_state).float()
    return x.float() @ w.T


def rel(got: Any, want: Any) -> float:
    return float((got.float() - want).norm() / want.norm())


def measure(torch: Any, fn: Any, device: Any) -> float:
    """Milliseconds of fn(), replayed as a CUDA graph (the CPU: one timed call after a warm-up)."""
    import time

    if device.type != "cuda":
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    from triton.testing import do_bench_cudagraph

    return float(do_bench_cudagraph(fn, rep=50))


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from trainer.layers import linear4bit_rows

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = SMOKE if args.smoke else STORY
    layers = build(torch, shapes, 1 if args.smoke else LAYERS, device)
    from benchmarks.decode_speed import bandwidth  # the copy bandwidth decode_speed's limits use

    bw = bandwidth(torch, device) if device.type == "cuda" else None
    per_layer = nf4_bytes(shapes)
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        gen = torch.Generator().manual_seed(batch)
        x = {n: torch.randn(batch, i, generator=gen).bfloat16().to(device) for n, (_, i) in shapes.items()}
        want = {n: reference(torch, layers[0][n], x[n]) for n in shapes}

        def bnb_path(x: dict[str, Any] = x) -> list[Any]:
            return [type(lin).forward(lin, x[n]) for layer in layers for n, lin in layer.items()]

        paths = {"bitsandbytes": bnb_path}
        for tile in TILES if batch > 1 else ():  # rows_mm itself, whatever MIN_ROWS says

            def kernel(tile: int = tile, x: dict[str, Any] = x) -> list[Any]:
                saved = linear4bit_rows.TILE_OUTPUTS
                linear4bit_rows.TILE_OUTPUTS = tile
                try:
                    return [
                        linear4bit_rows.rows_mm(lin, x[n]) for layer in layers for n, lin in layer.items()
                    ]
                finally:
                    linear4bit_rows.TILE_OUTPUTS = saved

            default = " (default)" if tile == linear4bit_rows.TILE_OUTPUTS else ""
            paths[f"kernel bn{tile}{default}"] = kernel
        for name, fn in paths.items():
            try:
                outs = fn()
                err = max(rel(o, want[n]) for o, n in zip(outs, shapes, strict=False))
                ms = measure(torch, fn, device) / len(layers)
            except Exception as exc:  # a tile that does not build here: a row that says so
                rows.append({"batch": batch, "path": name, "failed": f"{type(exc).__name__}: {exc}"[:120]})
                continue
            limit = per_layer / bw * 1e3 if bw else None
            row = {"batch": batch, "path": name, "ms_a_layer": round(ms, 4), "rel_err": float(f"{err:.2e}")}
            if limit:
                row.update({"limit_ms": round(limit, 4), "x_limit": round(ms / limit, 2)})
            rows.append(row)
            print(f"[projections] batch {batch:>2} {name:>24}: {ms:.4f} ms a layer "
                  f"({row.get('x_limit', '-')}x the limit), rel {err:.1e}", flush=True)  # fmt: skip
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {
        "meta": {
            "device": name,
            "torch": torch.__version__,
            "bandwidth_tb_s": round(bw / 1e12, 3) if bw else None,
            "shapes": shapes,
            "layers": len(layers),
            "nf4_bytes_a_layer": per_layer,
        },
        "rows": rows,
    }


def render(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [
        "# A decode step's attention projections in NF4 (benchmarks/projection_speed.py)",
        "",
        f"{meta['device']}, torch {meta['torch']}; copy bandwidth {meta['bandwidth_tb_s']} TB/s. "
        f"A layer's q, k, v and o ({', '.join(f'{n} {o}x{i}' for n, (o, i) in meta['shapes'].items())}): "
        f"{meta['nf4_bytes_a_layer'] / 1e6:.1f} MB in NF4, the memory limit. {meta['layers']} layers in "
        "turn, replayed as a CUDA graph; ms a layer. rel: against float32 products of bitsandbytes' "
        "dequantized weights.",
        "",
        "| batch | path | ms a layer | memory limit ms | x limit | rel err |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if "failed" in r:
            lines.append(f"| {r['batch']} | {r['path']} | failed: {r['failed']} | | | |")
            continue
        lines.append(f"| {r['batch']} | {r['path']} | {r['ms_a_layer']} | {r.get('limit_ms', '-')} "
                     f"| {r.get('x_limit', '-')} | {r['rel_err']:.1e} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", default="1,8,64", help="decode batch sizes, comma-separated")
    parser.add_argument("--smoke", action="store_true", help="the CPU: Triton's interpreter, tiny shapes")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks/results"))
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        args.batches = "1,4"
    result = run(args)
    text = render(result)
    print(text)
    if not args.smoke:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        from benchmarks.cards import card_tag

        tag = card_tag(result["meta"]["device"])
        (out / f"projection_speed_{tag}.md").write_text(text)
        (out / f"projection_speed_{tag}.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
