"""Without a terminal (nohup, a pipe, a CI log) the app is refused, and following prints plain lines.

Every command that can open the app goes through one rule (`cockpit.cli.follow.use_app`): with no
terminal it follows the run headless or refuses in one line, and it ends. Its results go to stdout, its
progress to stderr.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tui_helpers import add_report, copy_until

from cockpit import cli

REPO = Path(__file__).resolve().parent.parent
REHEARSAL = REPO / "tests" / "fixtures" / "records" / "20261201-023803-tiny-cpu-729e"
# `cockpit ARGS` whose launches hand back a record that has ended (tests/launch_over_record.py)
OVER_RECORD = [sys.executable, "-m", "tests.launch_over_record"]


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
    assert f"run {run_dir.name}: finished - finished at step 400" in done.stdout  # a result


def _without_terminal(argv: list[str]) -> tuple[int, str, str]:
    """Run `argv` with stdin /dev/null and stdout and stderr piped, and wait for it to exit by itself
    (the test's timeout is only a safety net); it is killed if the test ends first."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=REPO, env=env,
    )  # fmt: skip
    try:
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


def _records(runs: Path) -> dict[str, Path]:
    """A finished training run with a report, and a finished rehearsal, in `runs`."""
    train = copy_until(runs)
    add_report(train)
    rehearsal = runs / REHEARSAL.name
    shutil.copytree(REHEARSAL, rehearsal)
    return {"train": train, "rehearsal": rehearsal}


# Every command that can open the full-screen app: the record its launch hands back, its arguments, and
# what it does with no terminal (follow the run headless, or refuse in one line).
APP_COMMANDS = {
    "run": ("train", ["run"], "follows"),
    "resume": ("train", ["resume", "{train}"], "follows"),
    "rehearse": ("rehearsal", ["rehearse"], "follows"),
    "attach": ("train", ["attach", "{train}"], "refuses"),
    "replay": ("train", ["replay", "{train}"], "refuses"),
    "compare": ("train", ["compare", "{train}", "{rehearsal}"], "refuses"),
}


@pytest.mark.timeout(300)  # a safety net: the test waits on the process, which must end by itself
@pytest.mark.parametrize("command", sorted(APP_COMMANDS))
def test_every_command_that_can_open_the_app_ends_without_a_terminal(command: str, tmp_path: Path) -> None:
    """Before: `cockpit rehearse` with stdin /dev/null and its output piped opened the app, wrote its
    codes into the pipe and never ended, the rehearsal long finished."""
    records = _records(tmp_path)
    launched, args, how = APP_COMMANDS[command]
    argv = [arg.format(**{k: p.name for k, p in records.items()}) for arg in args]
    code, out, err = _without_terminal(
        [*OVER_RECORD, str(records[launched]), *argv, "--runs-dir", str(tmp_path)]
    )
    assert "\x1b" not in out + err, "terminal codes written into a pipe"
    if how == "refuses":
        assert code == cli.EXIT_BAD_INPUT and out == ""
        (line,) = err.strip().splitlines()
        assert f"`cockpit {command}` needs a terminal" in line
    else:
        assert code == 0, err[-2000:]
        assert "no terminal: plain progress lines instead of the app" in err
        assert out.strip(), "the command's result (F1 table and closing lines, or the prediction) on stdout"


def _calls(function: ast.FunctionDef) -> set[str]:
    return {
        node.func.id if isinstance(node.func, ast.Name) else node.func.attr
        for node in ast.walk(function)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute)
    }


def test_every_command_that_can_open_the_app_is_tested_and_asks_the_rule_first() -> None:
    """The list above is every subcommand whose handler reaches the app through the CLI's own functions,
    and every function that opens the app asks `use_app` (the one rule) in its body."""
    sources = sorted(Path(cli.__file__).parent.glob("*.py"))  # the package: every command group
    trees = [ast.parse(path.read_text(encoding="utf-8")) for path in sources]
    functions = {node.name: node for tree in trees for node in tree.body if isinstance(node, ast.FunctionDef)}
    openers = {"open_app", "run_compare_app"}

    def reaches(name: str, seen: set[str]) -> bool:
        if name in openers:
            return True
        if name not in functions or name in seen:
            return False
        seen.add(name)
        return any(reaches(called, seen) for called in _calls(functions[name]))

    (commands,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    can_open = {
        name for name, sub in commands.choices.items() if reaches(sub.get_default("func").__name__, set())
    }
    assert can_open == set(APP_COMMANDS)
    for name, function in functions.items():
        if _calls(function) & openers:
            assert "use_app" in _calls(function), f"{name} opens the app without asking use_app"


@pytest.mark.timeout(300)
def test_a_followed_runs_results_go_to_stdout_and_its_progress_to_stderr(tmp_path: Path) -> None:
    """Before: `cockpit run --no-ui > log` left the log empty, the F1 table included."""
    train = _records(tmp_path)["train"]
    code, out, err = _without_terminal(
        [*OVER_RECORD, str(train), "run", "--no-ui", "--runs-dir", str(tmp_path)]
    )
    assert code == 0, err[-2000:]
    assert "macro F1 on the held-out split" in out and f"run {train.name}: finished" in out
    assert f"record: {train}" in out
    assert "macro F1" not in err and "step 400/400" in err, "the progress lines stay on stderr"
