"""Every figure of issues 12 and 13 that needs two GPUs, from one script, for a session lent two H200s.

Parts (`--parts`, comma-separated part or unit names; every part by default), run unit by unit in this
order of importance; a unit whose estimate exceeds what is left of `--budget-s` is skipped, and the
table says so (a later, cheaper unit may still run):

- `slice` (issue 13, "Two H200s"): the story's architecture sliced to 1, 2 and 4 layers, random weights,
  NF4 experts, no offload (`rehearsal_accuracy.py`'s `nf4-none`: the profile's micro-batch, 8 steps a depth),
  trained under ZeRO-3 across both GPUs through DeepSpeed's runner as `cockpit run` launches it, with the
  telemetry sampler (unit `slice-2`); then the deepest slice alone on GPU 0 (`CUDA_VISIBLE_DEVICES=0`,
  unit `slice-1`). Per GPU: load time, GPU peak at load and in training (the ranks' CUDA figures), NVML's
  peak, step time and tokens/s, against the one-GPU run. The record is checked for events of both ranks.
- `slice-eval` (issue 13, "Two H200s" and part 5): the deepest slice loaded as evaluation loads it and
  evaluated on both GPUs (`eval_placement.py --run --layers 4`: accelerate's placement puts layers on
  both), then on GPU 0 alone: per GPU the planned layers and bytes, the peaks of load, scoring forward and
  thinking batch, load time and tokens/s (units `eval-2`, `eval-1`).
- `tiny` (issue 13, "Two H200s"): `cockpit run` of the tiny profile on both GPUs, trained and evaluated
  (`tiny-2`; evaluation's placement read from the log, NVML's peak of each GPU while it evaluates), and
  on GPU 0 alone (`tiny-1`, last: the least needed).
- `screenshot`: the app over the two-GPU records (`screenshots/make_screenshots.py run-2xh200.svg
  --record RUN`), two thirds into their steps, the GPU chart on the run's range.
- `faults` (issue 13, "Faults"): rank 1 of two SIGKILLed, diagnosed by its rank (`faults.py`'s
  `sigkill-rank1-of-2`, unit `fault-kill`); its hang and out-of-memory rows last (`faults-more`).
- `two-nodes` (issue 13): `two_nodes.py --gpus-per-node 1`: two launcher invocations without ssh, node
  ranks 0 and 1, one GPU each, against one node of two GPUs.
- `rehearsal` (issue 12, "On two H200s, the same"): the four configurations (NF4 or 16-bit experts x
  parameter offload or none) at depths 1, 2 and 4 on two GPUs, depth 4 predicted from 1 and 2 by
  `cockpit.rehearse.figures.fit_all` with the shape terms for two ranks (`terms_for`)
  (`rehearsal_accuracy.compare`); `nf4-none` is the `slice-2` run itself.
- `load-share` (issue 13, part 4): `load_share.py --gpus 2 --profile <story> --layers 4 --repeats 2`.

Writes two_gpus_h200.md and .json under $OUT (else benchmarks/results/) after every unit (a command
cut short keeps what it measured), the two-GPU records (events, manifest, log; no checkpoints) as
two_gpus_records.tar.gz, and the screenshots as two_gpus_<unit>.svg. Without two GPUs it says so and
exits 2. `--cpu`: a smoke test of the script on 2 CPU ranks (gloo) with the tiny profile, parts slice,
tiny, screenshot, faults and two-nodes (writes two_gpus_cpu.*; about 5 minutes on 2 cores).
`--resume FILE` keeps the units a previous call finished (and their records, if still on this
machine) and runs the rest; `--report-only --resume FILE` writes the tables again from FILE.

Runbook (a session lent `nvidia-h200-x2`: about 30 minutes of device time, about 60 s to start a
machine, 10 minutes a command; the estimates below are guesses from one-GPU runs):

0. Here, before any device time, in the repository root: the wheels the GPU image lacks go in the
   ignored folder `.whl/` (`echo /.whl/ >> .git/info/exclude`): bitsandbytes 0.50.2, deepspeed 0.19.8
   (`DS_BUILD_OPS=0 pip wheel --no-deps --no-build-isolation deepspeed==0.19.8`), textual 8.2.8,
   pydantic 2.14.4, pydantic-core 2.50.5, typing-extensions 4.16.0, hjson, annotated-types,
   typing-inspection, linkify-it-py, mdit-py-plugins, uc-micro-py, platformdirs (the main checkout's
   `.whl/` holds most of them), and for the screenshots textual-plotext 1.0.1 and plotext 5.3.2:
       python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
         --implementation cp --platform manylinux2014_x86_64 -d .whl \\
         textual-plotext==1.0.1 plotext==5.3.2 typing-extensions==4.16.0
1. The first call (`run`, kind `nvidia-h200-x2`, carry `[".whl"]`, timeout_s 600):
       python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade
         --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit;
         python3 benchmarks/two_gpus.py --budget-s 500
   (one line). It runs the units in order until the budget, then writes what it has.
2. At once (a machine stays warm 30 s after a call): copy the call's two_gpus_h200.json from files_at
   to benchmarks/results/ here (it travels with the working tree), and call again with the same command
   and `--resume benchmarks/results/two_gpus_h200.json`: it runs what the first call skipped. A third
   call the same way if device time is left. Keep each call's two_gpus_records.tar.gz and .svg files.
3. Here: `python benchmarks/two_gpus.py --report-only --resume benchmarks/results/two_gpus_h200.json`
   rewrites the tables in benchmarks/results/; a screenshot the GPU machine could not make is made here
   from the records: `tar xzf two_gpus_records.tar.gz -C /tmp/r`, then
   `python screenshots/make_screenshots.py run-2xh200.svg --record /tmp/r/<run> --out FILE`.

    python benchmarks/two_gpus.py [--parts P,...] [--budget-s S] [--resume FILE] [--report-only] [--cpu]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

STORY = "qwen3-235b-a22b-thinking-4xh100"
SLICE_CONFIG = "nf4-none"  # rehearsal_accuracy.CONFIGS: NF4 experts, no offload
DEPTHS = {"gpu": (1, 2, 4), "cpu": (1, 2)}  # the last: the slice evaluated and the depth predicted
TINY_STEPS = {"gpu": 40, "cpu": 3}
TINY_EVAL_PER_TENANT = {"gpu": 40, "cpu": 2}  # the tiny profile's held-out examples a tenant
TWO_NODE_STEPS = {"gpu": 6, "cpu": 2}
BUDGET = {"gpu": 500, "cpu": 300}  # seconds: one device command (10 minutes) less start-up and writing
FAULT_KILL = ("sigkill-rank1-of-2",)
FAULTS_MORE = ("hang-rank1-of-2", "oom-rank1-of-2")
RECORDS = "two_gpus_records.tar.gz"
LOG_TAIL_BYTES = 2 * 2**20  # of a record's output.log in the tarball
KEPT = {"run.json", "plan.json", "output.log", "report.json", "report.md", "rehearsal.json"}
PARTS = ("slice", "slice-eval", "tiny", "screenshot", "faults", "two-nodes", "rehearsal", "load-share")
CPU_PARTS = ("slice", "slice-eval", "tiny", "screenshot", "faults", "two-nodes")


@dataclass
class Ctx:
    """One call of the script: where it works, its deadline, and every unit's result so far."""

    gpu: bool
    runs: Path
    out: Path
    cache: Path
    deadline: float
    results: dict[str, Any]

    @property
    def mode(self) -> str:
        return "gpu" if self.gpu else "cpu"

    @property
    def depths(self) -> tuple[int, ...]:
        return tuple(self.results["depths"])

    def left(self) -> float:
        return self.deadline - time.time()

    def done(self, unit: str) -> dict[str, Any] | None:
        """A unit's result if it finished (in this call or the resumed one)."""
        return unit_result(self.results, unit)


