"""Benchmark: the forward NF4 grouped GEMM with split nibbles (`benchmarks/nf4_split_kernel.py`) against
the interleaving kernel (`nf4_triton.nf4_grouped_mm`, its picked config), decoding and training shapes.
Since `pick_config` hands bf16 forwards of 0.25 to 32 rows an expert to the scale-on-accumulator kernel
(`trainer/kernels/nf4_decode.py`), the picked config's rows at decoding sizes time that kernel;
`nf4_split_h200*.md` were measured before it, on the fused kernel.

Shapes: the story's experts (E=128, gate_up W [3072, 4096], down W [4096, 1536], top-8), one forward
pass over both weights. Decoding: 1, 8, 64 and 256 tokens (0.06 to 16 rows an expert); training: 4096
and 16384 tokens (256 and 1024 rows an expert), where `torch._grouped_mm` on the same weights in bf16
(dequantized beforehand) is the dense ceiling.

Memory limit (decoding) = bytes the pass must read (the hit experts' NF4 codes and block scales, x) and
write (out), over the device-copy bandwidth this script measures. FLOPs = 2 x rows x out x in a GEMM.
Numerics: every kernel's output (written over NaN) against the float32 reference, rel = ||d|| / ||ref||.

Run from the repository root (one command, ~4 minutes on an H200 with Triton compilation):
  python benchmarks/nf4_split.py --out DIR    # DIR/nf4_split.{md,json}, else benchmarks/results/
  python benchmarks/nf4_split.py --smoke      # CPU, Triton interpreter, tiny shapes: checks the script
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DECODE_TOKENS = (1, 8, 64, 256)
TRAIN_TOKENS = (4096, 16384)
# (label, SplitConfig kwargs) tried at decoding shapes; the first is the module's default.
DECODE_CONFIGS = [
    ("bm16 bn128 bk128 w4 s4 late", {}),
    ("bm16 bn128 bk128 w4 s4 late flat", {"flat": True}),
    ("bm16 bn128 bk64 w4 s6 late flat", {"bk": 64, "stages": 6, "flat": True}),
    ("bm16 bn128 bk256 w4 s3 late flat", {"bk": 256, "stages": 3, "flat": True}),
    ("bm16 bn128 bk128 w4 s4 late flat 4/SM", {"programs_per_sm": 4, "flat": True}),
    ("bm16 bn64 bk128 w4 s4 late flat", {"bn": 64, "flat": True}),
    ("bm16 bn64 bk128 w4 s4 late flat 4/SM", {"bn": 64, "flat": True, "programs_per_sm": 4}),
    ("bm32 bn128 bk128 w4 s4 late flat", {"bm": 32, "flat": True}),
    ("bm16 bn128 bk128 w4 s4 early flat", {"late": False, "flat": True}),
    ("bm16 bn128 bk128 w4 s4 early", {"late": False}),
    ("bm16 bn64 bk128 w4 s4 late", {"bn": 64}),
    ("bm16 bn128 bk256 w4 s3 late", {"bk": 256, "stages": 3}),
    ("bm16 bn128 bk64 w4 s6 late", {"bk": 64, "stages": 6}),
    ("bm16 bn256 bk128 w8 s4 late", {"bn": 256, "warps": 8}),
    ("bm16 bn128 bk128 w4 s4 late 1/SM", {"programs_per_sm": 1}),
    ("bm16 bn128 bk128 w4 s4 late 4/SM", {"programs_per_sm": 4}),
    ("bm32 bn128 bk128 w4 s4 late", {"bm": 32}),
]
# Variants of the interleaving kernel's decoding config (DECODE_GROUPS: bm16 bn128 bk128 w4 s4, 2/SM).
INTERLEAVED_BASE = {
    "bm": 16,
    "bn": 128,
    "bk": 128,
    "warps": 4,
    "stages": 4,
    "swap": True,
    "decode": 2,
    "programs_per_sm": 2,
}
INTERLEAVED_CONFIGS = [
    ("bm16 bn128 bk128 w4 s4 4/SM", {"programs_per_sm": 4}),
    ("bm32 bn128 bk128 w4 s4", {"bm": 32}),
    ("bm32 bn128 bk128 w4 s4 4/SM", {"bm": 32, "programs_per_sm": 4}),
    ("bm64 bn128 bk128 w4 s4", {"bm": 64}),
    ("bm32 bn128 bk64 w4 s6", {"bm": 32, "bk": 64, "stages": 6}),
]
TRAIN_CONFIGS = [
    (
        "bm128 bn128 bk64 w8 s3 early",
        {"bm": 128, "bn": 128, "bk": 64, "warps": 8, "stages": 3, "late": False},
    ),
    (
        "bm256 bn128 bk64 w8 s3 early",
        {"bm": 256, "bn": 128, "bk": 64, "warps": 8, "stages": 3, "late": False},
    ),
    (
        "bm128 bn256 bk64 w8 s3 early",
        {"bm": 128, "bn": 256, "bk": 64, "warps": 8, "stages": 3, "late": False},
    ),
    (
        "bm256 bn128 bk128 w8 s3 early",
        {"bm": 256, "bn": 128, "bk": 128, "warps": 8, "stages": 3, "late": False},
    ),
    (
        "bm256 bn128 bk64 w8 s4 early",
        {"bm": 256, "bn": 128, "bk": 64, "warps": 8, "stages": 4, "late": False},
    ),
    (
        "bm128 bn128 bk64 w4 s4 early",
        {"bm": 128, "bn": 128, "bk": 64, "warps": 4, "stages": 4, "late": False},
    ),
]


def log(msg: str) -> None:
    print(f"[nf4_split] {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter, tiny shapes")
    parser.add_argument(
        "--out", help="folder for nf4_split.{md,json} (default $OUT, else benchmarks/results)"
    )
    parser.add_argument("--decode-only", action="store_true", help="only the decoding shapes")
    parser.add_argument("--tokens", help="comma-separated decoding batches (default 1,8,64,256)")
    parser.add_argument("--budget-s", type=float, default=420, help="start no new measurement after this")
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from benchmarks import nf4_split_kernel as nf4_split
    from benchmarks.nf4_kernels import make_packed, reference, routing, timer
    from trainer.kernels import nf4_triton
    from trainer.kernels.nf4_ref import nf4_dequantize_ref, nf4_scales
    from trainer.nf4_pack import PackedLayout

    if not args.smoke and not torch.cuda.is_available():
        log("no CUDA device: run with --smoke for the CPU check of this script")
        return 2
    start = time.monotonic()
    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    e, h, w, topk = (8, 128, 64, 2) if args.smoke else (128, 4096, 1536, 8)
    layouts = {
        "gate_up_proj": PackedLayout(e, 2 * w, h, torch.bfloat16),
        "down_proj": PackedLayout(e, h, w, torch.bfloat16),
    }
    try:
        import bitsandbytes  # noqa: F401

        have_bnb = True
    except Exception:
        have_bnb = False
    packed = {k: make_packed(torch, lay, device, have_bnb) for k, lay in layouts.items()}
    scales = {k: nf4_scales(packed[k], lay, torch.arange(e, device=device)) for k, lay in layouts.items()}
    ms = timer(torch, device)
    meta: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "CPU (interpreter)"
    }
    if device.type == "cuda":
        src = torch.empty(2**30, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        meta["copy_tb_s"] = 2 * src.numel() / ms(lambda: dst.copy_(src)) / 1e9
        del src, dst
        a = torch.randn(8192, 8192, device=device, dtype=dtype)
        meta["matmul_tflops"] = 2 * 8192**3 / ms(lambda: a @ a) / 1e9
        del a
    else:
        meta["copy_tb_s"] = meta["matmul_tflops"] = float("nan")
    log(f"{meta['gpu']}: copy {meta['copy_tb_s']:.2f} TB/s, matmul {meta['matmul_tflops']:.0f} TFLOP/s")
    experts = torch.arange(e, device=device, dtype=torch.int32)
    rows: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    dense = None

    def measure(
        case: str, tokens: int, name: str, fn: Any, xs: dict[str, Any], offs: Any, extra: dict[str, Any]
    ) -> None:
        if time.monotonic() - start > args.budget_s:
            rows.append({"case": case, "kernel": name, "status": "skipped (budget)"})
            return
        m = xs["gate_up_proj"].shape[0]
        try:
            rel = 0.0
            for which, lay in layouts.items():
                x = xs[which]
                out = torch.full((m, lay.out), float("nan"), device=device, dtype=dtype)
                got = fn(which, x, out)
                ref = reference(torch, {"packed": packed, "layouts": layouts}, which, x.float(), offs, False)
                rel = max(rel, float((got.float() - ref).norm() / ref.norm()))
            t = ms(lambda: [fn(which, xs[which], None) for which in layouts])
        except Exception as exc:  # a config that does not compile or run here
            rows.append(
                {"case": case, "kernel": name, "status": f"failed: {type(exc).__name__}: {str(exc)[:120]}"}
            )
            log(f"{case} {name}: failed {type(exc).__name__}: {str(exc)[:200]}")
            return
        flops = sum(2.0 * m * lay.out * lay.inp for lay in layouts.values())
        row = {
            "case": case,
            "tokens": tokens,
            "kernel": name,
            "ms": t,
            "tflops": flops / t / 1e9,
            "rel": rel,
            "status": "ok" if rel < 1e-2 else "WRONG",
            **extra,
        }
        if "limit_ms" in extra:
            row["x_limit"] = t / extra["limit_ms"]
        rows.append(row)
        checks.append({"case": case, "kernel": name, "rel": rel, "ok": rel < 1e-2})
        limit = f"{row['x_limit']:5.2f}x limit " if "x_limit" in row else ""
        log(f"{case:>14} {name:>34}: {t:8.3f} ms {row['tflops']:6.0f} TFLOP/s {limit}rel {rel:.1e}")

    decode_tokens = tuple(int(t) for t in args.tokens.split(",")) if args.tokens else DECODE_TOKENS
    for tokens in (2, 8) if args.smoke else decode_tokens + (() if args.decode_only else TRAIN_TOKENS):
        training = tokens in TRAIN_TOKENS and not args.smoke
        _, _, offs = routing(torch, tokens, e, topk, False, device, seed=tokens)
        m = tokens * topk
        counts = torch.diff(offs, prepend=offs.new_zeros(1))
        hit = int((counts > 0).sum())
        xs = {k: torch.randn(m, lay.inp, device=device, dtype=dtype) for k, lay in layouts.items()}
        case = f"{tokens} tok ({m / e:.2g} rows/exp)"
        weight_bytes = sum(
            hit * (lay.numel // 2 + lay.blocks + 4 * (lay.blocks // lay.nested + 1))
            for lay in layouts.values()
        )
        io_bytes = sum(2 * m * (lay.inp + lay.out) for lay in layouts.values())
        extra = {"rows_per_expert": m / e, "experts_hit": hit, "bytes": weight_bytes + io_bytes}
        if not training:
            extra["limit_ms"] = (weight_bytes + io_bytes) / meta["copy_tb_s"] / 1e9

        def old(which: str, x: Any, out: Any, offs: Any = offs) -> Any:
            return nf4_triton.nf4_grouped_mm(
                x, packed[which], layouts[which], experts, offs, False, None, out
            )

        measure(case, tokens, "interleaved (picked config)", old, xs, offs, extra)
        for label, kw in [] if training or args.smoke else INTERLEAVED_CONFIGS:
            mm = nf4_triton.MMConfig(**{**INTERLEAVED_BASE, **kw})

            def interleaved(which: str, x: Any, out: Any, mm: Any = mm, offs: Any = offs) -> Any:
                return nf4_triton.nf4_grouped_mm(
                    x, packed[which], layouts[which], experts, offs, False, mm, out
                )

            measure(case, tokens, f"interleaved {label}", interleaved, xs, offs, extra)
        for label, kw in TRAIN_CONFIGS if training else DECODE_CONFIGS:
            if args.smoke:
                kw = {**kw, "bm": 16, "bn": 64, "bk": 64, "decode": nf4_triton.TREE, "flat": True}
            kw = dict(kw)  # the table's dicts are shared by every batch
            flat = kw.pop("flat", False)
            cfg = nf4_split.SplitConfig(**kw)

            def split(
                which: str, x: Any, out: Any, cfg: Any = cfg, offs: Any = offs, flat: bool = flat
            ) -> Any:
                sc = scales[which] if flat else None
                return nf4_split.nf4_split_mm(x, packed[which], layouts[which], experts, offs, cfg, out, sc)

            measure(case, tokens, f"split {label}", split, xs, offs, extra)
            if args.smoke:
                break
        if training:
            if dense is None:
                dense = {k: nf4_dequantize_ref(packed[k], layouts[k], list(range(e)), dtype) for k in layouts}

            def grouped(which: str, x: Any, out: Any, offs: Any = offs, dense: Any = dense) -> Any:
                return torch._grouped_mm(x, dense[which].transpose(-2, -1), offs=offs)

            measure(case, tokens, "dense bf16 torch._grouped_mm", grouped, xs, offs, extra)
    write(args, meta, rows, checks)
    return 0 if all(c["ok"] for c in checks) else 1


def write(
    args: argparse.Namespace, meta: dict[str, Any], rows: list[dict[str, Any]], checks: list[dict[str, Any]]
) -> None:
    lines = [
        "# The forward NF4 grouped GEMM, split nibbles against interleaved (benchmarks/nf4_split.py)",
        "",
        f"{meta['gpu']}; device copy {meta['copy_tb_s']:.2f} TB/s, bf16 matmul 8192^3 "
        f"{meta['matmul_tflops']:.0f} TFLOP/s (measured here); datasheet bf16 989 TFLOP/s.",
        "One forward pass over both expert weights (gate_up [3072, 4096], then down [4096, 1536]), "
        "E=128, top-8. Times: medians of triton.testing.do_bench (L2 flushed). x limit: time over the "
        "bytes read and written at the copy bandwidth.",
        "",
        "| case | kernel | ms | TFLOP/s | % of 989 | x memory limit | rel vs fp32 | status |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "ms" not in r:
            lines.append(f"| {r['case']} | {r['kernel']} | - | - | - | - | - | {r['status']} |")
            continue
        lim = f"{r['x_limit']:.2f}" if "x_limit" in r else "-"
        pct = 100 * r["tflops"] / 989
        lines.append(f"| {r['case']} | {r['kernel']} | {r['ms']:.4f} | {r['tflops']:.0f} | {pct:.1f} "
                     f"| {lim} | {r['rel']:.1e} | {r['status']} |")  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out or os.environ.get("OUT") or Path(__file__).parent / "results")
    out.mkdir(parents=True, exist_ok=True)
    name = "nf4_split_smoke" if args.smoke else "nf4_split"
    (out / f"{name}.md").write_text(text)
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows, "checks": checks}, indent=1))
    log(f"wrote {out / name}.md and .json")


if __name__ == "__main__":
    sys.exit(main())
