"""Two nodes, simulated on one machine: two launcher invocations without ssh, node ranks 0 and 1, one
CPU rank each (gloo), train the tiny profile as one job, and the record shows both nodes."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from cockpit.app.model import build_charts
from cockpit.record import read_events
from cockpit.record.playback import Playback
from cockpit.record.view import RunView
from devtools.faults import start_detached, wait_end
from tests.conftest import run_cockpit

pytestmark = pytest.mark.e2e
STEPS = 3


def test_two_nodes_without_ssh_train_as_one_job(tmp_path: Path, asset_cache: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node-a slots=1\nnode-b slots=1\n")  # names only: no ssh ever reaches them
    run_dir = start_detached(
        tmp_path / "runs", asset_cache, STEPS,
        "--set", "hardware.nodes=2", "--set", f"launcher.hostfile={hostfile}",
        "--set", "launcher.no_ssh=true", "--set", "launcher.master_addr=127.0.0.1",
    )  # fmt: skip
    joined = run_cockpit(["join", str(run_dir), "--node-rank", "1", "--wait"], asset_cache, record=run_dir)
    assert joined.returncode == 0, joined.stdout + joined.stderr
    manifest = wait_end(run_dir)
    assert manifest["status"] == "finished", manifest["diagnosis"]

    view = RunView()
    view.apply(read_events(run_dir))
    placed = {
        r: (e["node_rank"], e["local_rank"], e["nodes"], e["world_size"]) for r, e in view.ranks.items()
    }
    assert placed == {0: (0, 0, 2, 2), 1: (1, 0, 2, 2)}
    steps = {r: [e["step"] for e in read_events(run_dir, "step") if e["rank"] == r] for r in (0, 1)}
    assert steps == {0: list(range(1, STEPS + 1)), 1: list(range(1, STEPS + 1))}, "one job: the same steps"
    losses = {r: [e["loss"] for e in read_events(run_dir, "step") if e["rank"] == r] for r in (0, 1)}
    assert losses[0] == losses[1], "one model: the loss is reduced over both nodes' ranks"
    # Each rank read and quantized only its share of the model; the other's came by broadcast.
    loaded = {e["rank"]: e for e in read_events(run_dir, "loaded")}
    assert [loaded[r]["load_share"]["layers"] for r in (0, 1)] == [[0, 2], [1, 3]]
    assert [loaded[r]["load_share"]["linear_4bit"] for r in (0, 1)] == [8, 8]
    assert loaded[0]["linear_4bit"] == loaded[1]["linear_4bit"] == 16  # both hold the whole model

    # Two launchers: node 0's and node 1's, the same arguments but their node rank.
    launch = next(e for e in read_events(run_dir, "launch") if e.get("stage") == "train")["argv"]
    node1 = next(iter(read_events(run_dir, "node_launch")))["argv"]
    assert launch[launch.index("--node_rank") + 1] == "0" and node1[node1.index("--node_rank") + 1] == "1"
    assert launch[3 : launch.index("--node_rank")] == node1[3 : node1.index("--node_rank")]
    assert view.nodes_ended[1]["exit_code"] == 0
    exits = {e["rank"]: (e["node_rank"], e["exit_code"]) for e in read_events(run_dir, "rank_exit")}
    assert exits == {0: (0, 0), 1: (1, 0)}

    # The viewers label each rank's line by host and node (both nodes share this host).
    host = socket.gethostname()
    pb = Playback(run_dir, live=False)
    pb.load()
    pb.command("end")
    pb.tick()
    labels = [t.label for t in build_charts(pb, {"gpu": 40})["gpu"].traces]
    assert f"{host}/n0:0 RSS" in labels and f"{host}/n1:0 RSS" in labels
