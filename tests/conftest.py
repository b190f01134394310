"""Shared fixtures: an isolated asset cache and helpers to run the real `cockpit` command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.faults import Watch, env_for, run_watched

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def asset_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One built-in asset cache per session (COCKPIT_TEST_CACHE reuses one across sessions)."""
    shared = os.environ.get("COCKPIT_TEST_CACHE")
    return Path(shared) if shared else tmp_path_factory.mktemp("cockpit-cache")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The built-in tiny model's directory (built once a session, in $COCKPIT_CACHE if set)."""
    from trainer import tiny

    cache = os.environ.get("COCKPIT_CACHE") or str(tmp_path_factory.mktemp("cockpit-cache"))
    old = os.environ.get("COCKPIT_CACHE")
    os.environ["COCKPIT_CACHE"] = cache
    try:
        return str(tiny.model_path(seed=0))
    finally:
        if old is None:
            del os.environ["COCKPIT_CACHE"]


def run_cockpit(
    args: list[str], cache: Path, record: Path | None = None, **extra: str
) -> subprocess.CompletedProcess[str]:
    """Run `python -m cockpit ARGS` for real and capture its output, as long as it makes progress: the
    records under `record` (else its `--runs-dir`) grow or its processes work (`devtools.faults.Watch`);
    never for a fixed time. `extra`: environment variables."""
    if record is None and "--runs-dir" in args:
        record = Path(args[args.index("--runs-dir") + 1])
    return run_watched(
        [sys.executable, "-m", "cockpit", *args], Watch(record=record), env=env_for(cache, **extra), cwd=REPO
    )
