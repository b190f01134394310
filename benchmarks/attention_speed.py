"""Benchmark: packed causal attention at the story's shape, each path the trainer could take, side by side.

Shape: a micro-batch of the story's profile as it was (4 rows of 4,096 tokens, 8 since; documents of
about 2,000 tokens packed whole, best fit, each row's tail padding), Qwen3-235B-A22B's attention (64
query heads, 4 key/value heads, head_dim 128), bf16, the layout Transformers hands the attention
([B, H, T, D] views of [B, T, H, D]).

Paths:
  per-document   `trainer.layers.attention._per_document`: causal SDPA one document at a time
                 (FlashAttention-2), outputs concatenated: the trainer's path before, and its path where
                 the packed call is not
  packed         `trainer.layers.attention.packed_attention` with COCKPIT_VARLEN_KERNEL=torch: the whole
                 micro-batch in one `varlen_attn` call (FlashAttention-2; the trainer's GPU path where
                 FlashAttention-4 is absent)
  flash4         the same call through FlashAttention-4 (`trainer.layers.flash4`: the `flash-attn-4` package,
                 CUTLASS's Python DSL; its kernels compiled before the timing, by its probe)
  cudnn          the per-document loop under SDPA's cuDNN backend (timed after its per-length plans are
                 built: a first length costs ~0.1 s)
  flex           FlexAttention, compiled, with a document-causal block mask (mask built outside the timing)
  cudnn-ragged   the whole micro-batch as one nested (jagged) tensor, its segments as `packed` has them,
                 in one SDPA call under the cuDNN backend; key/value heads repeated for the query heads
                 where that call takes no grouped heads

Timings: CUDA events, median of `--iters` after 3 warm-ups; forward alone and forward + backward.
FLOPs (causal, per document of n tokens): forward 4 x n^2/2 x heads x head_dim (QK^T and PV), backward
2.5x the forward; TFLOP/s and MFU against the H200's 989 TFLOP/s datasheet dense bf16 rate and the
8192^3 bf16 matmul rate this script measures. Numerics: each path's output and gradients against a
float32 per-document reference, rel = ||d|| / ||ref||, outputs over the documents' tokens (the padding
attends to itself only, and its output differs by path), with no upstream gradient on the padding (as the
loss gives none there).

    python benchmarks/attention_speed.py --out DIR  # DIR/attention_speed.{md,json} (committed as _h200)
    python benchmarks/attention_speed.py --smoke    # CPU, tiny shapes: the per-document path only
    python benchmarks/attention_speed.py --paths packed,flash4 --rows 8  # the story's micro-batch, two paths
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DATASHEET_TFLOPS = 989.0  # H100/H200 SXM dense bf16
WARMUPS = 3  # calls before the timed ones
MEAN_TOKENS = 2000  # the story's examples (benchmarks/step_speed.py STORY_MEAN_TOKENS)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def story_rows(rows: int, length: int, mean: int, seed: int = 0) -> list[list[int]]:
    """Documents of about `mean` tokens (normal, sd mean/5, 64 to length) packed whole, best fit, into
    `rows` rows of `length` (`trainer.inputs.packing.best_fit_decreasing`), first rows kept."""
    from trainer.inputs.packing import best_fit_decreasing

    rng = random.Random(seed)
    lens = [max(64, min(length, int(rng.gauss(mean, mean / 5)))) for _ in range(rows * length // mean + 8)]
    bins = best_fit_decreasing(lens, length, seed)
    return [[lens[i] for i in members] for members in bins[:rows]]


def flops(doc_lens: list[list[int]], heads: int, head_dim: int) -> float:
    """Forward FLOPs of causal attention over every document: 4 x n^2/2 x heads x head_dim each."""
    return sum(2.0 * n * n * heads * head_dim for lens in doc_lens for n in lens)


def median_ms(
    torch: Any, device: Any, run: Any, iters: int, prepare: Any = tuple, warmups: int = WARMUPS
) -> float:
    """Median milliseconds of `run(*prepare())` over `iters` calls after `warmups`: CUDA events around
    `run` on a GPU (`prepare`, making its inputs, outside them), the wall clock on the CPU."""
    times = []
    for i in range(iters + warmups):
        inputs = prepare()
        if device.type == "cuda":
            torch.cuda.synchronize()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        wall = time.perf_counter()
        run(*inputs)
        if device.type == "cuda":
            stop.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(stop)
        else:
            ms = (time.perf_counter() - wall) * 1e3
        if i >= warmups:
            times.append(ms)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=None, help="folder for the .md and .json")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rows", type=int, default=4, help="rows of 4,096 tokens (the story ships 8)")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, the per-document path")
    parser.add_argument("--paths", default="", help="comma-separated paths to run (default: every one)")
    args = parser.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from trainer.layers import attention, flash4

    if not args.smoke and not torch.cuda.is_available():
        log("no CUDA device: run with --smoke for the CPU check of this script")
        return 2
    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    b, t, h, hkv, d = (2, 256, 4, 2, 16) if args.smoke else (args.rows, 4096, 64, 4, 128)
    doc_lens = story_rows(b, t, 100 if args.smoke else MEAN_TOKENS)
    scale = d**-0.5
    gen = torch.Generator(device="cpu").manual_seed(0)
    q0, k0, v0 = (torch.randn(b, t, n, d, generator=gen).to(device, dtype) for n in (h, hkv, hkv))
    valid = torch.zeros(b, t, dtype=torch.bool, device=device)
    for i, lens in enumerate(doc_lens):
        valid[i, : sum(lens)] = True
    # no gradient reaches the padding, as in training (it has no label and no document reads it)
    grad_out = (torch.randn(b, t, h, d, generator=gen).to(device) * valid[:, :, None, None]).to(dtype)

    def per_document(q: Any, k: Any, v: Any) -> Any:
        return attention.per_document_attention(q, k, v, doc_lens, 0.0, scale)

    def packed(q: Any, k: Any, v: Any) -> Any:
        attention.CHOICE = "torch"
        out = attention.packed_attention(q, k, v, doc_lens, scale)
        if out is None:
            raise RuntimeError("the packed call is unavailable here")
        return out

    def cudnn(q: Any, k: Any, v: Any) -> Any:
        rows = []
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            for i, lens in enumerate(doc_lens):
                parts, start = [], 0
                for n in lens:
                    qs, ks, vs = (x[i : i + 1, :, start : start + n] for x in (q, k, v))
                    parts.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale,
                                                                enable_gqa=True))  # fmt: skip
                    start += n
                parts.append(q.new_zeros(1, h, t - start, d))
                rows.append(torch.cat(parts, dim=2))
        return torch.cat(rows).transpose(1, 2)

    offsets = torch.tensor(attention.segments(doc_lens, t), dtype=torch.int64, device=device)

    def cudnn_ragged(q: Any, k: Any, v: Any, gqa: bool = True) -> Any:
        def nested(x: Any) -> Any:  # [B, H, T, D] -> [segments, H, j, D]
            flat = x.transpose(1, 2).reshape(b * t, x.shape[1], d)
            if not gqa and x.shape[1] != h:
                flat = flat.repeat_interleave(h // x.shape[1], dim=1)
            return torch.nested.nested_tensor_from_jagged(flat, offsets).transpose(1, 2)

        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            out = F.scaled_dot_product_attention(nested(q), nested(k), nested(v), is_causal=True, scale=scale,
                                                 enable_gqa=gqa)  # fmt: skip
        return out.transpose(1, 2).values().view(b, t, h, d)

    paths: dict[str, Any] = {"per-document": per_document}
    if not args.smoke:
        paths["packed"] = packed
        if flash4.find(device, h, hkv, d, dtype, forced=True) is not None:  # probed (and compiled) here

            def flash4_path(q: Any, k: Any, v: Any) -> Any:
                attention.CHOICE = "flash4"
                return attention.packed_attention(q, k, v, doc_lens, scale)

            paths["flash4"] = flash4_path
        else:
            log("flash4: FlashAttention-4 unavailable here (see the warning above)")
        paths["cudnn"] = cudnn
        paths["cudnn-ragged"] = cudnn_ragged
        paths["cudnn-ragged-repeat"] = lambda q, k, v: cudnn_ragged(q, k, v, gqa=False)
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            doc = torch.full((b, t), -1, dtype=torch.int32, device=device)
            for i, lens in enumerate(doc_lens):
                start = 0
                for j, n in enumerate(lens):
                    doc[i, start : start + n] = j
                    start += n

            def document_causal(bi: Any, hi: Any, qi: Any, ki: Any) -> Any:
                return (doc[bi, qi] == doc[bi, ki]) & (qi >= ki) & (doc[bi, qi] >= 0)

            mask = create_block_mask(document_causal, b, None, t, t, device=device)
            compiled = torch.compile(flex_attention)

            def flex(q: Any, k: Any, v: Any) -> Any:
                out = compiled(q, k, v, block_mask=mask, scale=scale, enable_gqa=True)
                return out.transpose(1, 2) * valid[:, :, None, None]

            paths["flex"] = flex
        except Exception as exc:  # no FlexAttention here: the table says so
            log(f"flex: {type(exc).__name__}: {exc}")

    def fresh(requires_grad: bool) -> tuple[Any, Any, Any]:
        return tuple(x.transpose(1, 2).detach().clone().requires_grad_(requires_grad) for x in (q0, k0, v0))

    def reference() -> list[Any]:
        q, k, v = (x.float().transpose(1, 2).detach().clone().requires_grad_(True) for x in (q0, k0, v0))
        out = attention.per_document_attention(q, k, v, doc_lens, 0.0, scale)
        out.backward(grad_out.float())
        return [out.detach(), *(x.grad.transpose(1, 2) for x in (q, k, v))]

    def timed(fn: Any, backward: bool) -> float:
        def run(q: Any, k: Any, v: Any) -> None:
            out = fn(q, k, v)
            if backward:
                out.backward(grad_out)

        return median_ms(torch, device, run, args.iters, prepare=lambda: fresh(backward))

    meta: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "CPU",
        "torch": torch.__version__,
        "shape": {"rows": b, "tokens": t, "heads": h, "kv_heads": hkv, "head_dim": d},
        "doc_lens": doc_lens,
    }
    if device.type == "cuda":
        a = torch.randn(8192, 8192, device=device, dtype=dtype)
        meta["matmul_tflops"] = 2 * 8192**3 / timed(lambda *_: a @ a, False) / 1e9
        del a
    else:
        meta["matmul_tflops"] = float("nan")
    fwd_flops = flops(doc_lens, h, d)
    ref = reference()
    rows: list[dict[str, Any]] = []
    chosen = [p for p in args.paths.split(",") if p]
    for name, fn in paths.items():
        if chosen and name not in chosen:
            continue
        row: dict[str, Any] = {"path": name}
        try:
            q, k, v = fresh(True)
            out = fn(q, k, v)
            out.backward(grad_out)
            mine = [out.detach(), *(x.grad.transpose(1, 2) for x in (q, k, v))]
            keep = valid[:, :, None, None]
            for label, x, r in zip(("out", "dq", "dk", "dv"), mine, ref, strict=True):
                x, r = x.float(), r.float()
                if label == "out":
                    x, r = x * keep, r * keep
                row[f"rel_{label}"] = float((x - r).norm() / r.norm())
            row["fwd_ms"] = timed(fn, False)
            row["fwd_bwd_ms"] = timed(fn, True)
            row["fwd_bwd_tflops"] = 3.5 * fwd_flops / row["fwd_bwd_ms"] / 1e9
            row["mfu_datasheet"] = row["fwd_bwd_tflops"] / DATASHEET_TFLOPS
            row["mfu_matmul"] = row["fwd_bwd_tflops"] / meta["matmul_tflops"]
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        log(json.dumps(row))
        rows.append(row)
    text = table(meta, rows, fwd_flops)
    print(text)
    out_dir = args.out or Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "attention_speed.md").write_text(text)
    (out_dir / "attention_speed.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


def table(meta: dict[str, Any], rows: list[dict[str, Any]], fwd_flops: float) -> str:
    """The results as markdown: one row a path, the per-document path the baseline."""
    s = meta["shape"]
    base = next((r.get("fwd_bwd_ms") for r in rows if r["path"] == "per-document"), None)
    lines = [
        "# Packed causal attention, the story's micro-batch",
        "",
        f"{meta['gpu']}, torch {meta['torch']}: {s['rows']} rows x {s['tokens']} tokens, "
        f"{s['heads']} query / {s['kv_heads']} key-value heads, head_dim {s['head_dim']}; "
        f"documents {meta['doc_lens']}. "
        f"Forward {fwd_flops / 1e12:.2f} TFLOP (4 x n^2/2 x heads x head_dim a document), forward + "
        f"backward 3.5x that; bf16 matmul measured {meta['matmul_tflops']:.0f} TFLOP/s, datasheet "
        f"{DATASHEET_TFLOPS:.0f}.",
        "",
        "| path | forward ms | fwd+bwd ms | vs per-document | TFLOP/s | % of 989 | % of matmul "
        "| rel err out / dq / dk / dv |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['path']} | - | - | - | - | - | - | {r['error']} |")
            continue
        speed = f"{base / r['fwd_bwd_ms']:.2f}x" if base else "-"
        errs = " / ".join(f"{r[f'rel_{x}']:.1e}" for x in ("out", "dq", "dk", "dv"))
        lines.append(
            f"| {r['path']} | {r['fwd_ms']:.2f} | {r['fwd_bwd_ms']:.2f} | {speed} | "
            f"{r['fwd_bwd_tflops']:.0f} | {100 * r['mfu_datasheet']:.1f}% | "
            f"{100 * r['mfu_matmul']:.1f}% | {errs} |"
        )
    lines += ["", "Reproduce: `python benchmarks/attention_speed.py` on the GPU (about a minute)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
