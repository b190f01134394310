"""Profile target: one launch of each NF4 grouped GEMM at a decoding or training shape, for Nsight Compute.

Runs the interleaving kernel (`nf4_triton`, its picked config: at decoding sizes now the scale-on-
accumulator kernel, `_nf4_decode_mm_kernel`; `nf4_ncu_h200.md` profiled the fused one) and the
split-nibble kernel (`benchmarks/nf4_split_kernel.py`, its default) once each on the story's gate_up
weight (E=128, [3072, 4096], top-8) with random packed bytes, for `ncu` to read the hardware counters of. With
--train: the fused kernel forward and in the input gradient's orientation, and torch._grouped_mm on
the same weights dequantized to bf16 (the dense ceiling). On the H200 (Firecracker runtime):
  ncu --clock-control none --kernel-name regex:nf4_ --section SpeedOfLight --section WarpStateStats \\
      --section SchedulerStats --section Occupancy python benchmarks/nf4_ncu.py --tokens 64
and with `--metrics` for the pipes and stall reasons (the commands in benchmarks/results/nf4_ncu_h200.md).
`--summarize FILE...` reads such ncu outputs and writes the table of the metrics below
(benchmarks/results/nf4_ncu_h200.{md,json}). `--config bytes|words` runs the decode kernel's 16-token
tile reading the codes a byte or a word at a time instead of the picked config; `--dump DIR` writes every
compiled kernel's TTGIR, PTX and SASS there; `--loop FILE...` counts each SASS file's K loop by opcode
(benchmarks/results/nf4_sass_h200.{md,json}, from the two files in ncu/):
  python benchmarks/nf4_ncu.py --tokens 64 --config words --dump $OUT/dump            # on the GPU
  python benchmarks/nf4_ncu.py --loop benchmarks/results/ncu/decode64_bytes.sass \
      benchmarks/results/ncu/decode64_words.sass                                        # anywhere
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (ncu metric or SpeedOfLight row, the table's column)
SUMMARY = [
    ("Duration", "duration"),
    ("DRAM Throughput", "DRAM % of peak"),
    ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active", "tensor pipe %"),
    ("sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active", "ALU pipe %"),
    ("sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active", "FMA pipe %"),
    ("sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active", "LSU pipe %"),
    ("Issued Warp Per Scheduler", "issued/scheduler/cycle"),
    ("smsp__average_warps_issue_stalled_wait_per_issue_active.ratio", "stall: wait"),
    ("smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio", "stall: barrier"),
    ("smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio", "stall: long scoreboard"),
    ("Registers Per Thread", "registers/thread"),
    ("launch__registers_per_thread", "registers/thread"),
    ("Achieved Occupancy", "occupancy %"),
]
KERNEL = re.compile(r"^  (\S.*?) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\), Context")


def summarize(paths: list[Path], out: Path) -> None:
    """The SUMMARY metrics of every profiled kernel in the ncu text outputs `paths`, as md and json."""
    rows = []
    for path in paths:
        kernel = None
        for line in path.read_text(errors="replace").splitlines():
            if m := KERNEL.match(line):
                name = m.group(1)
                kernel = {"source": path.name, "kernel": name}
                rows.append(kernel)
                continue
            if kernel is None:
                continue
            for metric, column in SUMMARY:
                if line.strip().startswith(metric + " ") and column not in kernel:
                    parts = line.split()
                    unit = parts[-2] if parts[-2] in ("us", "ms") else ""
                    kernel[column] = f"{parts[-1]} {unit}".strip()
    keep = [r for r in rows if "nf4" in r["kernel"]]
    columns = list(dict.fromkeys(c for _, c in SUMMARY))
    lines = ["| source | kernel | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for r in keep:
        lines.append(
            f"| {r['source']} | {r['kernel']} | " + " | ".join(r.get(c, "-") for c in columns) + " |"
        )
    table = "\n".join(lines) + "\n"
    print(table)
    out.with_suffix(".json").write_text(json.dumps(keep, indent=1))
    head = out.with_suffix(".md")
    text = head.read_text() if head.exists() else ""
    marker = "<!-- table: python benchmarks/nf4_ncu.py --summarize -->"
    text = (text.split(marker)[0] if marker in text else text + "\n") + marker + "\n\n" + table
    head.write_text(text)


LOAD_OPS = ("LDS", "LDSM", "LDG", "LDGSTS")


def k_loop(sass: str) -> dict[str, int]:
    """Opcodes (suffixes dropped) of the innermost loop of `sass` (Triton's disassembly) that runs the
    tensor cores: one K step of the kernel's steady state."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^\s*(LBB\d+):", line))}
    loops = [
        (labels[m.group(1)], i)
        for i, line in enumerate(lines)
        if (m := re.search(r"BRA (LBB\d+)", line)) and labels.get(m.group(1), i) < i
    ]
    mma = [(a, b) for a, b in loops if any("MMA" in line for line in lines[a : b + 1])]
    if not mma:
        raise ValueError("no loop with a tensor-core instruction")
    a, b = min(mma, key=lambda ab: ab[1] - ab[0])
    ops: dict[str, int] = {}
    for line in lines[a : b + 1]:
        if "\t" in line:
            op = (
                re.sub(r"^@!?U?P\w+\s+", "", line.split("\t", 1)[1].strip())
                .split()[0]
                .split(".")[0]
                .rstrip(";")
            )
            ops[op] = ops.get(op, 0) + 1
    return ops


def loop_table(paths: list[Path], out: Path) -> None:
    """The K loop's instruction counts of each SASS file in `paths`, as md and json (`out`'s stem)."""
    rows = {path.stem: k_loop(path.read_text()) for path in paths}
    names = sorted(
        {op for ops in rows.values() for op in ops}, key=lambda op: -max(r.get(op, 0) for r in rows.values())
    )
    lines = ["| opcode | " + " | ".join(rows) + " |", "|---|" + "---|" * len(rows)]
    lines.append("| all | " + " | ".join(str(sum(ops.values())) for ops in rows.values()) + " |")
    lines.append("| loads (" + ", ".join(LOAD_OPS) + ") | " + " | ".join(
        str(sum(ops.get(op, 0) for op in LOAD_OPS)) for ops in rows.values()) + " |")  # fmt: skip
    lines += [f"| {op} | " + " | ".join(str(ops.get(op, 0)) for ops in rows.values()) + " |" for op in names]
    table = "\n".join(lines) + "\n"
    print(table)
    head = (
        "# The decode kernel's K loop in machine code (benchmarks/nf4_ncu.py --loop)\n\n"
        "Instructions a thread issues in one K step (64 values of 128 weight rows, 4 warps: 64 values\n"
        "a thread) of `_nf4_decode_mm_kernel`, H200, Triton 3.6, 64 tokens of the story's gate_up weight,\n"
        "from `python benchmarks/nf4_ncu.py --tokens 64 --config bytes|words --dump DIR` (SASS in ncu/).\n\n"
    )
    out.with_suffix(".md").write_text(head + table)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=64, help="decoding batch (rows = tokens x 8)")
    parser.add_argument(
        "--train", action="store_true", help="training shapes: fused fwd and input grad, dense"
    )
    parser.add_argument("--loop", nargs="+", type=Path, help="SASS files: tabulate their K loops")
    parser.add_argument(
        "--config", choices=("picked", "bytes", "words"), default="picked",
        help="the decode kernel's config: pick_config's, or nf4_sass_h200's two (16-token tile, 3 stages, "
        "codes read a byte or a word at a time)",
    )  # fmt: skip
    parser.add_argument("--summarize", nargs="+", type=Path, help="ncu text outputs to tabulate")
    parser.add_argument(
        "--dump", type=Path, help="write each compiled kernel's TTGIR, PTX and SASS, and the values decoded"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results/nf4_ncu_h200.md")
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize, args.out)
        return 0
    if args.loop:
        loop_table(args.loop, args.out.with_name("nf4_sass_h200"))
        return 0
    import torch

    from benchmarks import nf4_split_kernel as nf4_split
    from benchmarks.nf4_kernels import make_packed, routing
    from trainer.kernels import nf4_triton
    from trainer.nf4_pack import PackedLayout

    device = torch.device("cuda")
    layout = PackedLayout(128, 3072, 4096, torch.bfloat16)
    packed = make_packed(torch, layout, device, have_bnb=False)
    _, _, offs = routing(torch, args.tokens, 128, 8, False, device, seed=args.tokens)
    experts = torch.arange(128, device=device, dtype=torch.int32)
    x = torch.randn(args.tokens * 8, 4096, device=device, dtype=torch.bfloat16)
    config = nf4_triton.pick_config(x.shape[0], offs.shape[0])
    if args.config != "picked":
        before = replace(nf4_triton.DECODE_ACC, stages=3, prefetch=False, words=False)
        config = replace(before, words=args.config == "words")
    nf4_triton.nf4_grouped_mm(x, packed, layout, experts, offs, config=config)
    if args.train:  # the input gradient's orientation, and the dense bf16 grouped GEMM on the same shapes
        g = torch.randn(args.tokens * 8, 3072, device=device, dtype=torch.bfloat16)
        nf4_triton.nf4_grouped_mm(g, packed, layout, experts, offs, trans=True)
        w = nf4_triton.nf4_dequantize(packed, layout, experts)
        torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
        torch._grouped_mm(g, w, offs=offs)
    else:
        nf4_split.nf4_split_mm(x, packed, layout, experts, offs)
    torch.cuda.synchronize()
    if args.dump:
        dump(args.dump, args.tokens, int((offs.diff(prepend=offs[:1] * 0) > 0).sum()), layout)
    return 0


