"""A new user's first ten minutes: from `git clone` to the finished report, and where the time goes.

Clones this repository into a temporary folder, makes a new virtual environment, installs the project
the README's way, and runs the README's main job (`cockpit run --no-ui`, the tiny CPU profile) with an
empty torch extensions cache, so DeepSpeed compiles its CPU ops as on a new machine. Phase times come
from the run record (the trainer's `phase` events, the first step, `train_end`, `eval_end`, `report`).

Installing needs the package index. Without it, pass `--wheelhouse DIR` (the README's offline recipe),
or `--reuse-site-packages` to install only the project (`--no-deps`) over this interpreter's installed
dependencies: then the install row measures the project alone, and the output says so.

    python benchmarks/fresh_clone.py [--wheelhouse DIR | --reuse-site-packages] [--keep]

Writes fresh_clone.md and .json under $OUT (else benchmarks/results/).
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


def timed(argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> float:
    """Run `argv`, its output appended to `log`; seconds taken (SystemExit on failure, naming the log)."""
    t0 = time.time()
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(argv)}\n")
        out.flush()
        code = subprocess.call(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    if code != 0:
        raise SystemExit(f"fresh_clone: `{' '.join(argv)}` failed ({code}); see {log}")
    return time.time() - t0


def phases(run_dir: Path) -> dict[str, float]:
    """Seconds from the run's first event to each milestone of its record."""
    from cockpit.record import read_events

    events = read_events(run_dir)
    t0 = events[0]["t"]
    marks: dict[str, float] = {}
    for e in events:
        kind = e["kind"]
        key = f"phase {e['phase']}" if kind == "phase" else kind
        if kind == "step" and e.get("step") == 1:
            key = "first step"
        if key in (
            "phase setup",
            "phase build",
            "phase load",
            "first step",
            "train_end",
            "eval_end",
            "report",
        ):
            marks.setdefault(key, e["t"] - t0)
    return marks


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
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="fresh-clone-"))
    log = work / "log.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "COCKPIT_RUNS_DIR")}
    env.update(TORCH_EXTENSIONS_DIR=str(work / "torch_extensions"), XDG_DATA_HOME=str(work / "data"))
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
        note = (
            "none timed: the clone and this interpreter's dependencies on the new venv's path (no index here)"
        )
    elif args.wheelhouse:
        install = [py, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(args.wheelhouse)]
        install += [TORCH, "-e", "."]
        note = f"offline from {args.wheelhouse}"
    else:
        install = [py, "-m", "pip", "install", "-q", TORCH, "-e", "."]
        note = "the README's command, from the package index"
    seconds = timed(install, clone, env, log) if install else time.time() - t0
    rows.append(("pip install", seconds, note))
    t_run = time.time()
    run = [py, "-m", "cockpit", "run", "--no-ui"]
    rows.append(("cockpit run --no-ui (whole)", timed(run, clone, env, log), "the README's main job"))
    run_dirs = sorted((work / "data/cockpit/runs").iterdir())
    marks = phases(run_dirs[-1])
    launch = marks.get("phase setup", 0.0)
    seen = sorted(marks, key=lambda m: marks[m])  # the milestones in the order they came
    parts: list[tuple[str, float, str]] = [
        ("  until the trainer starts", launch, "supervisor, launcher, imports")
    ]
    for a, b in itertools.pairwise(seen):
        parts.append(
            (f"  {a} -> {b}", marks[b] - marks[a], "DeepSpeed CPU ops compiled" if a == "phase build" else "")
        )
    rows += parts
    total = time.time() - start
    rows.append(("clone to report", total, f"run {time.time() - t_run:.0f} s of it"))
    from cockpit.record import load_manifest

    diagnosis = load_manifest(run_dirs[-1]).get("diagnosis", "")
    lines = [
        "# From `git clone` to the report (a new user's first run)",
        "",
        f"Machine: {os.cpu_count()} CPU cores; install: {note}.",
        "",
        "| step | seconds | note |",
        "|---|---|---|",
        *[f"| {name} | {sec:.0f} | {what} |" for name, sec, what in rows],
        "",
        f"The run: {diagnosis}",
        "",
        "Reproduce: `python benchmarks/fresh_clone.py` (`--reuse-site-packages` where there is no index).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(os.environ.get("OUT") or ROOT / "benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "fresh_clone.md").write_text(text)
    data: dict[str, Any] = {"rows": [{"step": n, "s": s, "note": w} for n, s, w in rows], "install": note}
    (out / "fresh_clone.json").write_text(json.dumps(data, indent=1))
    if not args.keep:
        subprocess.call(["rm", "-rf", str(work)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
