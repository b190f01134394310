"""The one launching surface: every process the cockpit starts, how it is started, and how its group ends.

- **What runs.** The trainer's ranks: DeepSpeed's runner with the profile's launcher options, each rank
  the trainer under its guard (`trainer_argv`, `rehearsal_args` for a rehearsal's depth); the evaluation
  (`evaluate_argv`); the telemetry sampler (`sampler_argv`); the detached supervisors, the run's
  (`supervisor_argv`) and a joining node's (`spawn_node`).
- **With what.** `child_env`: the parent environment, passed through, with NVLink multicast off, passive
  OpenMP waiting, the ninja beside this interpreter first on PATH and this environment's own torch
  extensions folder; `single_rank_env`: one rank without the launcher.
- **Which trainer.** `trainer_problem`: the `trainer` the ranks would import is this project's (its
  `__cockpit_trainer__` marker), or why not.
- **How.** `popen_logged`: output appended to a log file (never a pipe), in a session of its own when
  detached (`spawn_detached`, `spawn_node`: closing the terminal or a viewer never stops a run);
  `GroupEnd`: a launched group asked to end, then killed; `end_process`: a child asked to end, then killed.

Benchmarks and tests launch through these names too, as `cockpit run` does.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cockpit.launcher import RUNNER, runner_options
from cockpit.ops.dsops import ninja_first
from cockpit.ops.extcache import use_keyed_root
from cockpit.profiles import Profile
from cockpit.record import RunPaths

POLL_S = 0.5  # how often a watch loop looks at its processes and the record
KILL_GRACE_S = 15.0  # from asking a group to end (SIGTERM) to killing it
# NVLink multicast can take a shared host's GPUs down: keep it off in every child, whatever the caller set.
CHILD_ENV_DEFAULTS = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "PYTHONUNBUFFERED": "1",
}
# Set unless the user set them. OpenMP threads that spin while they wait (the default) turn any other busy
# process on the host into a 20x slowdown of every CPU step: two tiny runs side by side on 2 cores took
# 20 s a step each with spinning threads, 1.0 s with passive ones (0.8 s alone).
# FlashAttention-4's compiled kernels kept on disk (its own temporary folder), so that each depth of a
# rehearsal, each rank and each resume skips the JIT compile of the packed attention
# (trainer/layers/flash4.py).
CHILD_ENV_UNLESS_SET = {"OMP_WAIT_POLICY": "PASSIVE", "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1"}
# Pinned host memory (ZeRO-3's offloaded partitions) taken by malloc and cudaHostRegister on 8 threads
# rather than cudaHostAlloc, added to the allocator's settings unless they say how to pin: a story layer's
# 1.28 GB pinned in 0.33 s against 1.48 s, its offloaded load 0.525 s a further layer against 1.104 s, its
# steps unchanged (benchmarks/results/pin_speed_h200.md).
PINNED_REGISTER = "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"
TRAINER_MARKER = "__cockpit_trainer__"
_MARKED = re.compile(rf"^{TRAINER_MARKER}\s*=", re.MULTILINE)


# --- what runs -------------------------------------------------------------------------------------------
def free_port() -> int:
    """A TCP port free right now on this host, for the launcher's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trainer_argv(
    profile: Profile,
    run_dir: Path,
    resume: bool,
    port: int,
    extra: Sequence[str] = (),
    node_rank: int | None = None,
) -> list[str]:
    """The launch command, as an argv list (never a shell string): DeepSpeed's runner with the profile's
    launcher options (`cockpit.launcher`), each rank the trainer under its guard (`cockpit.service.guard`);
    `extra` goes to the trainer, `node_rank` is this node's in a launch without ssh."""
    argv = [
        sys.executable, "-m", RUNNER,
        *runner_options(profile.launcher, profile.hardware.nodes, profile.ranks_per_node, port, node_rank),
        "--module", "cockpit.service.guard",
        "--run-dir", str(run_dir),
    ]  # fmt: skip
    if resume:
        argv.append("--resume")
    return [*argv, *extra]


def node_argv(launch_argv: list[str], node_rank: int) -> list[str]:
    """Node 0's launch command for this node: this interpreter, and this node's `--node_rank`."""
    argv = [sys.executable, *launch_argv[1:]]
    if "--node_rank" not in argv:
        raise ValueError("node 0's launch has no --node_rank: it was not launched without ssh")
    argv[argv.index("--node_rank") + 1] = str(node_rank)
    return argv


def rehearsal_args(layers: int, steps: int, step_offset: int, eval_tokens: int = 0) -> list[str]:
    """The trainer's arguments for one rehearsal depth (`python -m trainer --help`); `eval_tokens`: time
    evaluation on the slice after the steps (0: not)."""
    return [
        "--rehearse-layers",
        str(layers),
        "--rehearse-steps",
        str(steps),
        "--step-offset",
        str(step_offset),
        "--rehearse-eval-tokens",
        str(eval_tokens),
    ]


def evaluate_argv(run_dir: Path, extra: Sequence[str] = ()) -> list[str]:
    """The evaluation stage's command (`python -m trainer.evaluation.evaluate --help`)."""
    return [sys.executable, "-m", "trainer.evaluation.evaluate", "--run-dir", str(run_dir), *extra]


def sampler_argv(run_dir: Path, root_pid: int) -> list[str]:
    """The telemetry sampler's command: it measures the process tree under `root_pid`."""
    return [sys.executable, "-m", "cockpit.service.telemetry", str(run_dir), "--root-pid", str(root_pid)]


