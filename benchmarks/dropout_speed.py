"""Benchmark: LoRA's dropout and A matrix at the story's shapes, torch's two kernels against the cockpit's.

A story step is 32,768 tokens (8 rows of 4,096). Each decoder layer's LoRA adapters (rank 16, dropout 0.05)
run `lora_A(dropout(x))` on the hidden state for the query, key and value projections (4,096 wide, three
draws) and on the attention output for the output projection (8,192 wide): in forward, in recompute and
in backward. torch: `F.dropout` then `F.linear` (the dropped input written, read and saved; backward
scales the input gradient by the mask in one more pass). `trainer.kernels.dropout_linear`: the mask drawn
inside the product, nothing of [tokens, width] written forward.

For each width and path: forward ms, forward + backward ms (both the input's and A's gradients), and
the largest error of the output and both gradients against a float32 reference on the kernel's own mask
(read through identity weights on a 1,024-row slice; torch's draw is another, so its row has none). Then
one layer-step: three draws at 4,096 and one at 8,192, forward twice and backward once. CUDA events,
median of `--iters` after 3 warm-ups.

    python benchmarks/dropout_speed.py --out DIR    # DIR/dropout_speed.{md,json} (committed as _h200)
    python benchmarks/dropout_speed.py --smoke      # CPU, tiny shapes, torch's path only
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
RANK, P = 16, 0.05
WIDTHS = ((4096, 3), (8192, 1))  # (input width, draws a layer: query, key and value share the hidden state)
CHECK_ROWS = 1024
TILES = ((64, 256, 4), (128, 256, 8), (64, 128, 4), (32, 256, 4))  # (rows, columns, warps) tried beside it


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _errors(torch: Any, kernel: Any, width: int, device: Any) -> dict[str, float]:
    """The kernel's output and gradients against float32 arithmetic on its own mask (bf16 inputs)."""
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(CHECK_ROWS, width, generator=gen).to(device, torch.bfloat16)
    a = (torch.randn(RANK, width, generator=gen) / width**0.5).to(device, torch.bfloat16)
    g = torch.randn(CHECK_ROWS, RANK, generator=gen).to(device, torch.bfloat16)
    seed = torch.tensor([12345], dtype=torch.int64, device=device)
    ones, eye = torch.ones_like(x), torch.eye(width, device=device, dtype=torch.bfloat16)
    mask = torch.cat([kernel.dropout_linear(ones, eye[c : c + 64], P, seed) for c in range(0, width, 64)], 1)
    mask = (mask != 0).float()
    xr, ar = x.float().requires_grad_(True), a.float().requires_grad_(True)
    want = (xr * mask / (1 - P)) @ ar.t()
    want.backward(g.float())
    xk, ak = x.clone().requires_grad_(True), a.clone().requires_grad_(True)
    got = kernel.dropout_linear(xk, ak, P, seed)
    got.backward(g)

    def rel(u: Any, v: Any) -> float:
        return float((u.float() - v).abs().max() / v.abs().max())

    return {"err_h": rel(got, want), "err_dx": rel(xk.grad, xr.grad), "err_da": rel(ak.grad, ar.grad)}


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
    paths: dict[str, Any] = {"torch": lambda x, a: F.linear(F.dropout(x, P, True), a)}
    kernel = None
    tiles: dict[str, tuple[int, int, int]] = {}
    if not args.smoke:
        from trainer.kernels import dropout_linear as kernel

        shipped = (kernel.BM, kernel.BK, kernel.WARPS)
        for bm, bk, warps in dict.fromkeys([shipped, *TILES]):
            name = f"triton {bm}x{bk} w{warps}" + (" (shipped)" if (bm, bk, warps) == shipped else "")
            tiles[name] = (bm, bk, warps)
            paths[name] = lambda x, a: kernel.dropout_linear(x, a, P)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for width, draws in WIDTHS:
        x = torch.randn(tokens, width, generator=gen).to(device, torch.bfloat16)
        a = (torch.randn(RANK, width, generator=gen) / width**0.5).to(device, torch.bfloat16)
        g = torch.randn(tokens, RANK, generator=gen).to(device, torch.bfloat16)
        if kernel is not None:
            kernel.BM, kernel.BK, kernel.WARPS = shipped
        errors = _errors(torch, kernel, width, device) if kernel is not None else {}
        for path, fn in paths.items():
            if path in tiles:
                kernel.BM, kernel.BK, kernel.WARPS = tiles[path]
            row: dict[str, Any] = {"width": width, "path": path, "tokens": tokens, "draws": draws}
            row.update(errors if path.endswith("(shipped)") else {})
            row["fwd_ms"] = median_ms(torch, device, lambda fn=fn, x=x, a=a: fn(x, a), args.iters)

            def both(fn: Any = fn, x: Any = x, a: Any = a, g: Any = g) -> None:
                fn(x.detach().requires_grad_(True), a.detach().requires_grad_(True)).backward(g)

            row["fwd_bwd_ms"] = median_ms(torch, device, both, args.iters)
            row["bwd_ms"] = row["fwd_bwd_ms"] - row["fwd_ms"]
            row["layer_ms"] = draws * (2 * row["fwd_ms"] + row["bwd_ms"])
            log(json.dumps(row))
            rows.append(row)
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    meta = {"gpu": gpu, "torch": torch.__version__, "rank": RANK, "p": P}
    text = table(meta, rows)
    print(text)
    out_dir = args.out or Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "dropout_speed.md").write_text(text)
    (out_dir / "dropout_speed.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


def table(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The results as markdown: a row a width and path, then a layer-step's draws by path."""
    lines = [
        f"# LoRA's dropout and A matrix at the story's shapes (bf16, rank {meta['rank']}, p {meta['p']})",
        "",
        f"{meta['gpu']}, torch {meta['torch']}. Error: the largest difference from float32 arithmetic on the "
        f"kernel's own mask over the reference's largest value ({CHECK_ROWS:,} rows, the shipped tiles); "
        "torch's draw is another mask, so its row has none. Other tiles draw other masks (the Philox "
        "counters follow the tiles).",
        "",
        "| width | tokens | path | forward ms | backward ms | error h / dx / dA |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        err = f"{r['err_h']:.1e} / {r['err_dx']:.1e} / {r['err_da']:.1e}" if "err_h" in r else "-"
        times = f"{r['fwd_ms']:.3f} | {r['bwd_ms']:.3f}"
        lines.append(f"| {r['width']:,} | {r['tokens']:,} | {r['path']} | {times} | {err} |")
    lines += ["", "A layer-step's draws (three at 4,096, one at 8,192; forward twice, backward once):", ""]
    lines += ["| path | ms a layer-step |", "|---|---|"]
    for path in dict.fromkeys(r["path"] for r in rows):
        lines.append(f"| {path} | {sum(r['layer_ms'] for r in rows if r['path'] == path):.2f} |")
    lines += ["", "Reproduce: `python benchmarks/dropout_speed.py` on the GPU (under a minute)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