def dump(folder: Path, tokens: int, hit: int, layout: Any) -> None:
    """Every compiled NF4 kernel's TTGIR, PTX and SASS under `folder`, and meta.json: the values each
    launch decodes (the hit experts' weights), to turn ncu's instruction counts into counts a value."""
    from benchmarks import nf4_split_kernel as nf4_split
    from trainer.kernels import nf4_decode, nf4_triton

    folder.mkdir(parents=True, exist_ok=True)
    kernels = []
    for fn in (
        nf4_decode._nf4_decode_mm_kernel,
        nf4_triton._nf4_grouped_mm_kernel,
        nf4_split._nf4_split_mm_kernel,
    ):
        for cache in fn.device_caches.values():
            for i, compiled in enumerate(cache[0].values()):
                stem = f"{fn.fn.__name__}_{tokens}_{i}"
                for ext in ("ttgir", "ptx", "sass"):
                    (folder / f"{stem}.{ext}").write_text(str(compiled.asm[ext]))
                kernels.append({"kernel": fn.fn.__name__, "stem": stem, "regs": compiled.n_regs,
                                "spills": compiled.n_spills, "shared": compiled.metadata.shared})  # fmt: skip
    meta = {"tokens": tokens, "hit": hit, "values": hit * layout.out * layout.inp, "kernels": kernels}
    (folder / f"meta_{tokens}.json").write_text(json.dumps(meta, indent=1))
    print(json.dumps(meta))


if __name__ == "__main__":
    sys.exit(main())