def supervisor_argv(
    run_dir: Path, resume: bool = False, eval_models: Sequence[str] | None = None
) -> list[str]:
    """The supervisor's command line: a new run, a resume, or an ended run evaluated (`NAME=PATH` models)."""
    argv = [sys.executable, "-m", "cockpit.service.supervisor", str(run_dir)]
    if resume:
        argv.append("--resume")
    if eval_models is not None:
        argv += ["--eval", *(a for model in eval_models for a in ("--model", model))]
    return argv


# --- with what -------------------------------------------------------------------------------------------
def child_env() -> dict[str, str]:
    """The parent environment, passed through, with the multicast-off variables forced, passive OpenMP
    waiting and registered pinned memory (`PINNED_REGISTER`, beside the user's other allocator settings)
    unless the user chose otherwise, the ninja beside this interpreter first on PATH
    (`dsops.ninja_first`), and this environment's own torch extensions folder unless the user set one
    (`extcache.use_keyed_root`: two environments never rebuild each other's ops)."""
    env = {**CHILD_ENV_UNLESS_SET, **os.environ}
    env.update(CHILD_ENV_DEFAULTS)
    key = "PYTORCH_ALLOC_CONF" if "PYTORCH_ALLOC_CONF" in env else "PYTORCH_CUDA_ALLOC_CONF"
    conf = env.get(key, "")
    if "pinned_use_cuda_host_register" not in conf:
        env[key] = f"{conf},{PINNED_REGISTER}" if conf else PINNED_REGISTER
    env["PATH"] = ninja_first(env.get("PATH", ""))  # one ninja for every op build (dsops)
    use_keyed_root(env)
    return env


def single_rank_env() -> dict[str, str]:
    """What a process needs to be DeepSpeed's one and only rank without its launcher (a benchmark's
    `python -m trainer`): rank 0 of 1, a free rendezvous port on this host."""
    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "PYTHONUNBUFFERED": "1",
    }


# --- which trainer ---------------------------------------------------------------------------------------
def _find_trainer(cwd: Path) -> importlib.machinery.ModuleSpec | None:
    """The `trainer` a child started in `cwd` would import: `cwd` first on the path (`python -m` and the
    DeepSpeed launcher put it there), then this interpreter's path and import hooks. Nothing is imported."""
    search = [str(cwd), *sys.path]
    for finder in sys.meta_path:
        if finder is importlib.machinery.PathFinder:
            spec = importlib.machinery.PathFinder.find_spec("trainer", search)
        else:
            find = getattr(finder, "find_spec", None)
            spec = find("trainer", None) if find is not None else None
        if spec is not None:
            return spec
    return None


def trainer_problem(cwd: Path | None = None) -> str | None:
    """Why the ranks, started from `cwd`, would not run this project's trainer (one line); None if they would.

    The name `trainer` is taken by other packages on the public index: ours is the one whose
    `__init__.py` sets `__cockpit_trainer__`.
    """
    here = Path.cwd() if cwd is None else Path(cwd)
    spec = _find_trainer(here)
    if spec is None:
        return f"no module named 'trainer' for {sys.executable} from {here}: reinstall the cockpit"
    fix = "uninstall or rename it, or start from another directory"
    if spec.origin is None or not spec.has_location:  # a namespace package: a folder without __init__.py
        where = ", ".join(spec.submodule_search_locations or []) or "?"
        return f"'trainer' resolves to a namespace package at {where}, not the cockpit's trainer: {fix}"
    try:
        source = Path(spec.origin).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return f"'trainer' resolves to {spec.origin}, which cannot be read ({exc.strerror}): {fix}"
    if not _MARKED.search(source):
        return f"'trainer' resolves to {spec.origin}, not the cockpit's trainer (no {TRAINER_MARKER}): {fix}"
    return None


# --- how -------------------------------------------------------------------------------------------------
def popen_logged(argv: list[str], log_path: Path, detached: bool = True) -> subprocess.Popen[bytes]:
    """Start `argv` in this directory with the child environment, its output appended to `log_path`;
    `detached`: in its own session and process group (a viewer's Ctrl-C never reaches it; a signal to the
    group reaches all of it)."""
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env(),
            start_new_session=detached,
        )
    finally:
        log.close()


def spawn_detached(
    run_dir: Path, resume: bool = False, eval_models: Sequence[str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a supervisor for `run_dir` in its own session; its own messages go to `supervisor.log`."""
    log_path = RunPaths(Path(run_dir)).supervisor_log
    return popen_logged(supervisor_argv(run_dir, resume, eval_models), log_path)


def spawn_node(run_dir: Path, node_rank: int) -> subprocess.Popen[bytes]:
    """Start node `node_rank`'s supervisor for `run_dir` in its own session (`supervisor-node<N>.log`)."""
    return popen_logged(
        [sys.executable, "-m", "cockpit.service.node", str(run_dir), "--node-rank", str(node_rank)],
        RunPaths(Path(run_dir)).node_supervisor_log(node_rank),
    )


def end_process(proc: subprocess.Popen[bytes] | None, wait_s: float = 5.0) -> None:
    """Ask a child to end (SIGTERM) and wait for it; kill it if it has not ended within `wait_s`."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class GroupEnd:
    """A launched process group's end as asked for: when it was first asked to end, and whether killed."""

    terminated_at: float | None = None
    killed: bool = False

    def signal(self, proc: subprocess.Popen[bytes] | None, sig: signal.Signals, now: float) -> None:
        """Send `sig` to the group `proc` leads (nothing once it has ended), noting a kill or the first
        request to end."""
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        if sig == signal.SIGKILL:
            self.killed = True
        elif self.terminated_at is None:
            self.terminated_at = now

    def overdue(self, now: float) -> bool:
        """Asked to end more than `KILL_GRACE_S` ago and not killed yet: time to kill."""
        return self.terminated_at is not None and now - self.terminated_at > KILL_GRACE_S and not self.killed
