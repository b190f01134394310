"""Creating, finding and listing run directories."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Any

from cockpit.hostinfo import host_facts, library_versions
from cockpit.plan import build_plan
from cockpit.plan.store import save_plan
from cockpit.profiles import Profile, profile_to_dict
from cockpit.record import RunPaths, load_manifest, write_manifest

DEFAULT_RUNS_DIR = Path("runs")
RUNS_DIR_ENV = "COCKPIT_RUNS_DIR"


def user_runs_dir() -> Path:
    """This user's own runs directory, the same from any working directory (`platformdirs`' data
    directory: ~/.local/share/cockpit/runs on Linux)."""
    from platformdirs import user_data_path

    return user_data_path("cockpit") / "runs"


def default_runs_dir() -> Path:
    """Where run records live unless told: `$COCKPIT_RUNS_DIR`, else `./runs` where that folder exists
    (a checkout's own), else the user's runs directory (`user_runs_dir`)."""
    if os.environ.get(RUNS_DIR_ENV):
        return Path(os.environ[RUNS_DIR_ENV])
    if DEFAULT_RUNS_DIR.is_dir():
        return DEFAULT_RUNS_DIR
    return user_runs_dir()


def runs_dir_problem(runs_dir: Path) -> str | None:
    """Why run records cannot live in `runs_dir`: it, or the nearest existing path above it (where it
    would be made), is not a folder; None when they can."""
    path = runs_dir.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    if path.is_dir():
        return None
    return "a file, not a folder" if path == runs_dir.absolute() else f"{path} is a file, not a folder"


def new_run_id(profile_name: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{profile_name}-{secrets.token_hex(2)}"


def create_run(
    runs_dir: Path,
    profile: Profile,
    profile_path: Path,
    argv: list[str],
    mode: str = "train",
    eval_args: list[str] | None = None,
    extra: dict[str, Any] | None = None,
    plan_for: Profile | None = None,
) -> Path:
    """A new run directory (owner-only permissions) with a `planned` manifest.

    `mode` is `train` (train, then evaluate), `eval` (evaluate base models only) or `rehearse` (the
    architecture sliced to a few depths, random weights; `extra` holds its `rehearsal` settings).
    `plan_for`: the profile whose plan goes into plan.json, when it is not the one that runs (a rehearsal
    runs on the GPUs at hand and is compared with the plan for the profile's own machine).
    """
    runs_dir.mkdir(parents=True, exist_ok=True)
    run_dir = runs_dir / new_run_id(profile.name)
    run_dir.mkdir(mode=0o700)
    os.chmod(run_dir, 0o700)  # mkdir's mode is masked by the umask
    paths = RunPaths(run_dir)
    for sub in (paths.events_dir, paths.control_dir):
        sub.mkdir(mode=0o700)
    write_manifest(
        run_dir,
        {
            "run_id": run_dir.name,
            "status": "planned",
            "mode": mode,
            "eval_args": eval_args or [],
            "profile_name": profile.name,
            "profile_path": str(profile_path.resolve()),
            "profile": profile_to_dict(profile),
            "argv": argv,
            "versions": library_versions(),
            "host": host_facts(),
            "created_at": time.time(),
            "started_at": None,
            "ended_at": None,
            "exit_code": None,
            "diagnosis": None,
            **(extra or {}),
        },
    )
    save_plan(run_dir, plan_or_error(plan_for or profile))
    return run_dir


def plan_or_error(profile: Profile) -> dict[str, Any]:
    """The profile planned on this machine, or `{"error": ...}`: planning never stops a run."""
    try:
        return build_plan(profile).to_dict()
    except Exception as exc:  # the plan is advice: a run must start even if its config.json is odd
        return {"plan_version": 1, "error": f"{type(exc).__name__}: {exc}"}


# What `latest` names: the newest run `cockpit run` trained or `cockpit eval` evaluated. Never an imported
# log (`cockpit import` makes one in the same folder) nor a rehearsal (`cockpit rehearse --show latest`
# asks for those); `cockpit compare` asks for the newest training run (`TRAINING`).
LATEST_MODES = ("train", "eval")
TRAINING = ("train",)
MODE_WORDS = {"train": "training run", "eval": "evaluation run", "rehearse": "rehearsal"}


def latest_run(runs_dir: Path, modes: tuple[str, ...] = LATEST_MODES) -> Path | None:
    """The newest run of one of `modes` (a record from before modes is a training run), if any."""
    for run_dir in reversed(list_run_dirs(runs_dir)):
        manifest = manifest_or_none(run_dir)
        if manifest is not None and manifest.get("mode", "train") in modes:
            return run_dir
    return None


def find_run(runs_dir: Path, ref: str, latest: tuple[str, ...] = LATEST_MODES) -> Path:
    """A run by path, by id, or by a unique prefix of its id; `latest` is the newest run of the modes
    `latest` names (`LATEST_MODES`: trained or evaluated, never an import). `LookupError` says why not,
    an empty `ref` included (it would be a prefix of every run)."""
    if not ref.strip():
        raise LookupError("RUN is empty: give a run id, a unique prefix of one, a path, or 'latest'")
    direct = Path(ref)
    if RunPaths(direct).manifest.is_file():
        return direct
    runs = list_run_dirs(runs_dir)
    if ref == "latest":
        found = latest_run(runs_dir, latest)
        if found is None:
            kinds = " or ".join(MODE_WORDS.get(m, m) for m in latest)
            raise LookupError(
                f"no {kinds} in {runs_dir} for 'latest' (imported logs and other runs go by id: `cockpit ls`)"
            )
        return found
    matches = [r for r in runs if r.name == ref] or [r for r in runs if r.name.startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise LookupError(f"no run {ref!r} in {runs_dir}")
    raise LookupError(f"{ref!r} matches {len(matches)} runs: {', '.join(m.name for m in matches[:5])}")


def latest_running(runs_dir: Path) -> Path | None:
    """The newest run whose manifest says it is running (or about to: `planned`), if any."""
    for run_dir in reversed(list_run_dirs(runs_dir)):
        manifest = manifest_or_none(run_dir)
        if manifest is not None and manifest.get("status") in ("running", "planned"):
            return run_dir
    return None


def list_run_dirs(runs_dir: Path, *, every_folder: bool = False) -> list[Path]:
    """Run directories, oldest first; with `every_folder`, every folder that is not hidden, also one with
    no `run.json` (`cockpit ls` shows it as such rather than hiding it)."""
    if not runs_dir.is_dir():
        return []
    found = (
        p
        for p in runs_dir.iterdir()
        if RunPaths(p).manifest.is_file() or (every_folder and p.is_dir() and not p.name.startswith("."))
    )
    return sorted(found, key=lambda p: p.name)


def manifest_or_none(run_dir: Path) -> dict[str, Any] | None:
    try:
        return load_manifest(run_dir)
    except (OSError, ValueError):
        return None
