"""Launching the cockpit's own trainer for benchmarks: one rank, one run record, a rehearsal depth.

The benchmarks measure the product's code path: a run directory made by `cockpit.runs.create_run` from
a profile with overrides, and `python -m trainer --rehearse-layers N` (the architecture sliced to N
layers, random weights) with the environment of a single DeepSpeed rank.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single_rank_env() -> dict[str, str]:
    """What a process needs to be DeepSpeed's one and only rank (no launcher)."""
    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "PYTHONUNBUFFERED": "1",
    }


def new_run(profile_name: str, overrides: list[str], runs: Path, name: str) -> tuple[Path, Any]:
    """A run directory for the profile with `overrides`, renamed `name`; returns it and the profile."""
    from cockpit.profiles import load_profile
    from cockpit.runs import create_run

    profile, path = load_profile(profile_name, overrides)
    profile = profile.model_copy(update={"name": name})
    return create_run(runs, profile, path, sys.argv), profile


def run_depth(
    run_dir: Path,
    layers: int,
    steps: int,
    env: dict[str, str] | None = None,
    step_offset: int = 0,
    timeout: float = 600,
    sampler: bool = False,
) -> int | str:
    """Train `steps` steps of the `layers`-layer slice in `run_dir` as one rank: exit code or "timeout"."""
    from cockpit.supervisor import child_env, rehearsal_args

    full_env = {**child_env(), **(env or {}), **single_rank_env()}
    argv = [
        sys.executable,
        "-m",
        "trainer",
        "--run-dir",
        str(run_dir),
        *rehearsal_args(layers, steps, step_offset),
    ]
    with open(run_dir / "output.log", "ab") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT)
        telemetry = None
        if sampler:
            telemetry = subprocess.Popen(
                [sys.executable, "-m", "cockpit.telemetry", str(run_dir), "--root-pid", str(proc.pid)],
                cwd=ROOT,
                env=full_env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return "timeout"
        finally:
            if telemetry is not None:
                telemetry.terminate()
                telemetry.wait()


def log_tail(run_dir: Path, lines: int = 6) -> str:
    tail = (run_dir / "output.log").read_text(errors="replace").strip().splitlines()[-lines:]
    return " | ".join(line[-200:] for line in tail)


def elapsed(t0: float) -> float:
    return round(time.time() - t0, 1)
