"""A new user's first run on a busy machine: from `git clone` to the finished report, and where the time
goes before the first step.

Clones this repository's committed state into a temporary folder, makes a new virtual environment,
installs the project the README's way, and runs the README's main job (`cockpit run --no-ui`, the tiny CPU
profile) with empty caches (the torch extensions folder, `$XDG_CACHE_HOME`, the cockpit's cache), so
DeepSpeed compiles its ops as on a new machine, while other processes keep every core busy (`--busy N`,
default: one a core). `cockpit doctor` is asked before and after. A second, short run of the same job then
shows what a run costs before its first step once the environment is built.

Each phase before the first step comes from the run record: the launch, the trainer's start, each `phase`
event (every op compile is one of its own) and the first step.

Installing needs the package index. Without it, pass `--wheelhouse DIR` (the README's offline recipe),
or `--reuse-site-packages` to install only the project (`--no-deps`) over this interpreter's installed
dependencies: then the install row measures the project alone, and the output says so.

    python benchmarks/fresh_clone.py [--wheelhouse DIR | --reuse-site-packages] [--busy N] [--keep]

Writes fresh_clone.md and .json under $OUT (else benchmarks/results/).

`--suite` runs the test suite instead, as CI does (`.ci/run` in the clean clone, which makes its own
environment), with the cores kept busy the same way, and writes suite_busy.md and .json: the issue's "the
suite on a busy machine". It takes the whole machine for half an hour or more.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import site
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TORCH = "torch==2.13.0"  # the README's install command
BURN = "while True: pass"


def timed(argv: list[str], cwd: Path, env: dict[str, str], log: Path, check: bool = True) -> float:
    """Run `argv`, its output appended to `log`; seconds taken (SystemExit on failure, naming the log,
    when `check`)."""
    t0 = time.time()
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(argv)}\n")
        out.flush()
        code = subprocess.call(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    if code != 0 and check:
        raise SystemExit(f"fresh_clone: `{' '.join(argv)}` failed ({code}); see {log}")
    return time.time() - t0


def before_first_step(run_dir: Path) -> list[tuple[str, float, str]]:
    """(what, seconds, note) for each stretch of the run before its first step: from the launch to the
    trainer's start, its imports, then each phase (its message as the note), up to the first step."""
    from cockpit.record import read_events

    events = read_events(run_dir)
    launch = next(e["t"] for e in events if e["kind"] == "launch")
    marks: list[tuple[str, float, str]] = [("launcher", launch, "DeepSpeed's runner starts the rank")]
    for e in events:
        if e.get("rank", 0) != 0 or e["t"] < launch:
            continue
        if e["kind"] == "rank_start" and len(marks) == 1:
            marks.append(("imports", e["t"], "the trainer's libraries, before its first phase"))
        elif e["kind"] == "phase":
            marks.append((f"phase {e['phase']}", e["t"], str(e.get("message") or "")))
        elif e["kind"] == "step":
            marks.append(("first step", e["t"], ""))
            break
    return [(name, nxt[1] - t, note) for (name, t, note), nxt in itertools.pairwise(marks)]


def after_first_step(run_dir: Path) -> list[tuple[str, float, str]]:
    """Training and evaluation, from the record's milestones."""
    from cockpit.record import read_events

    events = read_events(run_dir)
    first = next((e["t"] for e in events if e["kind"] == "step"), None)
    train_end = next((e["t"] for e in events if e["kind"] == "train_end"), None)
    report = next((e["t"] for e in events if e["kind"] == "report"), None)
    rows: list[tuple[str, float, str]] = []
    if first is not None and train_end is not None:
        rows.append(("first step -> train_end", train_end - first, "training"))
    if train_end is not None and report is not None:
        rows.append(("train_end -> report", report - train_end, "evaluation and the report"))
    return rows


