"""Without a terminal (nohup, a pipe, a CI log) the app is refused, and following prints plain lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tui_helpers import copy_until

REPO = Path(__file__).resolve().parent.parent


def _cockpit_without_terminal(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`python -m cockpit ARGS` with stdin, stdout and stderr none of them a terminal."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "cockpit", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env,
    )


def test_replay_without_a_terminal_refuses_in_one_line(tmp_path: Path) -> None:
    run_dir = copy_until(tmp_path)
    done = _cockpit_without_terminal(["replay", run_dir.name, "--runs-dir", str(tmp_path)])
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs a terminal" in lines[0]
    assert f"cockpit report {run_dir.name}" in lines[0] and "cockpit ls" in lines[0]
    assert "\x1b" not in done.stderr


def test_attach_without_a_terminal_refuses_and_names_the_headless_follow(tmp_path: Path) -> None:
    copy_until(tmp_path)
    done = _cockpit_without_terminal(["attach", "latest", "--runs-dir", str(tmp_path)])
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs a terminal" in lines[0]
    assert "cockpit attach latest --no-ui" in lines[0] and "\x1b" not in done.stderr


def test_attach_no_ui_follows_without_a_terminal(tmp_path: Path) -> None:
    run_dir = copy_until(tmp_path)
    done = _cockpit_without_terminal(["attach", run_dir.name, "--no-ui", "--runs-dir", str(tmp_path)])
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stderr
    assert f"run {run_dir.name}: finished - finished at step 400" in done.stderr
