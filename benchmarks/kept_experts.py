"""The NF4 experts as the trainer runs them, against the same module on dense bf16 weights.

Issue 29's kernel goal: the expert kernels at >= 90% of the dense bf16 grouped GEMM on the same shapes,
forward and backward, at 256 to 1,024 rows an expert. The trainer's experts (`NF4Experts`, the story's
shapes: E=128, gate_up [3072, 4096], down [4096, 1536], top-8) take the `dequant` path from about 384 rows
an expert (`cockpit.contract.dequant_rows`) and, under gradient checkpointing, keep the recompute's
dequantized weights for the backward (`training.keep_dequantized_experts`, on by default). A training
micro-batch runs, per layer: the checkpointed forward without gradients, then the recompute with
gradients and the backward. Timed here exactly so, on one whole module (routing, gather, grouped GEMMs,
activation, combine), for three modes:

  kept     as shipped: `COCKPIT_NF4_EXPERTS=dequant`, `keep_dequantized` on (two dequantizations a step)
  fused    the Triton grouped GEMM that dequantizes NF4 in its K loop, fwd and bwd (no dequantized copy)
  dense    the ceiling: the same module with its weights dequantized beforehand (no dequantization)

FLOPs: 2 x rows x (3072 x 4096 + 4096 x 1536) a pass, rows = tokens x 8; a training micro-batch is three
passes (forward, recompute, input-gradient backward: the experts are frozen). Rates against the GPU's
datasheet bf16 rate (989 TFLOP/s, H100 and H200 SXM) and against an 8192^3 torch matmul measured here.
Numerics: each mode's output and input gradient against the dense mode's (the same dequantized weights).

    python benchmarks/kept_experts.py                  # GPU: writes $OUT/kept_experts.{md,json}
    python benchmarks/kept_experts.py --tokens 4096    # one size
    python benchmarks/kept_experts.py --smoke          # CPU, Triton interpreter, tiny shapes
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DATASHEET_TFLOPS = 989.0
MODES = ("dense", "kept", "fused")  # dense first: the others are compared with it
GOAL = 0.90


def dense_module(torch: Any, module: Any, dense: dict[str, Any]) -> None:
    """Make `module` read `dense` (its weights dequantized beforehand) where it would dequantize."""
    from trainer.layers.frozen_experts import grouped_product

    zero = {k: torch.cat([w, w.new_zeros(1, *w.shape[1:])]) for k, w in dense.items()}

    def ends(x: Any, offs: Any) -> Any:
        return torch.cat([offs, torch.full((1,), x.shape[0], dtype=offs.dtype, device=offs.device)])

    def dequantized(which: str, x: Any, expert_ids: Any, offs: Any) -> tuple[Any, Any]:
        return zero[which], ends(x, offs)

    def packed_mm(which: str, x: Any, expert_ids: Any, offs: Any, trans: bool, path: str) -> Any:
        return grouped_product(x, zero[which], ends(x, offs), trans)

    module.dequantized, module.packed_mm = dequantized, packed_mm


def run_mode(torch: Any, module: Any, x: Any, index: Any, weights: Any, grad: Any) -> dict[str, Any]:
    """The module's calls of a checkpointed micro-batch: the forward, and the recompute + backward."""

    def forward() -> Any:
        with torch.no_grad():
            return module(x, index, weights)

    def recompute_backward() -> Any:
        x.grad = None
        y = module(x, index, weights)
        y.backward(grad)
        return y

    return {"forward": forward, "recompute_backward": recompute_backward}


def measure(torch: Any, ctx: dict[str, Any], tokens: int) -> list[dict[str, Any]]:
    """Every mode at one routing of `tokens` tokens: times, rates, and numerics against dense."""
    from benchmarks.nf4_kernels import gemm_flops, routing

    dev, dtype, topk, e = ctx["device"], ctx["dtype"], ctx["topk"], ctx["E"]
    index, _, offs = routing(torch, tokens, e, topk, False, dev, seed=tokens + 1)
    counts = torch.diff(offs, prepend=offs.new_zeros(1))
    weights = torch.rand(index.shape, device=dev, dtype=dtype)
    x = torch.randn(tokens, ctx["H"], device=dev, dtype=dtype, requires_grad=True)
    grad = torch.randn(tokens, ctx["H"], device=dev, dtype=dtype)
    flops = gemm_flops(ctx, tokens * topk)
    rows, outputs = [], {}
    for mode in MODES:
        module = ctx["modules"][mode]
        os.environ["COCKPIT_NF4_EXPERTS"] = "fused" if mode == "fused" else "dequant"
        calls = run_mode(torch, module, x, index, weights, grad)
        y = calls["recompute_backward"]()
        outputs[mode] = (y.detach().float().clone(), x.grad.detach().float().clone())
        fwd = ctx["timer"](calls["forward"])
        rb = ctx["timer"](calls["recompute_backward"])
        ref_y, ref_g = outputs["dense"]
        row = {
            "tokens": tokens,
            "rows_per_expert": tokens * topk / e,
            "min_rows": int(counts.min()),
            "max_rows": int(counts.max()),
            "mode": mode,
            "forward_ms": fwd,
            "recompute_backward_ms": rb,
            "step_ms": fwd + rb,
            "step_tflops": 3 * flops / (fwd + rb) / 1e9,
            "rel_out": float((outputs[mode][0] - ref_y).norm() / ref_y.norm()),
            "rel_grad": float((outputs[mode][1] - ref_g).norm() / ref_g.norm()),
        }
        rows.append(row)
        print(f"[kept] {tokens:>6} tok {mode:>5}: forward {fwd:.3f} ms, recompute+backward {rb:.3f} ms, "
              f"{row['step_tflops']:.0f} TFLOP/s", flush=True)  # fmt: skip
    dense = next(r for r in rows if r["mode"] == "dense")
    for r in rows:
        for part in ("forward", "recompute_backward", "step"):
            r[f"{part}_of_dense"] = dense[f"{part}_ms"] / r[f"{part}_ms"]
        r["pct_datasheet"] = 100 * r["step_tflops"] / DATASHEET_TFLOPS
        r["pct_matmul"] = 100 * r["step_tflops"] / ctx["peak_tflops"]
    return rows


