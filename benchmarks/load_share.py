"""Load time and peak host RSS at load: each rank loading only its share of the model
(`trainer.weights.load_share`) against every rank loading all of it (`COCKPIT_LOAD_SHARE=0`, the old path).

Each job is the cockpit's trainer started as `cockpit run` starts it (DeepSpeed's runner with the
profile's launcher options, every rank under `cockpit.service.guard`), N ranks, one optimizer step, no
evaluation. The jobs alternate between the two ways, `--repeats` times each. From each rank's record:
`load_s` (the `loaded` event: the layer-by-layer load, ZeRO-3 partitioning, LoRA), the loader's own
`load_quantize_s`, the checkpoint tensors it read, the process's RSS peak when the load ended
(`rss_peak_mib`: the kernel's exact high-water mark since the process started) and what the load added
to its RSS (`rss_mib` at `loaded` minus at the `load` phase's start), and on GPUs the CUDA peak at load.

    python benchmarks/load_share.py [--gpus N] [--profile P] [--layers L] [--repeats R] [--set K=V ...]

On the CPU (default: 2 ranks over gloo, the tiny profile and its checkpoint) about 4 minutes on 2
cores. On GPUs: `python benchmarks/load_share.py --gpus 2 --profile qwen3-235b-a22b-thinking-4xh100
--layers 4` (the story's architecture sliced to 4 layers, random weights drawn on each GPU: a
rehearsal's `--rehearse-layers`). Writes load_share_<cpu|gpu>.md and .json under $OUT (else
benchmarks/results/) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from benchmarks.trainer_runs import log_tail, new_run, run_ranks  # noqa: E402
from cockpit.record import read_events  # noqa: E402

WAYS = {"every rank loads all": "0", "each rank its share": "1"}


def run_job(args: argparse.Namespace, runs: Path, way: str, repeat: int) -> Path:
    """One job of N ranks, the load done `way`; returns its run directory."""
    from cockpit.service.spawn import rehearsal_args

    overrides = [
        f"hardware.gpus={args.ranks}",
        "eval.enabled=false",
        "training.max_steps=1",
        "training.save_steps=0",
        *args.sets,
    ]
    name = f"load-share-{WAYS[way]}-{repeat}"
    run_dir, profile = new_run(args.profile, overrides, runs, name)
    extra = rehearsal_args(args.layers, 1, 0) if args.layers else []
    code = run_ranks(run_dir, profile, extra, {"COCKPIT_LOAD_SHARE": WAYS[way]}, args.timeout)
    if code != 0:
        print(f"{name}: exit {code}: {log_tail(run_dir)}", file=sys.stderr)
    return run_dir


def rank_figures(run_dir: Path) -> list[dict[str, Any]]:
    """Per rank: what its `load` phase and `loaded` events say."""
    events = read_events(run_dir)
    out = []
    for rank in sorted({e["rank"] for e in events if e["kind"] == "loaded"}):
        start = next(e for e in events if e["kind"] == "phase" and e["phase"] == "load" and e["rank"] == rank)
        loaded = next(e for e in events if e["kind"] == "loaded" and e["rank"] == rank)
        share = loaded.get("load_share") or {}
        out.append(
            {
                "rank": rank,
                "start_t": start["t"],
                "end_t": loaded["t"],
                "load_s": loaded["load_s"],
                "load_quantize_s": loaded.get("load_quantize_s"),
                "tensors_read": loaded.get("checkpoint_tensors_read"),
                "layers_built": share.get("layers", list(range(loaded.get("layers", 0)))),
                "rss_peak_mib": loaded["rss_peak_mib"],
                "rss_added_mib": round(loaded["rss_mib"] - start["rss_mib"], 1)
                if "rss_mib" in start
                else None,
                "cuda_peak_alloc_mib": loaded.get("cuda_peak_alloc_mib"),
            }
        )
    return out


def job_figures(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One job: the slowest rank's load, the largest and the summed memory figures."""

    def most(key: str) -> Any:
        values = [r[key] for r in ranks if r.get(key) is not None]
        return max(values) if values else None

    added = [r["rss_added_mib"] for r in ranks if r.get("rss_added_mib") is not None]
    return {
        # From the moment the last rank starts loading (before that a rank may wait for another's data
        # preparation) to the moment the last rank has loaded.
        "load_wall_s": round(most("end_t") - most("start_t"), 2),
        "load_s": most("load_s"),
        "load_quantize_s": most("load_quantize_s"),
        "tensors_read": [r["tensors_read"] for r in ranks],
        "rss_peak_mib": most("rss_peak_mib"),
        "rss_peak_sum_mib": round(sum(r["rss_peak_mib"] for r in ranks), 1),
        "rss_added_sum_mib": round(sum(added), 1) if added else None,
        "cuda_peak_alloc_mib": most("cuda_peak_alloc_mib"),
    }


