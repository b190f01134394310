"""`plan.json` in a run directory: the plan a run started with, for the viewers to check the audit against."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from cockpit.profiles import Profile

PLAN_FILE = "plan.json"


def save_plan(run_dir: Path, profile: Profile) -> Path:
    """Plan the profile on this machine and write it beside run.json. A plan that cannot be made is written
    as `{"error": ...}`: planning never stops a run."""
    from cockpit.plan.planner import build_plan

    try:
        data: dict[str, Any] = build_plan(profile).to_dict()
    except Exception as exc:  # the plan is advice: a run must start even if its config.json is odd
        data = {"plan_version": 1, "error": f"{type(exc).__name__}: {exc}"}
    path = Path(run_dir) / PLAN_FILE
    fd, tmp = tempfile.mkstemp(prefix=".plan.json.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_plan(run_dir: Path) -> dict[str, Any] | None:
    """The run's plan, or None when it has none (older runs) or it could not be made."""
    try:
        data = json.loads((Path(run_dir) / PLAN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return None if not isinstance(data, dict) or "error" in data else data
