"""`cockpit rehearse` for real on the tiny profile: depths measured, a prediction, a stop that keeps them,
and a profile refused before anything loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cockpit.record import load_manifest, read_events
from cockpit.service import lifecycle
from devtools.faults import QUIET_S, Watch, communicate_watched, env_for, wait_for
from tests.conftest import REPO, run_cockpit

pytestmark = pytest.mark.e2e


def test_rehearsal_measures_each_depth_and_predicts_the_run(tmp_path: Path, asset_cache: Path) -> None:
    runs = tmp_path / "runs"
    out = run_cockpit(
        [
            "rehearse",
            "--no-ui",
            "--runs-dir",
            str(runs),
            "--layers",
            "1,2",
            "--steps",
            "3",
            "--eval-tokens",
            "8",
            "--format",
            "json",
        ],
        asset_cache,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(out.stdout)
    # evaluation timed after each depth's steps, fitted over the depths, in the wall clock with its share
    assert [d["eval"]["layers"] for d in data["depths"]] == [1, 2]
    assert all(d["eval"]["decode_step_s"] >= 0 and d["eval"]["score_s"] > 0 for d in data["depths"])
    assert all(d["eval"]["new_tokens"] == 8 and d["eval"]["first_s"] > 0 for d in data["depths"])
    assert data["evaluation"]["measured"] and data["wall"]["eval_s"] == data["evaluation"]["total_s"] > 0
    assert "evaluation" in data["summary"] and data["serving"]["batch_tokens_per_s"] > 0
    assert [(d["layers"], d["status"]) for d in data["depths"]] == [(1, "ok"), (2, "ok")]
    # a validation pass's forwards timed after each depth's steps and fitted (the tiny profile's sample
    # size is unknown to the forecast, so its wall counts no validation: tests/test_rehearse_predict.py)
    assert all(d["validation_s"] > 0 for d in data["depths"]) and data["measured"]["validation_s"]
    assert data["target"]["validation_s"] > 0
    assert data["layers"] == 4  # the tiny model's full depth, predicted from depths 1 and 2
    assert data["target"]["step_s"] > 0 and data["target"]["tokens_per_s"] > 0
    assert data["wall"]["steps"] > 0 and data["wall"]["total_s"] > 0
    assert data["plan"]["rss_train"] is not None  # the plan's own figure beside the prediction
    assert any("host-to-device" in line for line in data["assumptions"])
    (run_dir,) = runs.iterdir()
    manifest = load_manifest(run_dir)
    assert manifest["mode"] == "rehearse" and manifest["status"] == "finished"
    marks = {"rehearse_begin", "rehearse_validation", "rehearse_eval", "rehearse_end", "rehearsal"}
    kinds = [e["kind"] for e in read_events(run_dir) if e["kind"] in marks]
    depth = ["rehearse_begin", "rehearse_validation", "rehearse_eval", "rehearse_end"]
    assert kinds == [*depth, *depth, "rehearsal"]
    assert json.loads((run_dir / "rehearsal.json").read_text())["summary"] == data["summary"]


def test_a_stopped_rehearsal_keeps_the_depths_it_measured(tmp_path: Path, asset_cache: Path) -> None:
    runs = tmp_path / "runs"
    argv = [sys.executable, "-m", "cockpit", "rehearse", "--no-ui", "--runs-dir", str(runs)]
    steps = 12
    argv += ["--layers", "1,2,3", "--steps", str(steps), "--format", "json"]
    proc = subprocess.Popen(
        argv, env=env_for(asset_cache), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:

        def first() -> Path | None:
            return next(runs.glob("*"), None) if runs.is_dir() else None

        run_dir = wait_for(first, QUIET_S, "a run record", watch=Watch(pid=proc.pid))

        def second_depth_begun() -> bool:
            return len(read_events(run_dir, "rehearse_begin")) == 2

        wait_for(second_depth_begun, QUIET_S, "the second depth", watch=Watch(record=run_dir))
        # `cockpit stop`'s own code, in this process: a new process's start-up could outlast a depth of
        # 12 tiny steps on a busy machine, and the depth would end before the stop reached it
        assert lifecycle.stop(run_dir) is not None
        stdout, stderr = communicate_watched(proc, Watch(record=run_dir))
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, stderr[-2000:]  # stopped
    data = json.loads(stdout)
    assert [(d["layers"], d["status"]) for d in data["depths"]] == [(1, "ok"), (2, "stopped")]
    assert data["depths"][0]["step_s"] is not None  # the first depth's measurements are all there
    manifest = load_manifest(run_dir)
    assert manifest["status"] == "stopped" and "depths measured before: 1" in manifest["diagnosis"]


def test_a_profile_that_cannot_fit_one_layer_is_refused_before_anything_loads(
    tmp_path: Path, asset_cache: Path
) -> None:
    config = {
        "model_type": "qwen3_moe",
        "hidden_size": 16384,
        "num_attention_heads": 128,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 65536,
        "moe_intermediate_size": 16384,
        "num_experts": 512,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 60,
        "vocab_size": 262144,
    }
    (tmp_path / "giant").mkdir()
    (tmp_path / "giant" / "config.json").write_text(json.dumps(config))
    profile = (
        (REPO / "profiles" / "tiny-cpu.toml")
        .read_text()
        .replace('path = "builtin:tiny-qwen3-moe"', f'path = "{tmp_path / "giant"}"')
    )
    (tmp_path / "giant.toml").write_text(profile)
    runs = tmp_path / "runs"
    out = run_cockpit(
        ["rehearse", "--no-ui", "--runs-dir", str(runs), "--profile", str(tmp_path / "giant.toml")],
        asset_cache,
    )
    assert out.returncode == 2
    assert (
        "does not fit here" in out.stderr and "host RAM" in out.stderr and "nothing was loaded" in out.stderr
    )
    assert "Traceback" not in out.stderr
    assert not runs.exists() or not any(runs.iterdir())