def report(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [
        "# NF4 experts as the trainer runs them, against dense bf16 (benchmarks/kept_experts.py)",
        "",
        f"{meta['gpu']}; torch {meta['torch']}; bf16 matmul measured {meta['peak_tflops']:.0f} TFLOP/s "
        f"(8192^3); datasheet {DATASHEET_TFLOPS:.0f}. One module, the story's shapes (E={meta['E']}, "
        f"top-{meta['topk']}), uneven random routing. A training micro-batch = forward without gradients, "
        "then recompute + backward (gradient checkpointing); FLOPs a step = 3 x 2 x rows x (gate_up + down "
        "weights). 'of dense' = dense time / this time (goal >= 0.90). Times: medians, CUDA events, L2 "
        "flushed. rel: against the dense mode's output and input gradient.",
        "",
        "| tokens | rows/expert | min-max rows | mode | forward ms | recompute+backward ms | step ms "
        "| TFLOP/s | % datasheet | % matmul | forward of dense | rec+bwd of dense | step of dense "
        "| rel out | rel grad |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tokens']} | {r['rows_per_expert']:.0f} | {r['min_rows']}-{r['max_rows']} | {r['mode']} "
            f"| {r['forward_ms']:.3f} | {r['recompute_backward_ms']:.3f} | {r['step_ms']:.3f} "
            f"| {r['step_tflops']:.0f} | {r['pct_datasheet']:.1f}% | {r['pct_matmul']:.1f}% "
            f"| {r['forward_of_dense']:.3f} | {r['recompute_backward_of_dense']:.3f} "
            f"| **{r['step_of_dense']:.3f}** | {r['rel_out']:.1e} | {r['rel_grad']:.1e} |"
        )
    return "\n".join(lines)


def setup(torch: Any, smoke: bool) -> dict[str, Any]:
    """Packed random weights, their dense copies, one module per mode and the timer."""
    from benchmarks.nf4_kernels import SMOKE, STORY, make_packed, matmul_peak, packed_module, timer
    from trainer.kernels.nf4_ref import nf4_dequantize_ref
    from trainer.nf4_pack import PackedLayout

    geometry = SMOKE if smoke else STORY
    device = torch.device("cpu" if smoke else "cuda")
    dtype = torch.float32 if smoke else torch.bfloat16
    e, h, w, topk = geometry["experts"], geometry["hidden"], geometry["width"], geometry["topk"]
    layouts = {
        "gate_up_proj": PackedLayout(e, 2 * w, h, torch.bfloat16),
        "down_proj": PackedLayout(e, h, w, torch.bfloat16),
    }
    packed = {k: make_packed(torch, layout, device, True) for k, layout in layouts.items()}
    dense = {k: nf4_dequantize_ref(packed[k], layouts[k], list(range(e)), dtype) for k in layouts}
    modules = {}
    for mode in MODES:
        module = packed_module(torch, packed, e, h, w, dtype)
        module.keep_dequantized = mode != "fused"
        if mode == "dense":
            dense_module(torch, module, dense)
        modules[mode] = module
    ms = timer(torch, device)
    peak = matmul_peak(torch, device, ms)
    return {
        "device": device, "dtype": dtype, "E": e, "H": h, "topk": topk, "layouts": layouts,
        "modules": modules, "timer": ms, "peak_tflops": peak, "tokens": geometry["tokens"],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", help="comma-separated token counts (default 4096,8192,16384)")
    parser.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter, tiny shapes")
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton kernels are defined
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("kept_experts: no CUDA device; --smoke checks the script on the CPU", file=sys.stderr)
        return 2
    ctx = setup(torch, args.smoke)
    default = ctx["tokens"][-2:] if args.smoke else [4096, 8192, 16384]
    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else default
    meta = {
        "gpu": torch.cuda.get_device_name() if ctx["device"].type == "cuda" else "CPU",
        "torch": torch.__version__, "E": ctx["E"], "topk": ctx["topk"], "peak_tflops": ctx["peak_tflops"],
    }  # fmt: skip
    rows = [row for n in tokens for row in measure(torch, ctx, n)]
    md = report(meta, rows)
    print(md, flush=True)
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO / "benchmarks" / "results"
    name = "kept_experts_smoke" if args.smoke else "kept_experts"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(md + "\n")
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
