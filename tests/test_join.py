"""`cockpit join`: only a run launched without ssh over several nodes can be joined, by a node other than
node 0, while it runs; the joining node runs node 0's very launch command with its own node rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from cockpit.cli import main
from cockpit.profiles import load_profile
from cockpit.record import load_manifest, write_manifest
from cockpit.service.runs import create_run
from cockpit.service.spawn import node_argv, trainer_argv


def a_run(tmp_path: Path, *overrides: str) -> Path:
    (tmp_path / "hosts").write_text("node-a slots=1\nnode-b slots=1\nnode-c slots=1\n")
    profile, path = load_profile("tiny-cpu", list(overrides))
    return create_run(tmp_path / "runs", profile, path, ["test"])


NO_SSH = ("hardware.nodes=3", "launcher.no_ssh=true", "launcher.master_addr=127.0.0.1")


def join(run_dir: Path, node: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(["join", str(run_dir), "--node-rank", node])
    except SystemExit as exc:  # argparse's own refusals
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def test_refusals_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one_host = a_run(tmp_path)
    code, err = join(one_host, "1", capsys)
    assert code == 2 and "nothing to join" in err and "Traceback" not in err
    run_dir = a_run(tmp_path, f"launcher.hostfile={tmp_path / 'hosts'}", *NO_SSH)
    code, err = join(run_dir, "3", capsys)
    assert code == 2 and "--node-rank 3: node 0 started the run; the nodes that join are 1..2" in err
    code, err = join(run_dir, "0", capsys)
    assert code == 2 and "--node-rank" in err  # node 0 is the one that ran `cockpit run`
    manifest = load_manifest(run_dir)
    write_manifest(run_dir, {**manifest, "status": "failed"})
    code, err = join(run_dir, "1", capsys)
    assert code == 2 and "has ended (status failed)" in err


def test_a_node_runs_node_0s_launch_with_its_own_node_rank(tmp_path: Path) -> None:
    profile, _ = load_profile("tiny-cpu", [f"launcher.hostfile={tmp_path / 'h'}", *NO_SSH])
    node0 = trainer_argv(profile, tmp_path, True, 4242, ["--rehearse-layers", "2"])
    node2 = node_argv(["/elsewhere/python", *node0[1:]], 2)
    assert node2[1:] == [
        *node0[1 : node0.index("--node_rank") + 1],
        "2",
        *node0[node0.index("--node_rank") + 2 :],
    ]
    assert "--resume" in node2 and node2[-2:] == ["--rehearse-layers", "2"] and "4242" in node2
    with pytest.raises(ValueError, match="not launched without ssh"):
        node_argv(trainer_argv(load_profile("tiny-cpu")[0], tmp_path, False, 1), 1)