def doctor_line(py: str, clone: Path, env: dict[str, str], log: Path) -> str:
    """`cockpit doctor`'s CPU Adam line (its status and reason)."""
    with open(log, "a") as out:
        out.write("\n$ cockpit doctor --format json\n")
    done = subprocess.run(
        [py, "-m", "cockpit", "doctor", "--format", "json"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    with open(log, "a") as out:
        out.write(done.stdout + done.stderr)
    try:
        checks = json.loads(done.stdout)["checks"]
    except (json.JSONDecodeError, KeyError):
        return f"doctor gave no answer (exit {done.returncode})"
    line = next((c for c in checks if c["name"] == "DeepSpeed CPU Adam"), None)
    return f"{line['status']}: {line['reason']}" if line else "no CPU Adam line"


def table(rows: list[tuple[str, float, str]]) -> list[str]:
    def seconds(s: float) -> str:
        return f"{s:.0f}" if s >= 10 else f"{s:.1f}"

    return [
        "| step | seconds | note |",
        "|---|---|---|",
        *[f"| {n} | {seconds(s)} | {w} |" for n, s, w in rows],
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--wheelhouse", type=Path, help="install offline from this folder (--no-index)")
    how.add_argument(
        "--reuse-site-packages",
        action="store_true",
        help="install the project alone over this interpreter's dependencies (no package index here)",
    )
    parser.add_argument(
        "--busy",
        type=int,
        default=os.cpu_count() or 1,
        help="processes that keep cores busy (default: one a core)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--suite", action="store_true", help="run .ci/run in the clean clone instead")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="fresh-clone-"))
    log = work / "log.txt"
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "COCKPIT_RUNS_DIR", "TORCH_EXTENSIONS_DIR", "COCKPIT_CACHE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    # Empty caches, as on a new machine: the extensions folder is the environment's own under XDG_CACHE_HOME
    env.update(XDG_DATA_HOME=str(work / "data"), XDG_CACHE_HOME=str(work / "cache"))
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(args.busy)]
    try:
        result = suite(work, log, env) if args.suite else measure(args, work, log, env)
    finally:
        for proc in burners:
            proc.kill()
            proc.wait()
    text = suite_report(result, args.busy) if args.suite else report(result, args.busy)
    print(text)
    out = Path(os.environ.get("OUT") or ROOT / "benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    name = "suite_busy" if args.suite else "fresh_clone"
    (out / f"{name}.md").write_text(text)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.keep or not result["finished"]:
        print(f"kept {work} (its log.txt has every command's output)")
    else:
        subprocess.call(["rm", "-rf", str(work)])
    return 0 if result["finished"] else 1


def measure(args: argparse.Namespace, work: Path, log: Path, env: dict[str, str]) -> dict[str, Any]:
    """Clone, install, doctor, the default job, doctor again, a short second run: the figures."""
    from cockpit.record import load_manifest

    rows: list[tuple[str, float, str]] = []
    start = time.time()
    clone = work / "cockpit"
    rows.append(("git clone", timed(["git", "clone", "-q", str(ROOT), str(clone)], work, env, log), ""))
    base = Path(getattr(sys, "_base_executable", sys.executable))
    rows.append(("python -m venv", timed([str(base), "-m", "venv", ".venv"], clone, env, log), ""))
    py = str(clone / ".venv/bin/python")
    t0 = time.time()
    if args.reuse_site_packages:
        code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        purelib = Path(subprocess.check_output([py, "-c", code], text=True).strip())
        (purelib / "reused.pth").write_text("\n".join([str(clone), *site.getsitepackages()]) + "\n")
        install: list[str] | None = None
        note = "none timed: the clone and this interpreter's dependencies on the new venv's path"
    elif args.wheelhouse:
        install = [py, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(args.wheelhouse)]
        install += [TORCH, "-e", "."]
        note = f"offline from {args.wheelhouse}"
    else:
        install = [py, "-m", "pip", "install", "-q", TORCH, "-e", "."]
        note = "the README's command"
    rows.append(("pip install", timed(install, clone, env, log) if install else time.time() - t0, note))
    doctor_before = doctor_line(py, clone, env, log)
    runs = work / "data/cockpit/runs"
    whole = timed([py, "-m", "cockpit", "run", "--no-ui"], clone, env, log, check=False)
    rows.append(("cockpit run --no-ui (whole)", whole, "the README's main job"))
    first_run = sorted(runs.iterdir())[-1]
    setup = before_first_step(first_run)
    builds = sum(s for n, s, _ in setup if n == "phase build")
    rows.append(("before the first step", sum(s for _, s, _ in setup), "launch to the first step"))
    rows.append(("compiling DeepSpeed's ops", builds, "the build phases, one an op"))
    rows += after_first_step(first_run)
    rows.append(("clone to report", time.time() - start, ""))
    doctor_after = doctor_line(py, clone, env, log)
    # This checkout's own environment asked about the new one's build: another environment's commands
    built = next((work / "cache" / "torch_extensions").iterdir(), None)
    other_env = {**env, "TORCH_EXTENSIONS_DIR": str(built)} if built else env
    doctor_other = doctor_line(sys.executable, ROOT, other_env, log)
    short = ["--set", "training.max_steps=3", "--set", "eval.enabled=false"]
    second_s = timed([py, "-m", "cockpit", "run", "--no-ui", *short], clone, env, log, check=False)
    second_run = sorted(runs.iterdir())[-1]
    second = before_first_step(second_run)
    manifest = load_manifest(first_run)
    return {
        "machine": {"cpus": os.cpu_count(), "busy_processes": args.busy},
        "install": note,
        "rows": [{"step": n, "s": round(s, 1), "note": w} for n, s, w in rows],
        "before_first_step": [{"step": n, "s": round(s, 1), "note": w} for n, s, w in setup],
        "second_run": {
            "whole_s": round(second_s, 1),
            "before_first_step_s": round(sum(s for _, s, _ in second), 1),
            "before_first_step": [{"step": n, "s": round(s, 1), "note": w} for n, s, w in second],
            "diagnosis": load_manifest(second_run).get("diagnosis", ""),
        },
        "doctor": {"before": doctor_before, "after": doctor_after, "another_environment": doctor_other},
        "diagnosis": manifest.get("diagnosis", ""),
        "finished": manifest.get("status") == "finished",
    }


def suite(work: Path, log: Path, env: dict[str, str]) -> dict[str, Any]:
    """`.ci/run` in a clean clone, as CI runs it; its pytest summary and how long it took."""
    clone = work / "cockpit"
    timed(["git", "clone", "-q", str(ROOT), str(clone)], work, env, log)
    t0 = time.time()
    with open(log, "a") as out:
        code = subprocess.call(
            ["bash", ".ci/run"], cwd=clone, env={**env, "CI": "true"}, stdout=out, stderr=subprocess.STDOUT
        )
    summary = next(
        (
            line.strip("= \n")
            for line in reversed(log.read_text().splitlines())
            if " in " in line and "=" in line
        ),
        "",
    )
    return {"machine": {"cpus": os.cpu_count()}, "exit_code": code, "summary": summary, "s": time.time() - t0,
            "finished": code == 0}  # fmt: skip


def suite_report(result: dict[str, Any], busy: int) -> str:
    return (
        "# The test suite on a busy machine\n\n"
        f"`.ci/run` from a clean clone on {result['machine']['cpus']} CPU cores, {busy} other processes "
        f"keeping them busy (`{BURN}`): exit {result['exit_code']}, {result['summary']}, "
        f"{result['s'] / 60:.0f} min in all (its own venv and install included).\n\n"
        "Reproduce: `python benchmarks/fresh_clone.py --suite`.\n"
    )


def report(result: dict[str, Any], busy: int) -> str:
    """The Markdown the script prints and writes."""

    def rows(items: list[dict[str, Any]]) -> list[tuple[str, float, str]]:
        return [(r["step"], r["s"], r["note"]) for r in items]

    second = result["second_run"]
    lines = [
        "# From `git clone` to the report: a new user's first run on a busy machine",
        "",
        f"Machine: {result['machine']['cpus']} CPU cores, {busy} other processes keeping them busy "
        f"(`{BURN}`); install: {result['install']}; empty torch extensions folder and caches.",
        "",
        *table(rows(result["rows"])),
        "",
        "## Before the first step (the first run)",
        "",
        *table(rows(result["before_first_step"])),
        "",
        f"The run: {result['diagnosis']}",
        "",
        f"`cockpit doctor` before it: {result['doctor']['before']}",
        "",
        f"`cockpit doctor` after it: {result['doctor']['after']}",
        "",
        "`cockpit doctor` of this checkout's environment, pointed at the new environment's build "
        f"(`TORCH_EXTENSIONS_DIR`): {result['doctor']['another_environment']}",
        "",
        f"## Before the first step (a second run, {second['whole_s']:.0f} s in all, 3 steps)",
        "",
        *table(rows(second["before_first_step"])),
        "",
        f"The second run: {second['diagnosis']}",
        "",
        "Reproduce: `python benchmarks/fresh_clone.py` (`--reuse-site-packages` where there is no index).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
