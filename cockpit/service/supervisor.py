"""The supervisor: the one process that owns a run, from launch to diagnosis.

Started detached (its own session) by `cockpit run`, so closing the terminal or the viewer never
stops training. It launches the trainer ranks through the DeepSpeed launcher with their output going
straight into `output.log` (a file, not a pipe: nothing can fill up and block the trainer, and the
trainer keeps writing even if the supervisor dies), watches for stop requests, and writes the
final status and a one-line diagnosis into `run.json`.

Usage: `python -m cockpit.service.supervisor RUN_DIR [--resume | --eval [--model NAME=PATH ...]]`. Started by
`cockpit.service.lifecycle`, never by hand.
"""

from __future__ import annotations

import argparse
import errno
import importlib.machinery
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from cockpit.launcher import RUNNER, master_port, runner_options
from cockpit.ops.dsops import ninja_first
from cockpit.ops.extcache import use_keyed_root
from cockpit.profiles import Profile, parse_profile
from cockpit.record import EventWriter, RunPaths, RunReader, load_manifest, write_manifest
from cockpit.record.control import request_stop
from cockpit.record.view import RunView
from cockpit.service.diagnosis import EndFacts, culprit, describe_exit, diagnose, last_error_line, stall_where
from cockpit.service.liveness import started_at
from cockpit.service.ramguard import ram_limit_mib, ram_verdict
from cockpit.service.shm import remove_allreduce_buffers
from cockpit.service.stall import StallDetector
from cockpit.service.telemetry import ProcessTree

POLL_S = 0.5
TAIL_BYTES = 256 * 1024
KILL_GRACE_S = 15.0
# After node 0's ranks end, how long it waits for the nodes that joined (launches without ssh) to end
# theirs and say how (`node_end`), before diagnosing without them.
NODE_END_WAIT_S = 45.0
STACK_WAIT_S = 3.0  # for the ranks' stack dumps, when a stall is judged
# Space kept aside in the run directory, freed to write the last words when the disk fills up.
RESERVE_BYTES = 256 * 1024
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
CHILD_ENV_UNLESS_SET = {"OMP_WAIT_POLICY": "PASSIVE"}


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


TRAINER_MARKER = "__cockpit_trainer__"
_MARKED = re.compile(rf"^{TRAINER_MARKER}\s*=", re.MULTILINE)


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


def rehearsal_args(layers: int, steps: int, step_offset: int) -> list[str]:
    """The trainer's arguments for one rehearsal depth (`python -m trainer --help`)."""
    return [
        "--rehearse-layers",
        str(layers),
        "--rehearse-steps",
        str(steps),
        "--step-offset",
        str(step_offset),
    ]


def child_env() -> dict[str, str]:
    """The parent environment, passed through, with the multicast-off variables forced, passive OpenMP
    waiting unless the user chose otherwise, the ninja beside this interpreter first on PATH
    (`dsops.ninja_first`), and this environment's own torch extensions folder unless the user set one
    (`extcache.use_keyed_root`: two environments never rebuild each other's ops)."""
    env = {**CHILD_ENV_UNLESS_SET, **os.environ}
    env.update(CHILD_ENV_DEFAULTS)
    env["PATH"] = ninja_first(env.get("PATH", ""))  # one ninja for every op build (dsops)
    use_keyed_root(env)
    return env


def read_tail(path: Path, size: int = TAIL_BYTES) -> str:
    """The last `size` bytes of a file as text."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended: the status, diagnosis and exit code for `run.json`, and more fields."""

    status: str
    diagnosis: str
    exit_code: int | None
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Evaluation:
    """How an evaluation stage ended: `run.json`'s `evaluation`, read back by `cockpit eval RUN`."""

    status: str  # finished, failed, stopped, skipped
    summary: str  # the diagnosis's part about the evaluation
    exit_code: int | None = None  # trainer.evaluate's

    def outcome(self, fields: dict[str, Any]) -> Outcome:
        """The attempt's outcome when evaluating was all it did (an evaluation-only run)."""
        return Outcome(self.status, self.summary, 0 if self.status == "finished" else 1, fields)