class UnitFailed(RuntimeError):
    """A unit ran but did not produce its figures; the message says why (one line)."""


@dataclass(frozen=True)
class Unit:
    name: str
    part: str
    gpu_s: float  # estimated seconds on two H200s (guesses from one-GPU runs)
    cpu_s: float | None  # on 2 CPU cores; None: needs GPUs
    run: Callable[[Ctx], dict[str, Any]] = field(repr=False)


# --- helpers: processes ------------------------------------------------------------------------------
def child_env(ctx: Ctx, **extra: str) -> dict[str, str]:
    env = {**os.environ, "COCKPIT_CACHE": str(ctx.cache), "PYTHONUNBUFFERED": "1", **extra}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def end_runs(folder: Path) -> None:
    """Kill what the runs under `folder` left running (their supervisors, launch groups and joined
    nodes, by the ids their records hold): a unit cut short must not hold the GPUs for the next."""
    for manifest in folder.rglob("run.json"):
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(manifest.read_text())
            pids = [data.get("supervisor_pid")]
            for node in manifest.parent.glob("events/supervisor-node*.jsonl"):
                pids += [json.loads(line).get("pid") for line in node.read_text().splitlines()[:1]]
            for pid in filter(None, pids):
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)
            if data.get("trainer_pgid"):
                with contextlib.suppress(OSError):
                    os.killpg(int(data["trainer_pgid"]), signal.SIGKILL)


