"""Each rank's guard (`python -m cockpit.service.guard`): it records how its trainer ended, and ends the
same way,
so the launcher sees what it always saw. Real processes, stopped before any model loads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from cockpit.profiles import load_profile
from cockpit.record import read_events
from cockpit.service.runs import create_run
from devtools.faults import QUIET_S, REPO, Watch, communicate_watched, wait_for


def guard(run_dir: Path, rank: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2", "CROSS_RANK": "1"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    argv = [sys.executable, "-m", "cockpit.service.guard", "--run-dir", str(run_dir), "--local_rank=0"]
    return subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_an_exit_code_is_recorded_and_passed_on(tmp_path: Path) -> None:
    """No run.json: the trainer fails at once with exit code 1."""
    proc = guard(tmp_path, 1)
    communicate_watched(proc, Watch())
    assert proc.returncode == 1
    (exit_,) = read_events(tmp_path, "rank_exit")
    assert (exit_["rank"], exit_["exit_code"], exit_["signal"], exit_["node_rank"]) == (1, 1, None, 1)


def test_a_trainer_killed_by_a_signal_is_recorded_and_the_guard_dies_of_it(tmp_path: Path) -> None:
    profile, path = load_profile("tiny-cpu")
    run_dir = create_run(tmp_path, profile, path, ["test"])
    proc = guard(run_dir, 0)
    try:
        start = wait_for(
            lambda: read_events(run_dir, "rank_start"),
            QUIET_S,
            "the trainer's rank_start",
            0.1,
            Watch(pid=proc.pid),
        )
        os.kill(start[0]["pid"], signal.SIGKILL)
        communicate_watched(proc, Watch())
        assert proc.returncode == -signal.SIGKILL, "the launcher must see the rank killed"
    finally:
        proc.kill()
    (exit_,) = read_events(run_dir, "rank_exit")
    assert (exit_["pid"], exit_["exit_code"], exit_["signal"]) == (start[0]["pid"], -9, "SIGKILL")
