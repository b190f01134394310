"""Benchmark: the NF4 expert GEMMs of the story's MoE layer, every path, checked and timed.

Shapes: Qwen3-235B-A22B's experts, E=128, gate_up W [3072, 4096], down W [4096, 1536], top-8 routing of
1024..16384 tokens (64..1024 rows an expert), random routing with uneven counts (a random bias per
expert) and a balanced case (every expert hit, the same rows each).

Paths, per pass over both weights (gate_up then down; backward: the input gradients, down then gate_up):
  present  bitsandbytes dequantizes the hit experts ~14 at a time, one torch._grouped_mm a chunk, a host
           sync for the counts (today's `COCKPIT_NF4_EXPERTS=grouped`)
  dequant  one Triton launch dequantizes every expert, one torch._grouped_mm (`dequant`)
  fused    the Triton grouped GEMM that dequantizes NF4 in its K loop (`fused`)
  dense    torch._grouped_mm on weights dequantized beforehand: the ceiling, not a path
and the whole `NF4Experts` module (routing, gather, activation, combine) forward and forward+backward per
mode. FLOPs: 2 x rows x out x in a GEMM (rows = tokens x 8); % of peak is over the bf16 rate of an
8192^3 torch matmul measured by this script. Numerics first: every path's output, written over NaN,
against a float32 reference on fresh random inputs, rel = ||out - ref|| / ||ref||.

Run from the repository root (one command, under 3 minutes on an H200 including Triton compilation):
  python benchmarks/nf4_kernels.py             # writes $OUT/nf4_kernels.{md,json}, else benchmarks/results/
  python benchmarks/nf4_kernels.py --explore   # also sweeps the fused kernel's block configs
  python benchmarks/nf4_kernels.py --smoke     # CPU, Triton interpreter, tiny shapes: checks the script
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

STORY = {"experts": 128, "hidden": 4096, "width": 1536, "topk": 8, "tokens": [1024, 4096, 8192, 16384]}
SMOKE = {"experts": 4, "hidden": 128, "width": 64, "topk": 2, "tokens": [16, 48]}

EXPLORE = [  # (label, MMConfig kwargs over BASE_CONFIG); decode 0 gather, 1 select tree, 2 prmt
    ("tree 128x128x64 w8 s3", {"bm": 128, "bn": 128, "swap": False, "decode": 1}),
    ("prmt 256x128x64 w8 s3", {"bm": 256, "bn": 128, "swap": False}),
    ("prmt swap 128x256x64 w8 s3 (small)", {"bm": 128, "bn": 256}),
    ("prmt swap 256x128x64 w8 s3 (large)", {}),
    ("prmt swap 256x128x64 w8 s4", {"stages": 4}),
    ("prmt swap 128x128x64 w4 s3 2/SM", {"bm": 128, "warps": 4, "programs_per_sm": 2}),
]
BASE_CONFIG = {"bm": 256, "bn": 128, "bk": 64, "warps": 8, "stages": 3, "swap": True, "decode": 2}
EXPLORE_DEQUANT = [  # DequantConfig kwargs
    {"block": 1024, "warps": 4, "decode": 0},
    {"block": 2048, "warps": 4, "decode": 0},
    {"block": 2048, "warps": 4, "decode": 2},
]


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.perf_counter()
        self.rows: list[dict[str, Any]] = []
        self.checks: list[dict[str, Any]] = []
        self.explore: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.meta: dict[str, Any] = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def out_of_time(self) -> bool:
        return self.elapsed() > self.args.budget_s


def log(msg: str) -> None:
    print(f"[nf4] {msg}", flush=True)


def guarded(bench: Bench, what: str, fn: Callable[[], Any]) -> Any:
    """Run fn; on any exception print it, note it and return None (the benchmark goes on)."""
    try:
        return fn()
    except Exception as exc:  # a failing variant must not stop the others
        msg = f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        log("FAILED " + msg)
        traceback.print_exc(limit=4)
        bench.notes.append("failed: " + msg[:400])
        return None


# --- setup ------------------------------------------------------------------------------------------


def make_packed(torch: Any, layout: Any, device: Any, have_bnb: bool) -> dict[str, Any]:
    """Random N(0, 0.02) weights packed with the trainer's own quantizer (bitsandbytes), or random bytes."""
    if have_bnb:
        from trainer.nf4_pack import quantize_experts_nf4

        gen = torch.Generator(device=device).manual_seed(layout.out)

        def expert(e: int) -> Any:
            return (
                torch.randn(layout.out, layout.inp, device=device, generator=gen, dtype=torch.bfloat16) * 0.02
            )

        return quantize_experts_nf4(expert, layout, device, chunk=16)
    shapes = layout.shapes()
    codes = torch.randint(0, 256, (layout.experts, layout.numel // 2), dtype=torch.uint8, device=device)
    qscale = torch.randint(0, 256, (layout.experts, layout.blocks), dtype=torch.uint8, device=device)
    qstate = torch.rand(layout.experts, layout.blocks // layout.nested + 1, device=device) * 0.02 + 0.01
    packed = {"nf4": codes, "absmax": qscale, "qstate": qstate}
    return {k: v.view(layout.storage_dtype).view(shapes[k]) for k, v in packed.items()}


def routing(torch: Any, tokens: int, experts: int, topk: int, balanced: bool, device: Any, seed: int):
    """(perm, offs [E] int32): token-expert pairs sorted by expert, as NF4Experts sorts them."""
    gen = torch.Generator(device=device).manual_seed(seed)
    if balanced:
        index = (torch.arange(tokens * topk, device=device) % experts).view(tokens, topk)
    else:
        bias = torch.randn(experts, device=device, generator=gen) * 0.35
        logits = torch.randn(tokens, experts, device=device, generator=gen) + bias
        index = logits.topk(topk, dim=-1).indices
    expert_sorted, perm = torch.sort(index.reshape(-1), stable=True)
    ids = torch.arange(experts, device=device, dtype=torch.int32)
    offs = torch.searchsorted(expert_sorted, ids + 1, out_int32=True)
    return index, perm, offs


def timer(torch: Any, device: Any) -> Callable[[Callable[[], Any]], float]:
    """Median milliseconds of fn: triton.testing.do_bench (CUDA events, L2 flushed) on a GPU."""
    if device.type == "cuda":
        import triton.testing

        def cuda_ms(fn: Callable[[], Any]) -> float:
            return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))

        return cuda_ms

    def cpu_ms(fn: Callable[[], Any]) -> float:
        fn()
        times = []
        for _ in range(2):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return 1e3 * statistics.median(times)

    return cpu_ms


def matmul_peak(torch: Any, device: Any, ms: Callable[[Callable[[], Any]], float]) -> float:
    """TFLOP/s of an 8192^3 bf16 torch matmul timed by `ms` (1.0 off a GPU)."""
    if device.type != "cuda":
        return 1.0
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    return 2 * 8192**3 / ms(lambda: a @ b) / 1e9


def packed_module(
    torch: Any, packed: dict[str, Any], experts: int, hidden: int, width: int, dtype: Any
) -> Any:
    """An `NF4Experts` module (SiLU) holding the packed weights `packed` as frozen parameters."""
    from trainer.layers.experts4bit import NF4Experts

    module = NF4Experts(experts, hidden, width, torch.nn.SiLU(), dtype, torch.bfloat16, device="meta")
    for name, parts in packed.items():
        for suffix, tensor in parts.items():
            setattr(module, f"{name}_{suffix}", torch.nn.Parameter(tensor, requires_grad=False))
    return module


# --- the paths ----------------------------------------------------------------------------------------


class Paths:
    """Callables for one routing: fwd (gate_up then down) and bwd (input gradients) of every path."""

    def __init__(self, torch: Any, ctx: dict[str, Any], offs: Any, dtype: Any) -> None:
        from trainer.kernels import nf4_triton

        self.torch, self.ctx, self.offs, self.dtype = torch, ctx, offs, dtype
        self.k = nf4_triton
        self.experts = torch.arange(ctx["E"], device=offs.device, dtype=torch.int32)
        self.offs_list: list[int] | None = None

    def fused(self, which: str, x: Any, trans: bool, config: Any = None, out: Any = None) -> Any:
        c = self.ctx
        return self.k.nf4_grouped_mm(
            x, c["packed"][which], c["layouts"][which], self.experts, self.offs, trans, config, out
        )

    def dequant(self, which: str, x: Any, trans: bool) -> Any:
        c = self.ctx
        w = self.k.nf4_dequantize(c["packed"][which], c["layouts"][which], self.experts, self.dtype)
        return self.torch._grouped_mm(x, w if trans else w.transpose(-2, -1), offs=self.offs)

    def dense(self, which: str, x: Any, trans: bool) -> Any:
        w = self.ctx["dense"][which]
        return self.torch._grouped_mm(x, w if trans else w.transpose(-2, -1), offs=self.offs)

    def present(self, which: str, x: Any, trans: bool) -> Any:
        """NF4Experts._forward_grouped's weight handling: counts to the host, bitsandbytes per chunk."""
        from trainer.nf4_pack import dequantize_experts_nf4

        torch, c = self.torch, self.ctx
        ends = self.offs.tolist()  # the host sync the present path has (bincount().tolist())
        starts = [0, *ends[:-1]]
        counts = [b - a for a, b in zip(starts, ends, strict=True)]
        hit = [e for e in range(c["E"]) if counts[e]]
        outs = []
        for c0 in range(0, len(hit), c["chunk"]):
            experts = hit[c0 : c0 + c["chunk"]]
            r0, r1 = starts[experts[0]], ends[experts[-1]]
            offs = torch.tensor([counts[e] for e in experts], device=x.device, dtype=torch.int32).cumsum(
                0, dtype=torch.int32
            )
            w = dequantize_experts_nf4(c["packed"][which], c["layouts"][which], experts, self.dtype)
            outs.append(torch._grouped_mm(x[r0:r1], w if trans else w.transpose(-2, -1), offs=offs))
        return torch.cat(outs)


# --- numerics -----------------------------------------------------------------------------------------


def reference(torch: Any, ctx: dict[str, Any], which: str, x: Any, offs: Any, trans: bool) -> Any:
    """float32 per group, weights from the pure-torch dequantization (equal to bitsandbytes')."""
    from trainer.kernels.nf4_ref import nf4_dequantize_ref

    layout = ctx["layouts"][which]
    out = torch.zeros(x.shape[0], layout.inp if trans else layout.out, device=x.device)
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end > start:
            w = nf4_dequantize_ref(ctx["packed"][which], layout, e, torch.float32)
            out[start:end] = x[start:end].float() @ (w if trans else w.t())
        start = end
    return out


def check(bench: Bench, torch: Any, ctx: dict[str, Any], label: str, tokens: int, balanced: bool) -> None:
    """Every path, both weights, forward and input gradient, against the float32 reference."""
    dev, dtype, topk = ctx["device"], ctx["dtype"], ctx["topk"]
    _, _, offs = routing(torch, tokens, ctx["E"], topk, balanced, dev, seed=tokens + 7)
    paths = Paths(torch, ctx, offs, dtype)
    tail = 37 if not bench.args.smoke else 5  # rows routed to no expert: must come out zero (fused)
    for which in ("gate_up_proj", "down_proj"):
        layout = ctx["layouts"][which]
        for trans in (False, True):
            k_dim = layout.out if trans else layout.inp
            n_dim = layout.inp if trans else layout.out
            m = tokens * topk
            x = torch.randn(m + tail, k_dim, device=dev, dtype=dtype)
            ref = reference(torch, ctx, which, x, offs, trans)
            variants: dict[str, Callable[[], Any]] = {}

            def fused(x: Any = x, which: str = which, trans: bool = trans, n: int = n_dim) -> Any:
                out = torch.full((x.shape[0], n), float("nan"), device=dev, dtype=dtype)
                return paths.fused(which, x, trans, out=out)

            variants["fused"] = fused
            xm = x[:m]
            variants["dequant"] = lambda x=xm, which=which, trans=trans: paths.dequant(which, x, trans)
            if ctx["have_bnb"]:
                variants["present"] = lambda x=xm, which=which, trans=trans: paths.present(which, x, trans)
            if ctx.get("dense"):
                variants["dense"] = lambda x=xm, which=which, trans=trans: paths.dense(which, x, trans)
            for name, fn in variants.items():
                result = guarded(bench, f"check {name} {which} trans={trans}", fn)
                row = {"case": label, "path": name, "weight": which, "grad": trans}
                if result is None:
                    bench.checks.append({**row, "rel": None, "ok": False})
                    continue
                got = result[:m].float()
                rel = float((got - ref[:m]).norm() / ref[:m].norm())
                finite = bool(torch.isfinite(result).all())
                tail_zero = bool((result[m:] == 0).all()) if result.shape[0] > m else True
                ok = finite and tail_zero and rel < 1e-2
                bench.checks.append({**row, "rel": rel, "finite": finite, "tail_zero": tail_zero, "ok": ok})
                log(f"check {label:>18} {name:>8} {which:>12} {'grad' if trans else 'fwd ':>4} rel {rel:.2e} "
                    f"{'ok' if ok else 'FAIL'}{'' if finite else ' (NaN/Inf: unwritten or broken)'}"
                    f"{'' if tail_zero else ' (tail not zero)'}")  # fmt: skip


# --- timing ---------------------------------------------------------------------------------------------


def gemm_flops(ctx: dict[str, Any], rows: int) -> float:
    """FLOPs of one pass over both weights (gate_up and down) for `rows` token-expert pairs."""
    return sum(2.0 * rows * layout.out * layout.inp for layout in ctx["layouts"].values())


def time_paths(bench: Bench, torch: Any, ctx: dict[str, Any], tokens: int, balanced: bool) -> None:
    dev, dtype, topk = ctx["device"], ctx["dtype"], ctx["topk"]
    _, _, offs = routing(torch, tokens, ctx["E"], topk, balanced, dev, seed=tokens)
    paths = Paths(torch, ctx, offs, dtype)
    m = tokens * topk
    gu, dn = ctx["layouts"]["gate_up_proj"], ctx["layouts"]["down_proj"]
    x = torch.randn(m, gu.inp, device=dev, dtype=dtype)
    h = torch.randn(m, dn.inp, device=dev, dtype=dtype)
    gy = torch.randn(m, dn.out, device=dev, dtype=dtype)
    gh = torch.randn(m, gu.out, device=dev, dtype=dtype)
    counts = torch.diff(offs, prepend=offs.new_zeros(1))
    label = f"{tokens} tok{' balanced' if balanced else ''}"
    meta = {
        "case": label,
        "tokens": tokens,
        "rows_per_expert": m / ctx["E"],
        "experts_hit": int((counts > 0).sum()),
        "max_rows": int(counts.max()),
        "min_rows": int(counts.min()),
    }
    flops = gemm_flops(ctx, m)
    ms = ctx["timer"]
    names = ["present", "dequant", "fused", "dense"]
    for name in names:
        if bench.out_of_time():
            bench.rows.append({**meta, "path": name, "status": "skipped (budget)"})
            continue
        if name == "present" and not ctx["have_bnb"]:
            bench.rows.append({**meta, "path": name, "status": "skipped (no bitsandbytes)"})
            continue
        if name == "dense" and not ctx.get("dense"):
            bench.rows.append({**meta, "path": name, "status": "skipped (no dense weights)"})
            continue
        fn = getattr(paths, name)

        def fwd(fn: Callable[..., Any] = fn) -> None:
            fn("gate_up_proj", x, False)
            fn("down_proj", h, False)

        def bwd(fn: Callable[..., Any] = fn) -> None:
            fn("down_proj", gy, True)
            fn("gate_up_proj", gh, True)

        row: dict[str, Any] = {**meta, "path": name, "status": "ok"}
        for direction, call in (("fwd", fwd), ("bwd", bwd)):
            t = guarded(bench, f"time {name} {direction} {label}", lambda call=call: ms(call))
            if t is None:
                row["status"] = "failed"
                continue
            row[f"{direction}_ms"] = t
            row[f"{direction}_tflops"] = flops / t / 1e9
            row[f"{direction}_pct"] = 100 * flops / t / 1e9 / ctx["peak_tflops"]
        bench.rows.append(row)
        log(f"{label:>20} {name:>8}: fwd {fmt(row.get('fwd_ms'), 3)} ms "
            f"{fmt(row.get('fwd_tflops'), 0)} TFLOP/s | bwd {fmt(row.get('bwd_ms'), 3)} ms "
            f"{fmt(row.get('bwd_tflops'), 0)} TFLOP/s")  # fmt: skip


def time_module(bench: Bench, torch: Any, ctx: dict[str, Any], tokens: int) -> None:
    """The whole NF4Experts module per mode: forward, and forward + backward (input gradient)."""
    from trainer.layers.experts4bit import NF4Experts

    module = ctx.get("module")
    if module is None:
        return
    dev, dtype = ctx["device"], ctx["dtype"]
    index, _, _ = routing(torch, tokens, ctx["E"], ctx["topk"], False, dev, seed=tokens + 1)
    weights = torch.rand(index.shape, device=dev, dtype=dtype)
    x = torch.randn(tokens, ctx["H"], device=dev, dtype=dtype, requires_grad=True)
    flops = gemm_flops(ctx, tokens * ctx["topk"])
    old = os.environ.get("COCKPIT_NF4_EXPERTS")
    for mode in ("grouped", "dequant", "fused"):
        if bench.out_of_time():
            bench.rows.append(
                {"case": f"{tokens} tok", "path": f"module {mode}", "status": "skipped (budget)"}
            )
            continue
        if mode == "grouped" and not ctx["have_bnb"]:
            continue
        os.environ["COCKPIT_NF4_EXPERTS"] = mode
        NF4Experts.kernels_failed = False

        def forward() -> None:
            with torch.no_grad():
                module(x, index, weights)

        def train() -> None:
            module(x, index, weights).sum().backward()

        row: dict[str, Any] = {
            "case": f"{tokens} tok",
            "tokens": tokens,
            "path": f"module {mode}",
            "status": "ok",
        }
        for direction, call, f in (("fwd", forward, flops), ("bwd", train, 2 * flops)):
            t = guarded(bench, f"module {mode} {direction} {tokens}", lambda call=call: ctx["timer"](call))
            if t is None or NF4Experts.kernels_failed:
                row["status"] = "failed" if t is None else "fell back to bitsandbytes"
                continue
            row[f"{direction}_ms"] = t
            row[f"{direction}_tflops"] = f / t / 1e9
            row[f"{direction}_pct"] = 100 * f / t / 1e9 / ctx["peak_tflops"]
        bench.rows.append(row)
        log(f"{tokens:>6} tok module {mode:>8}: fwd {fmt(row.get('fwd_ms'), 3)} ms, fwd+bwd "
            f"{fmt(row.get('bwd_ms'), 3)} ms ({fmt(row.get('bwd_tflops'), 0)} TFLOP/s)")  # fmt: skip
    if old is None:
        os.environ.pop("COCKPIT_NF4_EXPERTS", None)
    else:
        os.environ["COCKPIT_NF4_EXPERTS"] = old


def explore(bench: Bench, torch: Any, ctx: dict[str, Any], tokens: int) -> None:
    """The fused kernel's block configs, each GEMM alone, at one routing."""
    from trainer.kernels.nf4_triton import MMConfig

    dev, dtype = ctx["device"], ctx["dtype"]
    _, _, offs = routing(torch, tokens, ctx["E"], ctx["topk"], False, dev, seed=tokens)
    paths = Paths(torch, ctx, offs, dtype)
    m = tokens * ctx["topk"]
    gemms = []
    for which in ("gate_up_proj", "down_proj"):
        layout = ctx["layouts"][which]
        for trans in (False, True):
            x = torch.randn(m, layout.out if trans else layout.inp, device=dev, dtype=dtype)
            gemms.append((which, trans, x, 2.0 * m * layout.out * layout.inp))
    refs = {(w, t): paths.dense(w, x, t) for w, t, x, _ in gemms} if ctx.get("dense") else {}
    for label, kwargs in EXPLORE:
        if bench.out_of_time():
            bench.explore.append({"config": f"{label} @{tokens} tok", "status": "skipped (budget)"})
            continue
        config = MMConfig(**{**BASE_CONFIG, **kwargs})
        row: dict[str, Any] = {"config": f"{label} @{tokens} tok", "status": "ok"}
        t_compile = time.perf_counter()
        for which, trans, x, flops in gemms:
            key = f"{'gu' if which == 'gate_up_proj' else 'dn'}{'_grad' if trans else ''}"

            def run(which: str = which, x: Any = x, trans: bool = trans, config: Any = config) -> Any:
                return paths.fused(which, x, trans, config)

            y = guarded(bench, f"explore {label} {key}", run)
            if y is None:
                row["status"] = "failed"
                continue
            if refs:
                ref = refs[(which, trans)].float()
                rel = float((y.float() - ref).norm() / ref.norm())
                row[f"{key}_rel"] = rel
                if not rel < 1e-2 and not row["status"].startswith("WRONG"):  # NaN too
                    row["status"] = f"WRONG ({key} rel {rel:.1e})"
            t = guarded(bench, f"explore time {label} {key}", lambda run=run: ctx["timer"](run))
            if t is not None:
                row[f"{key}_ms"] = t
                row[f"{key}_tflops"] = flops / t / 1e9
        row["wall_s"] = time.perf_counter() - t_compile
        bench.explore.append(row)
        log(f"explore {row['config']:>36}: " + " ".join(
            f"{k}={row.get(k + '_tflops', float('nan')):.0f}" for k in ("gu", "gu_grad", "dn", "dn_grad")
        ) + f" TFLOP/s ({row['wall_s']:.1f} s)")  # fmt: skip


def explore_dequant(bench: Bench, torch: Any, ctx: dict[str, Any]) -> None:
    """The one-launch dequantization of all experts of both weights: time, bandwidth, error."""
    from trainer.kernels.nf4_triton import DequantConfig, nf4_dequantize

    experts = torch.arange(ctx["E"], device=ctx["device"], dtype=torch.int32)
    moved = sum(lay.nbytes + 2 * lay.experts * lay.numel for lay in ctx["layouts"].values())
    for kwargs in EXPLORE_DEQUANT:
        if bench.out_of_time():
            break
        label = "dequant " + " ".join(f"{k}={v}" for k, v in kwargs.items())
        cfg = DequantConfig(**kwargs)

        def run(cfg: Any = cfg) -> list[Any]:
            return [
                nf4_dequantize(ctx["packed"][k], ctx["layouts"][k], experts, ctx["dtype"], cfg)
                for k in ctx["layouts"]
            ]

        got = guarded(bench, label, run)
        if got is None:
            bench.explore.append({"config": label, "status": "failed"})
            continue
        rel = max(
            float((w.float() - ctx["dense"][k].float()).norm() / ctx["dense"][k].float().norm())
            for w, k in zip(got, ctx["layouts"], strict=True)
        )
        del got
        t = guarded(bench, label + " time", lambda run=run: ctx["timer"](run))
        row = {"config": label, "status": "ok", "dequant_ms": t, "dequant_rel": rel}
        if t is not None:
            row["dequant_gbs"] = moved / t / 1e6
        bench.explore.append(row)
        log(f"{label}: {fmt(t, 3)} ms, {fmt(row.get('dequant_gbs'), 0)} GB/s, rel {rel:.1e}")


# --- report -------------------------------------------------------------------------------------------


def fmt(x: Any, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) else "-"


def report(bench: Bench) -> str:
    m = bench.meta
    lines = [
        "# NF4 expert kernels (benchmarks/nf4_kernels.py)",
        "",
        f"{m.get('gpu', '?')}; torch {m.get('torch')}, triton {m.get('triton')}, bitsandbytes "
        f"{m.get('bitsandbytes')}; bf16 peak measured {fmt(m.get('peak_tflops'), 0)} TFLOP/s "
        "(8192^3 torch matmul, median).",
        f"Geometry: E={m.get('E')}, gate_up [{m.get('gate_up')}], down [{m.get('down')}], "
        f"top-{m.get('topk')}. FLOPs a pass = 2 x rows x (gate_up out x in + down out x in), rows = tokens x "
        "top-k; fwd = gate_up + down, bwd = their input gradients (module rows: bwd = forward + backward, "
        "2 passes). Times: medians, CUDA events, L2 flushed.",
        "",
        "| case | rows/expert | hit | min-max rows | path | fwd ms | fwd TFLOP/s | fwd % peak "
        "| bwd ms | bwd TFLOP/s | bwd % peak | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in bench.rows:
        lines.append(
            "| "
            + " | ".join(
                [
                    r.get("case", "-"),
                    fmt(r.get("rows_per_expert"), 0),
                    str(r.get("experts_hit", "-")),
                    f"{r['min_rows']}-{r['max_rows']}" if "max_rows" in r else "-",
                    r["path"],
                    fmt(r.get("fwd_ms"), 3),
                    fmt(r.get("fwd_tflops"), 0),
                    fmt(r.get("fwd_pct"), 1),
                    fmt(r.get("bwd_ms"), 3),
                    fmt(r.get("bwd_tflops"), 0),
                    fmt(r.get("bwd_pct"), 1),
                    r.get("status", "-"),
                ]
            )
            + " |"
        )
    if bench.checks:
        bad = [c for c in bench.checks if not c["ok"]]
        worst = max((c["rel"] for c in bench.checks if c.get("rel") is not None), default=float("nan"))
        lines += ["", f"Numerics: {len(bench.checks) - len(bad)}/{len(bench.checks)} checks pass "
                      f"(rel < 1e-2, all finite, tail rows zero); worst rel {worst:.2e}."]  # fmt: skip
        lines += ["", "| case | path | weight | grad | rel | ok |", "|---|---|---|---|---|---|"]
        for c in bench.checks:
            lines.append(f"| {c['case']} | {c['path']} | {c['weight']} | {c['grad']} | "
                         f"{fmt(c.get('rel'), 6) if c.get('rel') is None else format(c['rel'], '.2e')} | "
                         f"{'ok' if c['ok'] else 'FAIL'} |")  # fmt: skip
    if bench.explore:
        lines += ["", "Fused kernel configs (TFLOP/s a GEMM; gu: gate_up, dn: down, _grad: input gradient):",
                  "", "| config | gu | gu_grad | dn | dn_grad | max rel vs dense | wall s | status |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in bench.explore:
            if r["config"].startswith("dequant"):
                lines.append(
                    f"| {r['config']} | {fmt(r.get('dequant_ms'), 3)} ms | "
                    f"{fmt(r.get('dequant_gbs'), 0)} GB/s | | | "
                    f"{format(r['dequant_rel'], '.1e') if 'dequant_rel' in r else '-'} | | {r['status']} |"
                )
                continue
            rels = [r[k] for k in r if k.endswith("_rel")]
            lines.append(
                f"| {r['config']} | "
                + " | ".join(fmt(r.get(f"{k}_tflops"), 0) for k in ("gu", "gu_grad", "dn", "dn_grad"))
                + f" | {format(max(rels), '.1e') if rels else '-'} | {fmt(r.get('wall_s'), 1)}"
                + f" | {r['status']} |"
            )
    if bench.notes:
        lines += ["", "Notes:", *[f"- {n}" for n in bench.notes]]
    lines += ["", f"Total wall time {bench.elapsed():.0f} s."]
    return "\n".join(lines)


def write(bench: Bench) -> None:
    md = report(bench)
    print(md, flush=True)
    out = os.environ.get("OUT")
    target = Path(out) if out else REPO / "benchmarks" / "results"
    name = "nf4_kernels_smoke" if bench.args.smoke else "nf4_kernels"
    try:
        target.mkdir(parents=True, exist_ok=True)
        (target / f"{name}.md").write_text(md + "\n")
        payload = {"meta": bench.meta, "rows": bench.rows, "checks": bench.checks, "explore": bench.explore,
                   "notes": bench.notes}  # fmt: skip
        (target / f"{name}.json").write_text(json.dumps(payload, indent=1, default=str))
        log(f"wrote {target / name}.md and .json")
    except OSError as exc:
        log(f"could not write results: {exc}")


# --- main -----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter, tiny shapes")
    parser.add_argument("--explore", action="store_true", help="sweep the fused kernel's block configs too")
    parser.add_argument("--tokens", help="comma-separated token counts (default 1024,4096,8192,16384)")
    parser.add_argument("--budget-s", type=float, default=150, help="start no new measurement after this")
    parser.add_argument("--hard-limit-s", type=float, default=175, help="print what is done and exit then")
    parser.add_argument("--no-module", action="store_true", help="skip the NF4Experts module rows")
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton kernels are defined
    bench = Bench(args)

    def watchdog() -> None:
        time.sleep(args.hard_limit_s)
        log(f"hard limit {args.hard_limit_s:.0f} s reached: reporting what is done and exiting")
        bench.notes.append(f"stopped by the hard limit at {args.hard_limit_s:.0f} s")
        write(bench)
        os._exit(3)

    threading.Thread(target=watchdog, daemon=True).start()

    import torch

    geometry = SMOKE if args.smoke else STORY
    if not args.smoke and not torch.cuda.is_available():
        log("no CUDA device: run with --smoke for the CPU check of this script")
        return 2
    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    try:
        import bitsandbytes

        have_bnb, bnb_version = True, getattr(bitsandbytes, "__version__", "version unknown")
    except Exception as exc:
        have_bnb, bnb_version = False, f"not importable ({type(exc).__name__})"
        bench.notes.append("bitsandbytes not importable: random packed bytes, no 'present' rows")
    import triton

    from cockpit.contract import dequant_chunk_experts
    from trainer.nf4_pack import PackedLayout

    e, h, w, topk = geometry["experts"], geometry["hidden"], geometry["width"], geometry["topk"]
    layouts = {
        "gate_up_proj": PackedLayout(e, 2 * w, h, torch.bfloat16),
        "down_proj": PackedLayout(e, h, w, torch.bfloat16),
    }
    bench.meta.update(
        {
            "gpu": torch.cuda.get_device_name() if device.type == "cuda" else f"CPU ({platform.processor()})",
            "torch": torch.__version__,
            "triton": triton.__version__,
            "bitsandbytes": bnb_version,
            "python": platform.python_version(),
            "E": e,
            "gate_up": f"{2 * w}, {h}",
            "down": f"{h}, {w}",
            "topk": topk,
        }
    )
    log(f"{bench.meta['gpu']}, torch {torch.__version__}, triton {triton.__version__}, bnb {bnb_version}")
    ms = timer(torch, device)
    peak = matmul_peak(torch, device, ms)
    bench.meta["peak_tflops"] = peak
    log(f"bf16 matmul 8192^3: {peak:.0f} TFLOP/s")
    t = time.perf_counter()
    packed = {k: make_packed(torch, layout, device, have_bnb) for k, layout in layouts.items()}
    log(f"packed both weights in {time.perf_counter() - t:.1f} s")
    ctx: dict[str, Any] = {
        "device": device,
        "dtype": dtype,
        "E": e,
        "H": h,
        "topk": topk,
        "layouts": layouts,
        "packed": packed,
        "have_bnb": have_bnb,
        "timer": ms,
        "peak_tflops": peak,
        "chunk": dequant_chunk_experts(e, sum(layout.numel for layout in layouts.values())),
    }
    from trainer.kernels.nf4_ref import nf4_dequantize_ref

    ctx["dense"] = {k: nf4_dequantize_ref(packed[k], layouts[k], list(range(e)), dtype) for k in layouts}
    ctx["module"] = None if args.no_module else packed_module(torch, packed, e, h, w, dtype)

    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else geometry["tokens"]
    mid = tokens[1] if len(tokens) > 1 else tokens[0]
    # 1. numerics (compiles every kernel on the way)
    guarded(bench, "check random", lambda: check(bench, torch, ctx, f"{tokens[0]} tok", tokens[0], False))
    guarded(bench, "check balanced", lambda: check(bench, torch, ctx, f"{mid} tok balanced", mid, True))
    # 2. GEMM timing per path
    for n in tokens:
        guarded(bench, f"time {n}", lambda n=n: time_paths(bench, torch, ctx, n, False))
    guarded(bench, "time balanced", lambda: time_paths(bench, torch, ctx, mid, True))
    # 3. the module per mode
    for n in tokens[1:3] if len(tokens) > 2 else tokens:
        guarded(bench, f"module {n}", lambda n=n: time_module(bench, torch, ctx, n))
    # 4. block configs
    if args.explore:
        for n in sorted({tokens[0], mid}):
            guarded(bench, f"explore {n}", lambda n=n: explore(bench, torch, ctx, n))
        guarded(bench, "explore dequant", lambda: explore_dequant(bench, torch, ctx))
    write(bench)
    failed = [c for c in bench.checks if not c["ok"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