def run_script(ctx: Ctx, unit: str, argv: list[str], **env: str) -> Path:
    """`python ARGV` from the repository with its $OUT and temporary files in this unit's folder, cut at
    the deadline; returns its $OUT. UnitFailed when it fails or is cut."""
    work = ctx.runs / unit
    out, tmp = work / "out", work / "tmp"
    for d in (out, tmp):
        d.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"
    with open(log, "ab") as f:
        proc = subprocess.Popen(
            [sys.executable, *argv],
            cwd=ROOT,
            env=child_env(ctx, OUT=str(out), TMPDIR=str(tmp), **env),
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=max(1.0, ctx.left()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            end_runs(tmp)
            raise UnitFailed(f"cut at the budget's end: {tail(log)}") from None
    end_runs(tmp)
    if code != 0:
        raise UnitFailed(f"exit {code}: {tail(log)}")
    return out


def tail(path: Path, lines: int = 4) -> str:
    text = path.read_text(errors="replace").strip().splitlines() if path.is_file() else []
    return " | ".join(line[-200:] for line in text[-lines:])


# --- helpers: what a record says ---------------------------------------------------------------------
def rank_check(run_dir: Path) -> dict[str, Any]:
    """Events of each rank in the record (trainer and guard files), and the GPUs the sampler saw."""
    from cockpit.record import read_events

    ranks: dict[int, dict[str, Any]] = {}
    gpus = 0
    for e in read_events(run_dir):
        if e["kind"] == "telemetry_start":
            gpus = max(gpus, len(e.get("gpus") or []))
        if e.get("rank") is None:
            continue
        r = ranks.setdefault(int(e["rank"]), {"events": 0, "steps": 0, "host": None, "local_rank": None})
        r["events"] += 1
        r["steps"] += e["kind"] == "step"
        if e["kind"] == "rank_start":
            r.update(host=e.get("host"), local_rank=e.get("local_rank"))
    audit = next((e for e in read_events(run_dir, "audit") if e.get("rank", 0) == 0), {})
    return {
        "ranks": {str(k): v for k, v in sorted(ranks.items())},
        "telemetry_gpus": gpus,
        "zero_stage": (audit.get("applied") or {}).get("zero_stage"),
    }


def check_line(name: str, check: dict[str, Any]) -> str:
    ranks = ", ".join(
        f"rank {r}: {v['events']} events ({v['steps']} steps, local index {v['local_rank']})"
        for r, v in check["ranks"].items()
    )
    return (
        f"{name}: {ranks or 'no rank events'}; the sampler saw {check['telemetry_gpus']} GPU(s); "
        f"ZeRO stage applied: {check['zero_stage']}"
    )


def nvml_peaks(events: list[dict[str, Any]], t0: float, t1: float) -> dict[str, float]:
    """Each GPU's largest NVML `gpu_mem_used_mib` between t0 and t1."""
    peaks: dict[str, float] = {}
    for e in events:
        if e["kind"] != "telemetry" or not t0 <= e["t"] <= t1:
            continue
        for i, used in enumerate(e.get("gpu_mem_used_mib") or []):
            if used is not None:
                peaks[str(i)] = max(peaks.get(str(i), 0.0), float(used))
    return peaks


def slice_figures(run_dir: Path, layers: int) -> dict[str, Any]:
    """The `layers`-layer depth of a bracketed record: per rank, and for the job."""
    from cockpit.record import read_events
    from cockpit.rehearse.measure import BEGIN, END, depth_measures

    events = read_events(run_dir)
    measure = next((m for m in reversed(depth_measures(events)) if m.layers == layers), None)
    if measure is None or not measure.complete:
        why = measure.message if measure else "not run"
        raise UnitFailed(f"depth {layers} not measured: {why}")
    t0 = max(e["t"] for e in events if e["kind"] == BEGIN and e["layers"] == layers)
    t1 = min((e["t"] for e in events if e["kind"] == END and e["t"] >= t0), default=time.time())
    inside = [e for e in events if t0 <= e["t"] <= t1]
    loaded = {int(e["rank"]): e for e in inside if e["kind"] == "loaded"}
    local = {int(e["rank"]): e.get("local_rank") for e in inside if e["kind"] == "rank_start"}
    per_rank = [
        {
            "rank": r,
            "local_rank": local.get(r, r),
            "load_s": (loaded.get(r) or {}).get("load_s"),
            "gpu_load_gib": measure.gpu_load_gib.get(r),
            "gpu_train_gib": measure.gpu_train_gib.get(r),
            "rss_load_gib": measure.rss_load_gib.get(r),
            "rss_train_gib": measure.rss_train_gib.get(r),
        }
        for r in range(measure.ranks)
    ]
    tps = measure.tokens_per_step / measure.step_s if measure.tokens_per_step and measure.step_s else None
    return {
        "layers": layers,
        "ranks": measure.ranks,
        "step_s": measure.step_s,
        "tokens_per_step": measure.tokens_per_step,
        "tokens_per_s": tps,
        "per_rank": per_rank,
        "nvml_peak_mib": nvml_peaks(events, t0, t1),
    }


def eval_facts(run_dir: Path) -> dict[str, Any]:
    """A run's evaluation: its duration, where its layers went (the log), each GPU's NVML peak meanwhile."""
    from cockpit.record import load_manifest, read_events

    events = read_events(run_dir)
    begin = next((e["t"] for e in events if e["kind"] == "eval_begin"), None)
    end = next((e["t"] for e in events if e["kind"] == "eval_end"), None)
    log = (run_dir / "output.log").read_text(errors="replace") if (run_dir / "output.log").is_file() else ""
    placements = sorted(set(re.findall(r"eval placement of [^:]*: (.*)", log)))
    evaluation = load_manifest(run_dir).get("evaluation") or {}
    return {
        "eval_s": round(end - begin, 1) if begin and end else None,
        "placement": placements,
        "nvml_peak_mib": nvml_peaks(events, begin, end) if begin and end else {},
        "status": evaluation.get("status"),
        "summary": evaluation.get("summary"),
    }


def pack_records(ctx: Ctx) -> None:
    """The records of this call's and the resumed call's units still here, as one tarball in $OUT:
    manifest, plan, events, the tail of the log, report and prediction; no checkpoints or adapters."""
    dirs = []
    for entry in ctx.results["units"].values():
        run_dir = (entry.get("result") or {}).get("run_dir")
        if run_dir and Path(run_dir, "run.json").is_file():
            dirs.append(Path(run_dir))
    if not dirs:
        return
    with tarfile.open(ctx.out / RECORDS, "w:gz") as tar:
        for run_dir in dirs:
            for path in sorted(run_dir.rglob("*")):
                rel = path.relative_to(run_dir)
                if not path.is_file() or not (str(rel) in KEPT or rel.parts[0] in ("events", "stacks")):
                    continue
                data = path.read_bytes()[-LOG_TAIL_BYTES:] if path.name == "output.log" else path.read_bytes()
                info = tarfile.TarInfo(f"{run_dir.name}/{rel}")
                info.size, info.mtime = len(data), int(path.stat().st_mtime)
                tar.addfile(info, io.BytesIO(data))


# --- the units -----------------------------------------------------------------------------------------
def slice_run(ctx: Ctx, ranks: int, depths: tuple[int, ...]) -> dict[str, Any]:
    from benchmarks.rehearsal_accuracy import rehearse

    profile = STORY if ctx.gpu else "tiny-cpu"
    env = {"CUDA_VISIBLE_DEVICES": "0"} if ctx.gpu and ranks == 1 else None
    runs = ctx.runs / f"slice-{ranks}"
    result = rehearse(SLICE_CONFIG, profile, ctx.gpu, runs, ctx.deadline, depths, ranks, env, sampler=True)
    run_dir = Path(result["run_dir"])
    result["check"] = rank_check(run_dir)
    print(check_line(f"slice-{ranks} record {run_dir.name}", result["check"]), flush=True)
    result["figures"] = slice_figures(run_dir, depths[-1])
    return result


def eval_run(ctx: Ctx, gpus: int) -> dict[str, Any]:
    argv = ["benchmarks/eval_placement.py", "--run", "--layers", str(ctx.depths[-1])]
    out = run_script(ctx, f"eval-{gpus}", argv, CUDA_VISIBLE_DEVICES=",".join(map(str, range(gpus))))
    result = json.loads((out / "eval_placement_run.json").read_text())
    spans = sorted(set(result.get("layer_devices") or [0]))
    print(f"eval-{gpus}: decoder layers on GPU(s) {spans}; load {result['load_s']} s", flush=True)
    if gpus > 1 and len(spans) < 2:
        raise UnitFailed(f"evaluation placed every layer on one GPU ({spans}): a deeper slice is needed")
    return result


def prebuild(ctx: Ctx) -> dict[str, Any]:
    """DeepSpeed's CPU Adam built once, ahead, with every core (the tiny profile and offload need it)."""
    code = (
        "from cockpit import dsops; s = dsops.cpu_adam_state(); print(s.describe);"
        "s.built or dsops.build_cpu_adam(); print(dsops.cpu_adam_state().describe)"
    )
    out = run_script(ctx, "prebuild", ["-c", code])
    return {"state": tail(out.parent / "log.txt", 1)}


def tiny_run(ctx: Ctx, ranks: int) -> dict[str, Any]:
    from benchmarks.two_nodes import figures
    from devtools.faults import start_detached, wait_end

    runs = ctx.runs / f"tiny-{ranks}"
    gpus = ranks if ctx.gpu else (2 if ranks == 2 else 0)  # on the CPU: hardware.gpus=2 is two CPU ranks
    sets = [
        f"hardware.gpus={gpus}",
        "eval.enabled=true",
        "training.save_steps=0",
        "training.stall_timeout_s=300",
        f"data.eval_examples_per_tenant={TINY_EVAL_PER_TENANT[ctx.mode]}",
    ]
    more = [a for kv in sets for a in ("--set", kv)]
    env = {"CUDA_VISIBLE_DEVICES": "0"} if ctx.gpu and ranks == 1 else {}
    try:
        run_dir = start_detached(runs, ctx.cache, TINY_STEPS[ctx.mode], "--profile", "tiny-cpu", *more, **env)
    except AssertionError as exc:
        raise UnitFailed(f"cockpit run refused: {str(exc).strip()[-300:]}") from None
    try:
        manifest = wait_end(run_dir, timeout=max(1.0, ctx.left()))
    except TimeoutError:
        end_runs(runs)
        raise UnitFailed("cut at the budget's end") from None
    result = {"run_dir": str(run_dir), "status": manifest["status"], "diagnosis": manifest.get("diagnosis")}
    result["check"] = rank_check(run_dir)
    print(check_line(f"tiny-{ranks} record {run_dir.name}", result["check"]), flush=True)
    result["figures"] = figures(run_dir)
    result["eval"] = eval_facts(run_dir)
    if manifest["status"] != "finished":
        raise UnitFailed(f"{manifest['status']}: {manifest.get('diagnosis')}")
    return result


def screenshots(ctx: Ctx) -> dict[str, Any]:
    if not all(importlib.util.find_spec(m) for m in ("textual", "textual_plotext")):
        raise UnitFailed(
            f"textual or textual-plotext is not installed here: the records are in {RECORDS}; shoot them "
            "with `python screenshots/make_screenshots.py run-2xh200.svg --record RUN --out FILE`"
        )
    shots = {}
    for unit in ("slice-2", "tiny-2"):
        result = ctx.done(unit)
        if not result or not Path(result["run_dir"]).is_dir():
            continue
        path = ctx.out / f"two_gpus_{unit}.svg"
        argv = ["screenshots/make_screenshots.py", "run-2xh200.svg", "--record", result["run_dir"]]
        run_script(ctx, f"screenshot-{unit}", [*argv, "--out", str(path)])
        shots[unit] = {"file": path.name, "run": Path(result["run_dir"]).name}
    if not shots:
        raise UnitFailed("no two-rank record of this machine to show (units slice-2, tiny-2)")
    return shots


def faults(ctx: Ctx, names: tuple[str, ...], unit: str) -> dict[str, Any]:
    out = run_script(ctx, unit, ["benchmarks/faults.py", "--only", *names])
    rows = json.loads((out / "faults.json").read_text())
    named = [r for r in rows if "rank 1" in (r["diagnosis"] or "")]
    if len(named) < len(rows):
        raise UnitFailed(f"rank 1 not named: {[r['diagnosis'] for r in rows]}")
    return {"rows": rows}


def two_nodes(ctx: Ctx) -> dict[str, Any]:
    argv = ["benchmarks/two_nodes.py", "--gpus-per-node", "1", "--steps", str(TWO_NODE_STEPS[ctx.mode])]
    out = run_script(ctx, "two-nodes", argv)
    name = "two_nodes_gpu" if ctx.gpu else "two_nodes_cpu"
    return json.loads((out / f"{name}.json").read_text())


def rehearsal(ctx: Ctx, config: str) -> dict[str, Any]:
    from benchmarks.rehearsal_accuracy import rehearse

    profile = STORY if ctx.gpu else "tiny-cpu"
    runs = ctx.runs / f"rehearsal-{config}"
    result = rehearse(config, profile, ctx.gpu, runs, ctx.deadline, ctx.depths, ranks=2)
    if not any(m["layers"] == ctx.depths[-1] and m["status"] == "ok" for m in result["measures"]):
        raise UnitFailed(f"depth {ctx.depths[-1]} not measured: {[m['message'] for m in result['measures']]}")
    return result


def load_share(ctx: Ctx) -> dict[str, Any]:
    argv = ["benchmarks/load_share.py", "--repeats", "2" if ctx.gpu else "1"]
    if ctx.gpu:
        argv += ["--gpus", "2", "--profile", STORY, "--layers", str(ctx.depths[-1])]
    out = run_script(ctx, "load-share", argv)
    return json.loads((out / f"load_share_{ctx.mode}.json").read_text())


# Estimates on two H200s: from the one-GPU runs of rehearsal_accuracy.py and step_speed.py (a depth's
# launch about 25 s, most of it imports and engine set-up) and this script's CPU smoke test; not yet
# measured on two GPUs.
UNITS = (
    Unit("slice-2", "slice", 100, 80, lambda c: slice_run(c, 2, c.depths)),
    Unit("slice-1", "slice", 40, 35, lambda c: slice_run(c, 1, c.depths[-1:])),
    Unit("eval-2", "slice-eval", 60, None, lambda c: eval_run(c, 2)),
    Unit("eval-1", "slice-eval", 50, None, lambda c: eval_run(c, 1)),
    Unit("prebuild", "", 70, 15, prebuild),  # before the first unit that needs CPU Adam
    Unit("tiny-2", "tiny", 130, 100, lambda c: tiny_run(c, 2)),
    Unit("screenshot", "screenshot", 30, 25, screenshots),
    Unit("fault-kill", "faults", 50, 50, lambda c: faults(c, FAULT_KILL, "fault-kill")),
    Unit("two-nodes", "two-nodes", 120, 95, two_nodes),
    Unit("rehearsal-nf4-offload", "rehearsal", 110, 90, lambda c: rehearsal(c, "nf4-offload")),
    Unit("rehearsal-bf16-none", "rehearsal", 100, 90, lambda c: rehearsal(c, "bf16-none")),
    Unit("rehearsal-bf16-offload", "rehearsal", 160, 90, lambda c: rehearsal(c, "bf16-offload")),
    Unit("load-share", "load-share", 150, 120, load_share),
    Unit("tiny-1", "tiny", 90, 80, lambda c: tiny_run(c, 1)),
    Unit("faults-more", "faults", 80, 90, lambda c: faults(c, FAULTS_MORE, "faults-more")),
)
NEEDS_CPU_ADAM = {"tiny", "faults", "two-nodes", "rehearsal", "load-share"}


def selected(parts: str, gpu: bool) -> list[Unit]:
    """The units `--parts` names (parts or units), in their order; `prebuild` before the first that
    needs DeepSpeed's CPU Adam. ValueError on an unknown name."""
    names = [p.strip() for p in parts.split(",") if p.strip()] or list(PARTS if gpu else CPU_PARTS)
    known = set(PARTS) | {u.name for u in UNITS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"--parts: unknown {', '.join(unknown)} (parts: {', '.join(PARTS)}; or unit names)")
    if "rehearsal" in names and "slice-2" not in names:
        names.append("slice-2")  # the rehearsal's nf4-none configuration is the slice's own run
    chosen = [u for u in UNITS if u.part in names or u.name in names]
    if any(u.part in NEEDS_CPU_ADAM for u in chosen):
        chosen = [u for u in UNITS if u in chosen or u.name == "prebuild"]
    return chosen


# --- the report ----------------------------------------------------------------------------------------
def num(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def where(mode: str, ranks: int) -> str:
    word = "GPU" if mode == "gpu" else "CPU rank"
    return f"{ranks} {word}{'s' if ranks > 1 else ''}"


def slice_table(results: dict[str, Any]) -> str:
    mode = results["mode"]
    lines = [
        "| run | rank (GPU) | load s | GPU peak at load GiB | GPU peak in training GiB | NVML peak MiB | "
        "host RSS in training GiB | step s | tokens/s (job) | tokens/s a GPU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for unit in ("slice-2", "slice-1"):
        f = (unit_result(results, unit) or {}).get("figures")
        if not f:
            continue
        for r in f["per_rank"]:
            gpu = str(r["local_rank"])
            per_gpu = f["tokens_per_s"] / f["ranks"] if f["tokens_per_s"] else None
            lines.append(
                f"| {where(mode, f['ranks'])} | {r['rank']} ({gpu}) | {num(r['load_s'], '.2f')} | "
                f"{num(r['gpu_load_gib'], '.2f')} | {num(r['gpu_train_gib'], '.2f')} | "
                f"{num(f['nvml_peak_mib'].get(gpu), ',.0f')} | {num(r['rss_train_gib'], '.2f')} | "
                f"{num(f['step_s'], '.3f')} | {num(f['tokens_per_s'], ',.0f')} | {num(per_gpu, ',.0f')} |"
            )
    return "\n".join(lines) if len(lines) > 2 else ""


def eval_table(results: dict[str, Any]) -> str:
    gib = 2**30
    lines = [
        "| run | GPU | layers | planned total GiB | load peak GiB | scoring peak GiB | thinking peak GiB | "
        "load s | scoring tokens/s | thinking new tokens/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for unit in ("eval-2", "eval-1"):
        r = unit_result(results, unit)
        if not r:
            continue
        placement = r.get("placement") or {}
        for i in range(r["gpus"]):
            key = str(i)
            layers = (placement.get("layers_per_device") or {}).get(key, "all" if r["gpus"] == 1 else "-")
            planned = (placement.get("bytes_per_device") or {}).get(key)
            lines.append(
                f"| {r['gpus']} x {r['device']} | cuda:{i} | {layers} | "
                f"{num(planned / gib if planned else None, '.1f')} | {r['load_peak_bytes'][i] / gib:.1f} | "
                f"{r['score']['peak_bytes'][i] / gib:.1f} | {r['think']['peak_bytes'][i] / gib:.1f} | "
                f"{r['load_s']} | {r['score']['tokens_per_s']:,.0f} | {r['think']['tokens_per_s']:,.0f} |"
            )
    return "\n".join(lines) if len(lines) > 2 else ""


def tiny_table(results: dict[str, Any]) -> str:
    from benchmarks.two_nodes import table

    rows = {}
    for unit in ("tiny-2", "tiny-1"):
        r = unit_result(results, unit)
        if r:
            rows[where(results["mode"], len(r["figures"]["ranks"]))] = r["figures"]
    if not rows:
        return ""
    out = [table(rows), ""]
    for unit in ("tiny-2", "tiny-1"):
        r = unit_result(results, unit)
        if r:
            e = r["eval"]
            peaks = ", ".join(f"GPU {k} {v:,.0f} MiB" for k, v in sorted(e["nvml_peak_mib"].items()))
            out.append(
                f"- {unit}: evaluation {e['status']} in {num(e['eval_s'], '.1f')} s; placement: "
                f"{'; '.join(e['placement']) or 'none (one device)'}; NVML peak while evaluating: "
                f"{peaks or '-'}; {e['summary']}"
            )
    return "\n".join(out)


def rehearsal_table(results: dict[str, Any]) -> str:
    from benchmarks.rehearsal_accuracy import CONFIGS, accumulation, models, ran_with, table

    gpu = results["mode"] == "gpu"
    profile = STORY if gpu else "tiny-cpu"
    if len(results["depths"]) < 3:  # nothing beyond the fitted depths 1 and 2 to check
        return ""
    found = {}
    for config in CONFIGS:
        r = unit_result(results, "slice-2" if config == SLICE_CONFIG else f"rehearsal-{config}")
        if r:
            found[config] = {k: r[k] for k in ("run_dir", "overrides", "measures") if k in r}
    if not found:
        return ""
    ran = {c: ran_with(found[c], c, gpu, 2) for c in found}
    batches = "; ".join(sorted({accumulation(profile, o) for o in ran.values()}))
    terms = {c: models(c, profile, gpu, ranks=2, overrides=o) for c, o in ran.items()}
    note = (
        f"Profile {profile}, random weights, depths {', '.join(map(str, results['depths']))}, 8 steps a "
        f"depth, {batches}, {where(results['mode'], 2)} under ZeRO-3 (DeepSpeed's runner); "
        "the models fitted over depths 1 and 2 with the gathered layers and offload copies of two ranks."
    )
    return table(found, note, terms).replace("# Rehearsal accuracy", "### Rehearsal accuracy", 1)


def unit_result(results: dict[str, Any], unit: str) -> dict[str, Any] | None:
    entry = results["units"].get(unit) or {}
    return entry.get("result") if entry.get("status") == "ok" else None


def report(results: dict[str, Any]) -> str:
    """The whole Markdown report from the results (pure: no run, no GPU)."""
    from benchmarks.faults import table as faults_table
    from benchmarks.load_share import table as load_table
    from benchmarks.two_nodes import table as nodes_table

    mode = results["mode"]
    machine = results.get("machine") or {}
    gpus = machine.get("gpus") or []
    here = f"{len(gpus)} x {gpus[0]['name']}" if gpus else f"CPU ({machine.get('cpus')} cores)"
    versions = ", ".join(f"{k} {v}" for k, v in machine.get("versions", {}).items())
    title = "Two H200s" if mode == "gpu" else "Two CPU ranks (smoke test of benchmarks/two_gpus.py)"
    out = [
        f"# {title}: issues 12 and 13 on two devices",
        "",
        f"Machine: {here}; versions: {versions}.",
        "",
        "| unit | part | status | seconds | note |",
        "|---|---|---|---|---|",
    ]
    order = {u.name: i for i, u in enumerate(UNITS)}
    for name, e in sorted(results["units"].items(), key=lambda item: order.get(item[0], len(order))):
        note = (e.get("why") or "").replace("|", "/")
        seconds = num(e.get("seconds"), ".0f")
        out.append(f"| {name} | {e.get('part') or '-'} | {e['status']} | {seconds} | {note} |")
    out += [
        "",
        "Calls: " + "; ".join(f"`{' '.join(c['argv'])}` ({c['seconds']:.0f} s)" for c in results["calls"]),
    ]
    layers = results["depths"][-1]
    model = "The story's architecture" if mode == "gpu" else "The tiny profile's architecture"
    sections: list[tuple[str, str]] = [
        (
            f"{model}, {layers}-layer slice, NF4 experts, no offload: trained under ZeRO-3",
            slice_table(results),
        ),
        (
            f"The {layers}-layer slice evaluated (`eval_placement.py --run --layers {layers}`)",
            eval_table(results),
        ),
        ("The tiny profile: trained and evaluated (`cockpit run`)", tiny_table(results)),
    ]
    checks = [
        check_line(f"{u} ({Path(r['run_dir']).name})", r["check"])
        for u in ("slice-2", "slice-1", "tiny-2", "tiny-1")
        if (r := unit_result(results, u)) and r.get("check")
    ]
    shots = unit_result(results, "screenshot") or {}
    kill = (unit_result(results, "fault-kill") or {}).get("rows", [])
    more = (unit_result(results, "faults-more") or {}).get("rows", [])
    nodes = unit_result(results, "two-nodes")
    share = unit_result(results, "load-share")
    pictures = [f"- `{s['file']}`: the app over {u}'s record {s['run']}" for u, s in shots.items()]
    sections += [
        ("Records: events of each rank", "\n".join(f"- {c}" for c in checks)),
        ("Screenshots", "\n".join(pictures)),
        ("Faults: rank 1 of two (`faults.py`)", faults_table(kill + more) if kill + more else ""),
        (
            "Two nodes simulated on one machine (`two_nodes.py --gpus-per-node 1`)",
            nodes_table(nodes["jobs"]) if nodes else "",
        ),
        ("Rehearsal on two devices (issue 12)", rehearsal_table(results)),
        (
            "Each rank loads its share (`load_share.py`)",
            load_table(share["jobs"], mode == "gpu") if share else "",
        ),
    ]
    for heading, body in sections:
        if body:
            out += ["", f"## {heading}", "", body]
    out += [
        "",
        "tokens/s: the trainer's count of input tokens over all ranks a step (HF's gathered "
        "`num_input_tokens_seen`) over the median step time; a GPU's share is the job's over its ranks.",
    ]
    return "\n".join(out) + "\n"


def write(ctx: Ctx) -> None:
    name = "two_gpus_h200" if ctx.gpu else "two_gpus_cpu"
    (ctx.out / f"{name}.json").write_text(json.dumps(ctx.results, indent=1, default=str))
    (ctx.out / f"{name}.md").write_text(report(ctx.results))


# --- the call ------------------------------------------------------------------------------------------
def machine_facts() -> dict[str, Any]:
    """GPUs as NVML sees them (no CUDA context is made here: the units' figures are the ranks' own)."""
    from cockpit.hostinfo import gpu_inventory

    versions = {}
    for package in ("torch", "transformers", "deepspeed", "bitsandbytes", "peft", "accelerate"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package)
    return {"gpus": gpu_inventory(), "cpus": os.cpu_count(), "versions": versions}


def run_units(ctx: Ctx, units: list[Unit]) -> None:
    for unit in units:
        entry = ctx.results["units"].get(unit.name) or {}
        if entry.get("status") == "ok":
            print(f"[two_gpus] {unit.name}: done in the resumed results", flush=True)
            continue
        estimate = unit.gpu_s if ctx.gpu else unit.cpu_s
        record: dict[str, Any] = {"part": unit.part}
        if estimate is None:
            record.update(status="skipped", why="needs GPUs")
        elif estimate > ctx.left():
            record.update(
                status="skipped", why=f"budget: needs about {estimate:.0f} s, {ctx.left():.0f} s left"
            )
        if record.get("status"):
            print(f"[two_gpus] {unit.name}: skipped ({record['why']})", flush=True)
            ctx.results["units"][unit.name] = record
            write(ctx)
            continue
        print(f"[two_gpus] {unit.name}: start (about {estimate:.0f} s, {ctx.left():.0f} s left)", flush=True)
        t0 = time.time()
        try:
            record.update(status="ok", result=unit.run(ctx))
        except (UnitFailed, TimeoutError, OSError, ValueError, KeyError) as exc:
            record.update(status="failed", why=f"{type(exc).__name__}: {exc}"[:600])
        record["seconds"] = round(time.time() - t0, 1)
        print(f"[two_gpus] {unit.name}: {record['status']} in {record['seconds']:.0f} s "
              f"{record.get('why', '')}", flush=True)  # fmt: skip
        ctx.results["units"][unit.name] = record
        pack_records(ctx)
        write(ctx)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--parts", default="", help=f"parts or units, comma-separated (parts: {', '.join(PARTS)})"
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        help=f"seconds for the units (default {BUDGET['gpu']}, --cpu {BUDGET['cpu']})",
    )
    parser.add_argument("--cpu", action="store_true", help="smoke test: 2 CPU ranks, the tiny profile")
    parser.add_argument(
        "--resume", type=Path, help="a previous call's two_gpus_*.json: its finished units stay"
    )
    parser.add_argument("--report-only", action="store_true", help="with --resume: write the tables again")
    parser.add_argument("--runs-dir", type=Path, default=Path("/tmp/two-gpus-runs"), help="where the runs go")
    args = parser.parse_args(argv)
    out = Path(os.environ.get("OUT") or ROOT / "benchmarks" / "results")
    out.mkdir(parents=True, exist_ok=True)
    try:
        results = json.loads(args.resume.read_text()) if args.resume else None
    except (OSError, ValueError) as exc:
        print(f"two_gpus: --resume {args.resume}: {exc}", file=sys.stderr)
        return 2
    if args.report_only:
        if results is None:
            print("two_gpus: --report-only needs --resume FILE", file=sys.stderr)
            return 2
        ctx = Ctx(results["mode"] == "gpu", args.runs_dir, out, Path(), 0.0, results)
        write(ctx)
        print(report(results))
        return 0
    gpu = not args.cpu
    machine = machine_facts()
    if gpu and len(machine["gpus"]) < 2:
        print(f"two_gpus: {len(machine['gpus'])} GPU(s) here, two needed (--cpu: a smoke test on CPU ranks)")
        return 2
    try:
        units = selected(args.parts, gpu)
    except ValueError as exc:
        print(f"two_gpus: {exc}", file=sys.stderr)
        return 2
    mode = "gpu" if gpu else "cpu"
    if results is not None and results.get("mode") != mode:
        print(
            f"two_gpus: --resume {args.resume} was a {results.get('mode')} call, this one is {mode}",
            file=sys.stderr,
        )
        return 2
    results = results or {"mode": mode, "depths": list(DEPTHS[mode]), "units": {}, "calls": []}
    results["machine"] = machine
    call = {"argv": ["python", "benchmarks/two_gpus.py", *(argv if argv is not None else sys.argv[1:])]}
    results["calls"].append(call)
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    cache = Path(os.environ.get("COCKPIT_CACHE") or Path.home() / ".cache" / "cockpit")
    budget = args.budget_s if args.budget_s is not None else BUDGET[mode]
    t0 = time.time()
    ctx = Ctx(gpu, args.runs_dir, out, cache, t0 + budget, results)
    gpus = ", ".join(g.get("name", "?") for g in machine["gpus"]) or "none"
    print(f"[two_gpus] GPUs: {gpus}; versions: {machine['versions']}", flush=True)
    print(f"[two_gpus] units: {', '.join(u.name for u in units)}; budget {budget:.0f} s", flush=True)
    call["seconds"] = 0.0
    run_units(ctx, units)
    call["seconds"] = round(time.time() - t0, 1)
    write(ctx)
    print(report(results))
    statuses = [results["units"][u.name]["status"] for u in units if u.name in results["units"]]
    return 1 if "failed" in statuses else 0


if __name__ == "__main__":
    sys.exit(main())
