"""Fault -> diagnosis -> time to diagnosis, on real runs of the tiny profile.

Each fault is done to a fresh run (the same drivers as `tests/test_faults.py`): the table gives the
status and one-line diagnosis the supervisor wrote, and the seconds from the fault to the final
`run.json` (for faults fired inside the trainer by its test hook, from the last step it logged).

    python benchmarks/faults.py [--only NAME ...]

Writes faults.md and faults.json under $OUT when set. About 5 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from devtools.faults import (  # noqa: E402
    kill,
    rank0_steps,
    start_detached,
    supervisor_pid,
    trainer_pid,
    try_mount_tmpfs,
    unmount,
    wait_end,
    wait_step,
)

Fault = Callable[[Path, Path], tuple[Path, float]]


def sigkill_rank(runs: Path, cache: Path) -> tuple[Path, float]:
    run = start_detached(runs, cache, 200)
    wait_step(run, 2)
    return run, kill(trainer_pid(run), signal.SIGKILL)


TWO_RANKS = ("--set", "hardware.gpus=2")  # two ranks (on the CPU: two CPU ranks over gloo)


def sigkill_rank1_of_2(runs: Path, cache: Path) -> tuple[Path, float]:
    run = start_detached(runs, cache, 200, *TWO_RANKS)
    wait_step(run, 2)
    return run, kill(trainer_pid(run, rank=1), signal.SIGKILL)


def sigterm_supervisor(runs: Path, cache: Path) -> tuple[Path, float]:
    run = start_detached(runs, cache, 200)
    wait_step(run, 2)
    return run, kill(supervisor_pid(run), signal.SIGTERM)


def hook(spec: str, *more: str) -> Fault:
    def fault(runs: Path, cache: Path) -> tuple[Path, float]:
        run = start_detached(runs, cache, 200, *more, COCKPIT_TEST_FAULT=spec)
        wait_end(run)
        steps = rank0_steps(run)
        return run, steps[-1]["t"] if steps else time.time()

    return fault


def disk_full(runs: Path, cache: Path) -> tuple[Path, float]:
    small = runs / "small-fs"
    if not try_mount_tmpfs(small, "1m"):
        return hook("enospc:3")(runs, cache)
    run = start_detached(small, cache, 200)
    wait_end(run)
    steps = rank0_steps(run)
    return run, steps[-1]["t"] if steps else time.time()


FAULTS: dict[str, tuple[str, Fault]] = {
    "sigkill-rank": ("SIGKILL to trainer rank 0", sigkill_rank),
    "hang": ("rank 0 sleeps forever (stall timeout 20 s)", hook("hang:3")),
    "oom": ("out-of-memory error raised in the trainer", hook("oom:2")),
    "sigterm-supervisor": ("SIGTERM to the supervisor", sigterm_supervisor),
    "disk-full": ("run directory on a full 1 MiB tmpfs", disk_full),
    "sigkill-rank1-of-2": ("SIGKILL to rank 1 of two", sigkill_rank1_of_2),
    "hang-rank1-of-2": ("rank 1 of two sleeps forever (stall timeout 20 s)", hook("hang:3:1", *TWO_RANKS)),
    "oom-rank1-of-2": ("out-of-memory error raised in rank 1 of two", hook("oom:2:1", *TWO_RANKS)),
}


def run_faults(names: list[str], tmp: Path, cache: Path) -> list[dict[str, Any]]:
    """Each fault done to a fresh run under `tmp`: its status, diagnosis and time to diagnosis."""
    rows = []
    for name in names:
        what, fault = FAULTS[name]
        runs = tmp / name
        runs.mkdir()
        run, at = fault(runs, cache)
        manifest = wait_end(run)
        seconds = manifest["ended_at"] - at
        rows.append(
            {
                "fault": name,
                "what": what,
                "status": manifest["status"],
                "diagnosis": manifest["diagnosis"],
                "seconds": round(seconds, 1),
            }
        )
        print(f"{name}: {manifest['status']} in {seconds:.1f} s", flush=True)
        if name == "disk-full":
            unmount(runs / "small-fs")
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| fault | status | diagnosis | time to diagnosis |", "|---|---|---|---|"]
    lines += [f"| {r['what']} | {r['status']} | {r['diagnosis']} | {r['seconds']:.1f} s |" for r in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="*", choices=sorted(FAULTS), help="run only these faults")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(os.environ.get("COCKPIT_CACHE", Path(tmp) / "cache"))
        rows = run_faults(args.only or list(FAULTS), Path(tmp), cache)
    text = table(rows)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "faults.md").write_text(text + "\n")
        Path(os.environ["OUT"], "faults.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
