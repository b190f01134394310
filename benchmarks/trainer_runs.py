"""Launching the cockpit's own trainer for benchmarks: a run record, a rehearsal depth, one rank or N.

The benchmarks measure the product's code path: a run directory made by `cockpit.service.runs.create_run` from
a profile with overrides, and `python -m trainer --rehearse-layers N` (the architecture sliced to N
layers, random weights) with the environment of a single DeepSpeed rank (`run_depth`,
`cockpit.service.spawn.single_rank_env`), or the trainer
as `cockpit run` launches it, through DeepSpeed's runner, `hardware.gpus` ranks (`run_ranks`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def new_run(profile_name: str, overrides: list[str], runs: Path, name: str) -> tuple[Path, Any]:
    """A run directory for the profile with `overrides`, renamed `name`; returns it and the profile."""
    from cockpit.profiles import load_profile
    from cockpit.service.runs import create_run

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
    from cockpit.service.spawn import child_env, rehearsal_args, single_rank_env

    full_env = {**child_env(), **(env or {}), **single_rank_env()}
    argv = [
        sys.executable,
        "-m",
        "trainer",
        "--run-dir",
        str(run_dir),
        *rehearsal_args(layers, steps, step_offset),
    ]
    return run_logged(argv, run_dir, full_env, timeout, sampler)


def run_ranks(
    run_dir: Path,
    profile: Any,
    extra: list[str] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    sampler: bool = False,
) -> int | str:
    """The trainer in `run_dir` as `cockpit run` launches it (`cockpit.service.spawn.trainer_argv`:
    DeepSpeed's runner with the profile's launcher options, `hardware.gpus` ranks, each under
    `cockpit.service.guard`), with `extra` trainer arguments (a rehearsal depth: `rehearsal_args`); no
    supervisor. Exit code or "timeout"."""
    from cockpit.service.spawn import child_env, free_port, trainer_argv

    argv = trainer_argv(profile, run_dir, False, free_port(), extra or [])
    full_env = {**child_env(), "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    return run_logged(argv, run_dir, full_env, timeout, sampler)


def run_logged(
    argv: list[str], run_dir: Path, env: dict[str, str], timeout: float, sampler: bool = False
) -> int | str:
    """Run `argv` from the repository with its output appended to the run's log, and with the telemetry
    sampler over its process tree if `sampler`; kill its process group past `timeout` ("timeout")."""
    with open(run_dir / "output.log", "ab") as log:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        telemetry = None
        if sampler:
            telemetry = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "cockpit.service.telemetry",
                    str(run_dir),
                    "--root-pid",
                    str(proc.pid),
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the runner and every rank it started
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


def prepare_ops(profile_name: str) -> float:
    """Build the DeepSpeed ops a run of the profile compiles (CPU Adam with optimizer offload) before any
    run is timed; returns the seconds it took (0 where they are built or cannot be). On a fresh GPU
    machine the JIT build takes about two minutes, inside the first offload run's time limit otherwise;
    the runs then load it from the extensions cache."""
    from cockpit.ops import dsops
    from cockpit.profiles import load_profile

    def announce(state: dsops.OpState, words: str) -> None:
        print(f"before the timed runs: {words}", flush=True)

    t0 = time.time()
    built = dsops.ensure_ops(load_profile(profile_name)[0], announce)
    return elapsed(t0) if built else 0.0