class Supervisor:
    """Owns one run: launch, watch, stop, diagnose.

    One attempt a process: a new run (train then evaluate, or evaluate base models only), a resume
    (`resume`), or the evaluation of an ended run (`eval_args`, the arguments for `trainer.evaluate`).
    """

    def __init__(
        self,
        run_dir: Path,
        resume: bool = False,
        eval_args: Sequence[str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.paths = RunPaths(Path(run_dir).resolve())
        self.resume = resume
        self.eval_args = None if eval_args is None else list(eval_args)
        self.manifest = load_manifest(self.paths.root)
        self.profile = parse_profile(self.manifest["profile"], str(self.paths.manifest))
        self.events = EventWriter(self.paths.events("supervisor"))
        self.reader = RunReader(self.paths.root, strict=False)  # a damaged line must not stop the run's owner
        self.view = RunView()
        self.proc: subprocess.Popen[bytes] | None = None
        self.stop_requested_at: float | None = None
        self.ending = GroupEnd()  # the stage's process group: asked to end when, killed or not
        self.ram_peak_fraction = 0.0
        self.ram_peak_mib = 0.0
        self.ram_limit_mib = ram_limit_mib(
            self.profile.hardware.host_ram_limit_gib, psutil.virtual_memory().total / 2**20
        )
        self.ram_stop: str | None = None  # the guard's diagnosis, once it has stopped the run
        self.tree: ProcessTree | None = None  # the stage's processes: the launcher and its ranks
        self.stop_reason = "user"
        self.stage = ""
        self.stall = StallDetector(self.profile.training.stall_timeout_s, clock, resumed=resume)
        self.stall_where = ""  # which rank stalled, when a stall was judged with several ranks
        self.reserve = self.paths.reserve
        self.disk_full = False
        self.telemetry: subprocess.Popen[bytes] | None = None

    # --- manifest --------------------------------------------------------------------------------
    def _update_manifest(self, **fields: Any) -> None:
        self.manifest.update(fields)
        self._durable(lambda: write_manifest(self.paths.root, self.manifest))

    def _note(self, message: str, **fields: Any) -> None:
        self._durable(lambda: self.events.write("note", message=message, **fields))

    def _durable(self, write: Any) -> None:
        """A record write that survives a full disk: free the reserve once and try again."""
        try:
            write()
        except OSError as exc:
            if exc.errno != errno.ENOSPC or not self.reserve.exists():
                raise
            self.reserve.unlink()
            self.disk_full = True
            write()

    def _make_reserve(self) -> None:
        try:
            with open(self.reserve, "wb") as f:
                f.write(b"\0" * RESERVE_BYTES)
        except OSError:
            self.reserve.unlink(missing_ok=True)

    # --- signals and requests ----------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.stop_requested_at is None:
            self.stop_reason = f"{name} to the supervisor"
        self._note(f"supervisor received {name}: stopping the run")
        self.request_stop()

    def request_stop(self) -> None:
        """Ask the trainer to checkpoint and exit (it polls the request file at every step)."""
        request_stop(self.paths.root)

    def _check_requests(self, now: float) -> None:
        if self.stop_requested_at is None and self.paths.stop_request.exists():
            self.stop_requested_at = now
            self._durable(
                lambda: self.events.write("stop_request", phase=self.view.phase, step=self.view.step)
            )
            if self.stage != "train" or self.view.phase in ("starting", "build", "setup", "load"):
                self._signal_group(
                    signal.SIGTERM
                )  # nothing to checkpoint (yet): evaluation, or before training
        if self.paths.kill_request.exists() and not self.ending.killed:
            self._note("kill requested: SIGKILL to the training processes")
            self._signal_group(signal.SIGKILL)
        asked = self.ending.terminated_at
        if asked is not None and now - asked > KILL_GRACE_S and not self.ending.killed:
            self._signal_group(signal.SIGKILL)

    def _signal_group(self, sig: signal.Signals) -> None:
        self.ending.signal(self.proc, sig, time.time())

    def _check_stall(self) -> None:
        """Say when a stall is suspected or cleared; stop a stalled run (see `cockpit.service.stall`)."""
        change = self.stall.check()
        if change is None:
            return
        step = self.stall.stage_step  # this attempt's: a resume's setup is before any step of its own
        if change.kind == "cleared":  # steps, or before the first step progress, came again
            again = f"steps again at step {step}" if step is not None else "progress again"
            self._note(again, stall_suspected=False)
            self._update_manifest(warning=None)
        elif change.kind == "suspected":
            self._note(change.message, stall_suspected=True)
            at = f"at step {step}" if step is not None else "before the first step"
            self._update_manifest(warning=f"stall suspected {at}: {change.message}")
        else:
            self.stall_where = self._stalled_rank()
            where = f"{self.stall_where}; " if self.stall_where else ""
            self._note(f"stalled: {where}{change.message}")
            self._signal_group(signal.SIGTERM)

    def _stalled_rank(self) -> str:
        """With several ranks: ask this host's ranks for their Python stacks (SIGUSR1, `trainer/__main__.py`)
        and say which one is stuck outside a collective (`cockpit.service.diagnosis.stall_where`)."""
        if self.profile.world_size <= 1:
            return ""
        here = socket.gethostname()
        sizes: dict[int, int] = {}
        for rank, info in self.view.ranks.items():
            path = self.paths.stack(rank)
            if info.get("host") != here or not path.exists():
                continue
            sizes[rank] = path.stat().st_size
            try:
                os.kill(int(info["pid"]), signal.SIGUSR1)
            except (ProcessLookupError, PermissionError, KeyError, ValueError):
                sizes.pop(rank)
        deadline = time.monotonic() + STACK_WAIT_S
        while time.monotonic() < deadline and any(
            self.paths.stack(r).stat().st_size == n for r, n in sizes.items()
        ):
            time.sleep(0.1)
        time.sleep(0.2)  # a dump is written in one go, all threads: let the last one finish
        stacks = {}
        for rank, size in sizes.items():
            with open(self.paths.stack(rank), encoding="utf-8", errors="replace") as f:
                f.seek(size)
                stacks[rank] = f.read()
        return stall_where(stacks, self.view.ranks)

    def _check_host_ram(self) -> None:
        """Once, when the stage's processes reach the RAM limit: ask for a checkpoint and a stop
        (`cockpit.service.ramguard`). A stop already asked for (by the user, a signal) is left to run
        its course."""
        if self.ram_stop is not None or self.tree is None or self.stop_requested_at is not None:
            return
        if self.paths.stop_request.exists():
            return
        rss = self.tree.sample().get("run_rss_mib")
        verdict = ram_verdict(rss, self.ram_limit_mib)
        if verdict is None:
            return
        self.ram_stop = verdict
        self.stop_reason = verdict
        self._note(
            f"{verdict}: checkpoint and stop requested",
            run_rss_mib=rss,
            host_ram_limit_mib=round(self.ram_limit_mib, 1),
        )
        self.request_stop()

    def _sample_host(self) -> None:
        vm = psutil.virtual_memory()
        used = vm.total - vm.available
        if used / vm.total > self.ram_peak_fraction:
            self.ram_peak_fraction = used / vm.total
            self.ram_peak_mib = used / 2**20

    # --- telemetry ---------------------------------------------------------------------------------
    def _start_telemetry(self) -> None:
        """Start the sampler (its own process, its own event file) for the whole run: its root is this
        supervisor, so the process tree it measures holds every stage's processes (train, eval)."""
        root = str(os.getpid())
        argv = [sys.executable, "-m", "cockpit.service.telemetry", str(self.paths.root), "--root-pid", root]
        log = open(self.paths.telemetry_log, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.telemetry = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=child_env()
            )
        except OSError as exc:  # telemetry is worth having, never worth failing a run for
            self.events.write("note", message=f"telemetry sampler did not start: {exc}")
        finally:
            log.close()

    def _stop_telemetry(self) -> None:
        """Ask the sampler to write its last line and exit; kill it if it does not."""
        if self.telemetry is None or self.telemetry.poll() is not None:
            return
        self.telemetry.terminate()
        try:
            self.telemetry.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.telemetry.kill()
            self.telemetry.wait()

    # --- the run ---------------------------------------------------------------------------------
    def launch(self, argv: list[str], stage: str) -> None:
        """Start one stage's processes in their own group, output appended to `output.log`."""
        self.ending.terminated_at = None
        self.stage = stage
        self.stall.begin_stage(stage)
        # Its own process group: stop and kill reach every rank.
        self.proc = popen_detached(argv, self.paths.output_log)
        self.tree = ProcessTree(self.proc.pid)
        self.events.write(
            "launch", stage=stage, argv=argv, pid=self.proc.pid, world_size=self.profile.world_size
        )
        self._update_manifest(trainer_pgid=self.proc.pid)

    def watch(self) -> int:
        """Poll until the training processes exit; returns their exit code."""
        assert self.proc is not None
        while True:
            now = time.time()
            events = self.reader.poll()
            self.view.apply(events)
            self.stall.observe(events)
            self._sample_host()
            self._check_host_ram()
            self._check_requests(now)
            self._check_stall()
            rc = self.proc.poll()
            if rc is not None:
                self.view.apply(self.reader.poll())
                return rc
            time.sleep(POLL_S)

    def train(self, extra: Sequence[str] = ()) -> tuple[str, str, int]:
        """The training stage; returns (status, diagnosis, exit code)."""
        port = master_port(self.profile.launcher, self.profile.hardware.nodes, free_port())
        self.stall_where = ""
        self.launch(trainer_argv(self.profile, self.paths.root, self.resume, port, extra), "train")
        spec, nodes = self.profile.launcher, self.profile.hardware.nodes
        if spec.no_ssh and nodes > 1:  # the ranks wait at the rendezvous until every node has joined
            others = ", ".join(str(n) for n in range(nodes) if n != spec.node_rank)
            self._note(
                f"node {spec.node_rank} launched; on node(s) {others}: "
                f"`cockpit join {self.paths.run_id} --node-rank N` (the run waits for them)"
            )
        returncode = self.watch()
        remove_allreduce_buffers(port)  # DeepSpeed leaves its CPU all-reduce buffers in /dev/shm
        self._durable(lambda: self.events.write("launch_end", stage="train", exit_code=returncode))
        self._wait_for_nodes()
        facts = EndFacts(
            returncode=returncode,
            output_tail=read_tail(self.paths.output_log),
            stop_requested=self.stop_requested_at is not None,
            stop_reason=self.stop_reason,
            ram_guard=self.ram_stop or "",
            stalled=self.stall.stalled is not None,
            stall_detail="; ".join(w for w in (self.stall_where, self.stall.stalled or "") if w),
            disk_full=self.disk_full,
            disk_free_mib=shutil.disk_usage(self.paths.root).free / 2**20,
            host_ram_peak_fraction=self.ram_peak_fraction,
            host_ram_peak_mib=self.ram_peak_mib,
            gpu_peak_mib={
                r: m["cuda_peak_alloc_mib"] for r, m in self.view.memory.items() if "cuda_peak_alloc_mib" in m
            }
            or None,
            trainer_outcome=self.view.trainer_outcome,
            last_step=self.view.step or None,
            stall_step=self.stall.stage_step,
            culprit=self._culprit(),
            early_stop=self.view.early_stop or "",
        )
        status, diagnosis = diagnose(facts)
        return status, diagnosis, returncode

    def _culprit(self) -> Any:
        """With several ranks, the one that failed first on its own (`cockpit.service.diagnosis.culprit`)."""
        if self.profile.world_size <= 1:
            return None
        view = self.view
        return culprit(view.ranks, view.rank_exits, view.rank_errors)

    def _wait_for_nodes(self) -> None:
        """In a launch without ssh, wait (a while) for every node that joined it to say how its ranks
        ended, so the diagnosis sees them; nodes that never joined are named in a note."""
        spec, nodes = self.profile.launcher, self.profile.hardware.nodes
        if not spec.no_ssh or nodes <= 1:
            return
        deadline = time.monotonic() + NODE_END_WAIT_S
        while not set(self.view.nodes_joined) <= set(self.view.nodes_ended) and time.monotonic() < deadline:
            time.sleep(POLL_S)
            self.view.apply(self.reader.poll())
        silent = sorted(set(self.view.nodes_joined) - set(self.view.nodes_ended))
        if silent:
            waited = f"{NODE_END_WAIT_S:.0f} s"
            self._note(f"node(s) {', '.join(map(str, silent))} did not report an end within {waited}")
        absent = sorted(set(range(nodes)) - {spec.node_rank} - set(self.view.nodes_joined))
        if absent:
            which = ", ".join(map(str, absent))
            self._note(f"node(s) {which} never joined (`cockpit join RUN --node-rank N` on each)")

    def evaluate(self, extra_args: list[str]) -> Evaluation:
        """The evaluation stage and the report."""
        self.events.write("note", message="evaluating on the held-out split")
        self.launch(
            [sys.executable, "-m", "trainer.evaluate", "--run-dir", str(self.paths.root), *extra_args], "eval"
        )
        returncode = self.watch()
        if returncode != 0:
            if self.stop_requested_at is not None:
                by = f": {self.ram_stop}" if self.ram_stop else " by user"
                return Evaluation("stopped", f"evaluation stopped{by}", returncode)
            tail = read_tail(self.paths.output_log)
            error = last_error_line(tail)
            summary = f"evaluation failed ({describe_exit(returncode, tail)}{': ' + error if error else ''})"
            return Evaluation("failed", summary, returncode)
        from cockpit.report import run_report, summary_line, write_report

        try:
            report = run_report(self.paths.root)
            write_report(self.paths.root, report)
        except Exception as exc:  # the predictions are on disk: `cockpit report` can try again
            self._note(f"report failed: {exc}")
            return Evaluation("failed", f"report failed: {exc}", returncode)
        self._durable(
            lambda: self.events.write(
                "report", path=str(self.paths.report_json), summary=summary_line(report)
            )
        )
        return Evaluation("finished", summary_line(report), returncode)

    def attempt(self) -> Outcome:
        """This attempt's stages, by what the supervisor was started for."""
        problem = trainer_problem()  # the ranks start here, with this interpreter: would they run ours?
        if problem is not None:
            return Outcome("failed", problem, 2)
        if self.eval_args is not None:
            return self._evaluate_ended_run(self.eval_args)
        if self.manifest.get("mode", "train") == "rehearse":
            return self._rehearse()
        if self.manifest.get("mode", "train") == "eval":
            evaluation = self.evaluate(["--no-adapter", *self.manifest.get("eval_args", [])])
            return evaluation.outcome({"evaluation": asdict(evaluation)})
        return self._train_then_evaluate()

    def _train_then_evaluate(self) -> Outcome:
        """Train, then evaluate if training finished; `training` keeps the training's own outcome."""
        status, diagnosis, returncode = self.train()
        fields: dict[str, Any] = {
            "training": {"status": status, "diagnosis": diagnosis, "exit_code": returncode},
            "evaluation": None,
        }
        if status != "finished" or not self.profile.eval.enabled:
            return Outcome(status, diagnosis, returncode, fields)
        if self.stop_requested_at is not None:
            later = f"cockpit eval {self.paths.root.name}"
            evaluation = Evaluation("skipped", f"evaluation skipped (stop requested): {later}")
        else:  # training finished whatever evaluation does: its outcome goes into the diagnosis
            evaluation = self.evaluate([])
        fields["evaluation"] = asdict(evaluation)
        return Outcome(status, f"{diagnosis}; {evaluation.summary}", returncode, fields)

    def _rehearse(self) -> Outcome:
        """Every depth of a rehearsal in turn, bracketed in the record, then the prediction from them.

        A depth that fails or is stopped ends the rehearsal; the depths already measured stay, and the
        prediction is made from them (two at least).
        """
        from cockpit.rehearse.measure import BEGIN, END
        from cockpit.rehearse.run import forecast_run, write_forecast

        rehearsal = self.manifest["rehearsal"]
        steps, offset = int(rehearsal["steps"]), 0
        measured: list[int] = []
        status, diagnosis, returncode = "finished", "", 0
        for layers in rehearsal["layers"]:
            if self.stop_requested_at is not None:
                break
            begin = {"layers": layers, "steps": steps, "step_offset": offset}
            self._durable(lambda begin=begin: self.events.write(BEGIN, **begin))
            status, diagnosis, returncode = self.train(rehearsal_args(layers, steps, offset))
            end = {
                "layers": layers,
                "status": "ok" if status == "finished" else status,
                "message": diagnosis,
                "exit_code": returncode,
            }
            self._durable(lambda end=end: self.events.write(END, **end))
            offset += steps
            if status != "finished":
                break
            measured.append(layers)
        try:
            result = forecast_run(self.paths.root)
            write_forecast(self.paths.root, result)
            summary = result.summary()
            self._durable(
                lambda: self.events.write("rehearsal", path=str(self.paths.rehearsal), summary=summary)
            )
        except Exception as exc:  # the depths are in the record: `cockpit rehearse --show RUN` can try again
            summary = f"prediction failed: {type(exc).__name__}: {exc}"
            self._note(summary)
        done = ", ".join(map(str, measured)) or "none"
        skipped = [d for d in rehearsal["layers"] if d not in measured]
        if status == "finished" and skipped:  # a stop that came as a depth finished: the rest never ran
            left = ", ".join(map(str, skipped))
            return Outcome(
                "stopped", f"stopped by user; depths {done} measured, {left} not run; {summary}", 3
            )
        if status == "finished":
            return Outcome("finished", f"rehearsed depths {done}; {summary}", 0)
        return Outcome(status, f"{diagnosis}; depths measured before: {done}; {summary}", returncode)

    def _evaluate_ended_run(self, eval_args: list[str]) -> Outcome:
        """Evaluate an ended run again: its training's outcome stays, this evaluation's is added to it."""
        evaluation = self.evaluate(eval_args)
        fields = {"evaluation": asdict(evaluation)}
        training = self.manifest.get("training")
        if not training:  # an evaluation-only run
            return evaluation.outcome(fields)
        diagnosis = f"{training.get('diagnosis') or training['status']}; {evaluation.summary}"
        return Outcome(training["status"], diagnosis, training.get("exit_code"), fields)

    def run(self) -> int:
        """The whole life of the attempt; returns 0 when the run's status is `finished`."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the terminal going away is not a reason to stop
        # A request already in control/ was made for this attempt (the lifecycle clears old ones before
        # a resume or an evaluation): a stop asked for while the supervisor was starting must not be lost.
        self._make_reserve()
        self.events.write(
            "supervisor_start",
            pid=os.getpid(),
            resume=self.resume,
            host_ram_limit_mib=round(self.ram_limit_mib, 1),
        )
        self._update_manifest(
            status="running",
            started_at=self.manifest.get("started_at") or time.time(),
            ended_at=None,
            diagnosis=None,
            exit_code=None,
            supervisor_pid=os.getpid(),
            supervisor_started_at=started_at(os.getpid()),  # with the PID, proves it is this supervisor
            resumed=self.resume or self.manifest.get("resumed", False),
            warning=None,
        )
        self._start_telemetry()
        try:
            outcome = self.attempt()
        except Exception as exc:  # the supervisor itself failed: say so in the record, then re-raise
            self._signal_group(signal.SIGKILL)
            self._stop_telemetry()
            self.events.write("end", status="failed", diagnosis=f"supervisor error: {exc!r}")
            self._update_manifest(
                status="failed", diagnosis=f"supervisor error: {exc!r}", ended_at=time.time()
            )
            raise
        self._stop_telemetry()
        status, diagnosis, returncode = outcome.status, outcome.diagnosis, outcome.exit_code
        self._durable(
            lambda: self.events.write("end", status=status, diagnosis=diagnosis, exit_code=returncode)
        )
        self._update_manifest(
            status=status, diagnosis=diagnosis, exit_code=returncode, ended_at=time.time(), **outcome.fields
        )
        self.events.close()
        self.reserve.unlink(missing_ok=True)
        return 0 if status == "finished" else 1


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


def spawn_detached(
    run_dir: Path, resume: bool = False, eval_models: Sequence[str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a supervisor for `run_dir` in its own session; its own messages go to `supervisor.log`."""
    log_path = RunPaths(Path(run_dir)).supervisor_log
    return popen_detached(supervisor_argv(run_dir, resume, eval_models), log_path)


def popen_detached(argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start `argv` in this directory, in its own session and process group (a viewer's Ctrl-C never
    reaches it; a signal to the group reaches all of it), its output appended to `log_path`, with the
    child environment."""
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env(),
            start_new_session=True,
        )
    finally:
        log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cockpit.service.supervisor", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    parser.add_argument("--eval", action="store_true", help="evaluate the ended run (base, adapter, models)")
    parser.add_argument("--model", action="append", default=[], metavar="NAME=PATH", help="with --eval")
    args = parser.parse_args(argv)
    eval_args = [a for model in args.model for a in ("--model", model)] if args.eval else None
    return Supervisor(args.run_dir, resume=args.resume, eval_args=eval_args).run()


if __name__ == "__main__":
    sys.exit(main())