def median(values: list[Any]) -> Any:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 2) if values else None


def table(rows: dict[str, list[dict[str, Any]]], gpus: bool) -> str:
    def num(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    head = (
        "| load | load wall s | slowest rank's load s | quantize s | tensors read a rank | RSS peak a rank "
        "MiB | RSS peak, ranks summed MiB | RSS added by the load, ranks summed MiB |"
    )
    rule = "|---|---|---|---|---|---|---|---|"
    if gpus:
        head, rule = head + " GPU peak at load MiB |", rule + "---|"
    lines = [head, rule]
    for way, jobs in rows.items():
        reads = jobs[0]["tensors_read"]
        line = (
            f"| {way} | {num(median([j['load_wall_s'] for j in jobs]), '.2f')} | "
            f"{num(median([j['load_s'] for j in jobs]), '.2f')} | "
            f"{num(median([j['load_quantize_s'] for j in jobs]), '.2f')} | {' / '.join(map(str, reads))} | "
            f"{num(median([j['rss_peak_mib'] for j in jobs]), ',.0f')} | "
            f"{num(median([j['rss_peak_sum_mib'] for j in jobs]), ',.0f')} | "
            f"{num(median([j['rss_added_sum_mib'] for j in jobs]), ',.0f')} |"
        )
        if gpus:
            line += f" {num(median([j['cuda_peak_alloc_mib'] for j in jobs]), ',.0f')} |"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=0, help="ranks on that many GPUs (default 0: CPU ranks)")
    parser.add_argument("--cpu-ranks", type=int, default=2, help="ranks without GPUs (gloo; default 2)")
    parser.add_argument("--profile", default="tiny-cpu", help="profile name or TOML path (default tiny-cpu)")
    parser.add_argument(
        "--layers",
        type=int,
        default=0,
        help="the architecture sliced to this depth, random weights (a rehearsal)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="jobs of each way, alternating (default 3)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a job may take")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="K=V")
    args = parser.parse_args(argv)
    gpus = args.gpus > 0
    args.ranks = args.gpus if gpus else args.cpu_ranks
    rows: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
    per_rank: dict[str, list[list[dict[str, Any]]]] = {way: [] for way in WAYS}
    statuses: list[str] = []
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="load-share-") as tmp:
        for repeat in range(args.repeats):
            for way in WAYS:
                run_dir = run_job(args, Path(tmp), way, repeat)
                ranks = rank_figures(run_dir)
                if len(ranks) != args.ranks:
                    statuses.append(f"{way} #{repeat}: {len(ranks)} of {args.ranks} ranks loaded")
                    continue
                per_rank[way].append(ranks)
                rows[way].append(job_figures(ranks))
    took = time.time() - t0
    if any(not jobs for jobs in rows.values()):
        print("\n".join(statuses) or "no job loaded", file=sys.stderr)
        return 1
    text = table(rows, gpus)
    what = f"{args.profile}" + (
        f", {args.layers} layers, random weights" if args.layers else ", its checkpoint"
    )
    machine = (
        f"{args.ranks} GPU ranks (NCCL)" if gpus else f"{args.ranks} CPU ranks (gloo), {os.cpu_count()} cores"
    )
    command = "python benchmarks/load_share.py" + (f" --gpus {args.gpus}" if gpus else "")
    command += (f" --profile {args.profile}" if args.profile != "tiny-cpu" else "") + (
        f" --layers {args.layers}" if args.layers else ""
    )
    md = (
        f"# Each rank loads its share, against every rank loading all\n\n{machine}; {what}; medians of "
        f"{args.repeats} jobs each way, alternating. Load wall s: from the last rank's start of the load (a "
        "rank may wait for another's data before) to the last rank's end; load s: the slowest rank's "
        "`load_s` (layer-by-layer load, ZeRO-3 partitioning, LoRA, its wait for the others included); "
        "quantize s: the loader's own part of it; RSS peak: the process's "
        "high-water mark when the load ended (since its start: imports and data included); RSS added: what "
        f"the load added to the ranks' RSS.\n\n{text}\n\n"
        + ("\n".join(f"- {s}" for s in statuses) + "\n\n" if statuses else "")
        + f"Reproduce: `{command}` ({took:.0f} s here).\n"
    )
    print(md)
    out = Path(os.environ.get("OUT") or ROOT / "benchmarks" / "results")
    out.mkdir(parents=True, exist_ok=True)
    name = "load_share_gpu" if gpus else "load_share_cpu"
    (out / f"{name}.md").write_text(md)
    result = {"machine": machine, "model": what, "jobs": rows, "ranks": per_rank, "problems": statuses}
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    return 0 if not statuses else 1


if __name__ == "__main__":
    sys.exit(main())
