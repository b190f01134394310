"""Shared fixtures: an isolated asset cache and helpers to run the real `cockpit` command."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.faults import Watch, env_for, run_watched

REPO = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """On a fresh environment the first trainer run builds DeepSpeed's CPU Adam (minutes on two cores)
    and every other run waits for that build. So the first file with end-to-end tests goes first, then
    the files without any, then the other end-to-end files: under `-n 2 --dist loadfile` the second
    worker runs the quick tests while the op builds, instead of waiting on its lock."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    e2e = [name for name, its in files.items() if any(i.get_closest_marker("e2e") for i in its)]
    order = e2e[:1] + [name for name in files if name not in e2e] + e2e[1:]
    items[:] = [item for name in order for item in files[name]]


@pytest.fixture(scope="session")
def asset_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One built-in asset cache per session (COCKPIT_TEST_CACHE reuses one across sessions)."""
    shared = os.environ.get("COCKPIT_TEST_CACHE")
    return Path(shared) if shared else tmp_path_factory.mktemp("cockpit-cache")


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every test's `$COCKPIT_CACHE`: a folder of this session's (or `COCKPIT_TEST_CACHE`), never the
    user's own, so what a test builds or keeps there (the tiny model, NF4 caches of its loads) stays out
    of `~/.cache/cockpit`."""
    cache = Path(os.environ.get("COCKPIT_TEST_CACHE") or tmp_path_factory.mktemp("cockpit-cache"))
    old = os.environ.get("COCKPIT_CACHE")
    os.environ["COCKPIT_CACHE"] = str(cache)
    yield cache
    if old is None:
        os.environ.pop("COCKPIT_CACHE", None)
    else:
        os.environ["COCKPIT_CACHE"] = old


@pytest.fixture(scope="session", autouse=True)
def one_extensions_folder() -> Iterator[str]:
    """`$TORCH_EXTENSIONS_DIR` for every process a test starts: this environment's own folder, the one the
    supervisor gives its children. A test that launches DeepSpeed itself (two ZeRO-3 ranks) then loads the
    CPU Adam the runs built, instead of compiling it again into torch's shared default folder (minutes on
    two cores, and again whenever another environment built there last)."""
    from cockpit.ops.extcache import ENV, use_keyed_root

    old = os.environ.get(ENV)
    folder = use_keyed_root(os.environ)
    yield folder
    if old is None:
        os.environ.pop(ENV, None)


@pytest.fixture(scope="session")
def tiny_dir(private_cache: Path) -> str:
    """The built-in tiny model's directory (built once a session, in the tests' `$COCKPIT_CACHE`)."""
    from trainer.inputs import tiny

    return str(tiny.model_path(seed=0))


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
