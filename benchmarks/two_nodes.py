"""Two nodes simulated on one machine, against the same ranks on one node.

Two launches without ssh (`launcher.no_ssh`): `cockpit run` starts node 0, `cockpit join RUN --node-rank 1`
starts node 1, each node `--gpus-per-node` ranks (on the CPU: one rank a node, gloo). On a GPU machine
node 0 takes GPUs 0..G-1 and node 1 GPUs G..2G-1 (the hostfile's `include`). The same job on one node
(one launcher, 2G ranks) is the baseline. From each record: every rank's node, load time, peak memory
(GPU allocated when there is one, else RSS), median step time, the job's tokens/s, and the wall clock
from launch to the ranks' end.

    python benchmarks/two_nodes.py [--gpus-per-node G] [--steps N] [--profile P] [--set K=V ...]

On the 2-core CPU machine (tiny profile, 6 steps): about 2 minutes. On a GPU machine with two GPUs:
`python benchmarks/two_nodes.py --gpus-per-node 1`. Writes two_nodes_<cpu|gpu>.md and .json under $OUT
(else benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from cockpit.record import read_events  # noqa: E402
from cockpit.record.view import RunView  # noqa: E402
from devtools.faults import env_for, start_detached, wait_end  # noqa: E402


def launch_one_node(runs: Path, cache: Path, args: argparse.Namespace, ranks: int) -> Path:
    """The baseline: every rank on one node, one launcher."""
    more = ["--profile", args.profile, "--set", f"hardware.gpus={ranks}", *args.sets]
    return start_detached(runs, cache, args.steps, *more)


def launch_two_nodes(runs: Path, cache: Path, args: argparse.Namespace, gpus: bool) -> Path:
    """Node 0 by `cockpit run`, node 1 by `cockpit join`, over one run directory."""
    g = args.gpus_per_node
    runs.mkdir(parents=True, exist_ok=True)
    hostfile = runs / "hosts"
    slots = 2 * g if gpus else 1
    hostfile.write_text(f"node-a slots={slots}\nnode-b slots={slots}\n")
    more = [
        "--profile", args.profile,
        "--set", "hardware.nodes=2",
        "--set", f"hardware.gpus={g if gpus else 0}",
        "--set", f"launcher.hostfile={hostfile}",
        "--set", "launcher.no_ssh=true",
        "--set", "launcher.master_addr=127.0.0.1",
        *args.sets,
    ]  # fmt: skip
    if gpus:  # node 1 on the second half of this machine's GPUs
        first = ",".join(map(str, range(g)))
        second = ",".join(map(str, range(g, 2 * g)))
        more += ["--set", f"launcher.include=node-a:{first}@node-b:{second}"]
    run_dir = start_detached(runs, cache, args.steps, *more)
    joined = subprocess.run(
        [sys.executable, "-m", "cockpit", "join", str(run_dir), "--node-rank", "1", "--wait"],
        env=env_for(cache),
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if joined.returncode != 0:
        print(joined.stdout + joined.stderr, file=sys.stderr)
    return run_dir


def figures(run_dir: Path) -> dict[str, Any]:
    """Per rank and for the job, from the record."""
    events = read_events(run_dir)
    view = RunView()
    view.apply(events)
    launch = next(e["t"] for e in events if e["kind"] == "launch" and e.get("stage") == "train")
    ended = next((e["t"] for e in events if e["kind"] == "launch_end"), None)
    ranks = []
    for rank in sorted(view.ranks):
        mine = [e for e in events if e.get("rank") == rank]
        steps = [e for e in mine if e["kind"] == "step"]
        loaded = next((e for e in mine if e["kind"] == "loaded"), {})
        load_peak = next((e for e in mine if e["kind"] == "load_peak"), {})
        key = "cuda_peak_alloc_mib" if "cuda_peak_alloc_mib" in load_peak else "rss_peak_mib"
        peaks = [e.get(key) for e in [load_peak, *steps] if e.get(key) is not None]
        times = [e["step_time_s"] for e in steps[1:] if e.get("step_time_s")]  # the first warms up
        ranks.append(
            {
                "rank": rank,
                "where": view.rank_label(rank),
                "node": view.ranks[rank].get("node_rank"),
                "load_s": loaded.get("load_s"),
                "peak_mib": max(peaks) if peaks else None,
                "peak_kind": "GPU" if key.startswith("cuda") else "RSS",
                "median_step_s": statistics.median(times) if times else None,
                "steps": len(steps),
            }
        )
    tps = [s.tokens_per_s for s in view.steps[1:] if s.tokens_per_s]
    manifest = json.loads((run_dir / "run.json").read_text())
    return {
        "run": run_dir.name,
        "status": manifest.get("status"),
        "diagnosis": manifest.get("diagnosis"),
        "tokens_per_s": statistics.median(tps) if tps else None,
        "wall_s": round(ended - launch, 1) if ended else None,
        "ranks": ranks,
    }


def table(rows: dict[str, dict[str, Any]]) -> str:
    def num(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    lines = [
        "| job | rank | node | where | load s | peak MiB | median step s | tokens/s (job) | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for job, f in rows.items():
        for r in f["ranks"]:
            lines.append(
                f"| {job} | {r['rank']} | {num(r['node'], 'd')} | {r['where']} | {num(r['load_s'], '.1f')} | "
                f"{num(r['peak_mib'], ',.0f')} {r['peak_kind']} | {num(r['median_step_s'], '.3f')} | "
                f"{num(f['tokens_per_s'], ',.0f')} | {num(f['wall_s'], '.1f')} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--gpus-per-node", type=int, default=1, help="GPUs a node (GPU machines; CPU: 1 rank)"
    )
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps of each job")
    parser.add_argument("--profile", default="tiny-cpu")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="K=V")
    args = parser.parse_args(argv)
    from cockpit.hostinfo import gpu_inventory

    gpus = len(gpu_inventory())
    use_gpus = gpus >= 2 * args.gpus_per_node
    args.sets = [
        a for kv in ["eval.enabled=false", "training.save_steps=0", *args.sets] for a in ("--set", kv)
    ]
    cache = Path(os.environ.get("COCKPIT_CACHE") or Path.home() / ".cache" / "cockpit")
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="two-nodes-") as tmp:
        runs = Path(tmp)
        t0 = time.time()
        one = launch_one_node(runs / "one", cache, args, 2 * args.gpus_per_node)
        wait_end(one)
        rows["one node"] = figures(one)
        two = launch_two_nodes(runs / "two", cache, args, use_gpus)
        wait_end(two)
        rows["two nodes"] = figures(two)
        took = time.time() - t0
    text = table(rows)
    machine = f"{gpus} GPU(s), {2 * args.gpus_per_node} used" if use_gpus else f"CPU ({os.cpu_count()} cores)"
    md = (
        f"# Two nodes simulated on one machine, against one node\n\nMachine: {machine}; profile "
        f"{args.profile}, {args.steps} steps, {2 * args.gpus_per_node} ranks in each job.\n\n{text}\n\n"
        + "\n".join(f"- {job}: {f['status']} ({f['diagnosis']})" for job, f in rows.items())
        + f"\n\nReproduce: `python benchmarks/two_nodes.py --gpus-per-node {args.gpus_per_node} --steps "
        f"{args.steps}` ({took:.0f} s here).\n"
    )
    print(md)
    out = Path(os.environ.get("OUT") or ROOT / "benchmarks" / "results")
    out.mkdir(parents=True, exist_ok=True)
    name = "two_nodes_gpu" if use_gpus else "two_nodes_cpu"
    (out / f"{name}.md").write_text(md)
    (out / f"{name}.json").write_text(json.dumps({"machine": machine, "jobs": rows}, indent=1))
    return 0 if all(f["status"] == "finished" for f in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
