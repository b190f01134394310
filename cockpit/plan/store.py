"""`plan.json` in a run directory: the plan a run started with, for the viewers to check the audit against.

Plain file I/O: whoever wants a fresh plan builds it (`cockpit.plan.build_plan`) and passes it in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cockpit.record import RunPaths
from cockpit.record.atomic import write_json_atomic


def save_plan(run_dir: Path, plan: dict[str, Any]) -> Path:
    """Write a plan (`Plan.to_dict()`, or `{"error": ...}` when none could be made) beside run.json."""
    return write_json_atomic(RunPaths(Path(run_dir)).plan, plan, indent=1)


def load_plan(run_dir: Path) -> dict[str, Any] | None:
    """The run's plan, or None when it has none (older runs) or it could not be made."""
    try:
        data = json.loads(RunPaths(Path(run_dir)).plan.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return None if not isinstance(data, dict) or "error" in data else data
