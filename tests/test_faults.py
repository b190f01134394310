"""Fault tests on real runs of the tiny profile: every way a run can end gets the right diagnosis, and
the record stays whole and readable."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cockpit.record import load_manifest, read_events
from cockpit.record.view import RunView
from devtools.faults import (
    env_for,
    kill,
    rank0_steps,
    start_detached,
    supervisor_pid,
    trainer_pid,
    try_mount_tmpfs,
    unmount,
    wait_end,
    wait_for,
    wait_step,
)

pytestmark = pytest.mark.e2e


def cockpit(cache: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cockpit", *args],
        env=env_for(cache),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_record_readable(run_dir: Path) -> None:
    manifest = load_manifest(run_dir)
    assert manifest["status"] and manifest["diagnosis"]
    events = read_events(run_dir)
    assert events and all("kind" in e and "t" in e for e in events)


def test_stop_then_resume_continues_from_the_checkpoint(tmp_path: Path, asset_cache: Path) -> None:
    run_dir = start_detached(tmp_path, asset_cache, 14)
    wait_step(run_dir, 5)
    stop = cockpit(asset_cache, "stop", str(run_dir))
    assert stop.returncode == 0, stop.stderr
    manifest = wait_end(run_dir)
    assert manifest["status"] == "stopped", manifest["diagnosis"]
    stopped_at = rank0_steps(run_dir)[-1]["step"]
    assert manifest["diagnosis"] == f"stopped by user at step {stopped_at}, checkpoint saved"
    assert (run_dir / "checkpoints" / f"checkpoint-{stopped_at}").is_dir()

    resumed = cockpit(asset_cache, "resume", str(run_dir), "--no-ui")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    manifest = load_manifest(run_dir)
    assert manifest["status"] == "finished" and manifest["resumed"] is True
    raw = [e["step"] for e in rank0_steps(run_dir)]
    assert raw == list(range(1, 15)), "every step once: the stop checkpoint is where the resume starts"
    view = RunView()
    view.apply(read_events(run_dir))
    assert [s.step for s in view.steps] == list(range(1, 15))


def test_closing_the_viewer_leaves_the_run_going(tmp_path: Path, asset_cache: Path) -> None:
    viewer = subprocess.Popen(
        [sys.executable, "-m", "cockpit", "run", "--no-ui", "--runs-dir", str(tmp_path),
         "--set", "training.max_steps=6", "--set", "eval.enabled=false"],
        env=env_for(asset_cache),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    run_dir = wait_for(lambda: next(iter(tmp_path.iterdir()), None), 60, "the run directory")
    wait_step(run_dir, 2)
    viewer.kill()
    viewer.wait()
    manifest = wait_end(run_dir)
    assert manifest["status"] == "finished", manifest["diagnosis"]
    assert rank0_steps(run_dir)[-1]["step"] == 6


def test_sigkill_of_a_trainer_rank(tmp_path: Path, asset_cache: Path) -> None:
    run_dir = start_detached(tmp_path, asset_cache, 200)
    wait_step(run_dir, 2)
    kill(trainer_pid(run_dir), signal.SIGKILL)
    manifest = wait_end(run_dir)
    assert manifest["status"] == "failed"
    assert manifest["diagnosis"].startswith("killed by SIGKILL after step"), manifest["diagnosis"]
    assert_record_readable(run_dir)


def test_sigkill_of_one_of_two_ranks_names_that_rank(tmp_path: Path, asset_cache: Path) -> None:
    """Two ranks on the CPU (gloo): rank 1 killed; rank 0 then fails in a collective, 3 ms later, and is
    ended by the launcher. The diagnosis names rank 1 and its host, from its guard's `rank_exit`."""
    run_dir = start_detached(tmp_path, asset_cache, 200, "--set", "hardware.gpus=2")
    wait_step(run_dir, 2)
    kill(trainer_pid(run_dir, rank=1), signal.SIGKILL)
    manifest = wait_end(run_dir)
    assert manifest["status"] == "failed"
    here = re.escape(socket.gethostname())
    assert re.fullmatch(rf"rank 1 on {here} killed by SIGKILL after step \d+", manifest["diagnosis"]), (
        manifest["diagnosis"]
    )
    exits = {e["rank"]: e["signal"] for e in read_events(run_dir, "rank_exit")}
    assert exits == {0: "SIGTERM", 1: "SIGKILL"}, "rank 0 was ended by the launcher, after rank 1"
    assert_record_readable(run_dir)
    # DeepSpeed's CPU all-reduce buffers (66 MiB of RAM each in /dev/shm) are gone with the launch.
    from cockpit.service.shm import allreduce_buffers

    launch = next(e for e in read_events(run_dir, "launch") if e.get("stage") == "train")["argv"]
    assert allreduce_buffers(int(launch[launch.index("--master_port") + 1])) == []


def test_a_rank_that_hangs_is_named_in_the_stall(tmp_path: Path, asset_cache: Path) -> None:
    """Two ranks: rank 1 hangs at step 3, rank 0 waits for it in a collective. The stall is said while
    the run is alive, and its diagnosis names rank 1 from the ranks' stacks (SIGUSR1, faulthandler)."""
    run_dir = start_detached(
        tmp_path, asset_cache, 200, "--set", "hardware.gpus=2", COCKPIT_TEST_FAULT="hang:3:1"
    )
    manifest = wait_end(run_dir)
    assert manifest["status"] == "stalled", manifest["diagnosis"]
    here = re.escape(socket.gethostname())
    stuck = rf"stalled after step 2: rank 1 on {here} is stuck in on_step_end \(trainer/callbacks\.py:\d+\), "
    assert re.match(stuck + "the others wait in a collective; no step for", manifest["diagnosis"]), manifest[
        "diagnosis"
    ]
    notes = [e["message"] for e in read_events(run_dir, "note")]
    assert any(n.startswith("stalled: rank 1") for n in notes), "said while the run was still alive"
    assert_record_readable(run_dir)


def test_out_of_memory_in_the_trainer(tmp_path: Path, asset_cache: Path) -> None:
    run_dir = start_detached(tmp_path, asset_cache, 200, COCKPIT_TEST_FAULT="oom:2")
    manifest = wait_end(run_dir)
    assert manifest["status"] == "failed"
    assert manifest["diagnosis"].startswith("CUDA out of memory after step 1"), manifest["diagnosis"]
    assert_record_readable(run_dir)


def test_sigterm_to_the_supervisor_stops_with_a_checkpoint(tmp_path: Path, asset_cache: Path) -> None:
    run_dir = start_detached(tmp_path, asset_cache, 200)
    wait_step(run_dir, 3)
    kill(supervisor_pid(run_dir), signal.SIGTERM)
    manifest = wait_end(run_dir)
    assert manifest["status"] == "stopped"
    assert (
        "(SIGTERM to the supervisor)" in manifest["diagnosis"] and "checkpoint saved" in manifest["diagnosis"]
    )
    assert_record_readable(run_dir)


def test_a_full_disk_is_named(tmp_path: Path, asset_cache: Path) -> None:
    small = tmp_path / "small-fs"
    mounted = try_mount_tmpfs(small, "1m")
    try:
        if mounted:  # a real 1 MiB file system: the first checkpoint cannot fit
            run_dir = start_detached(small, asset_cache, 200)
        else:  # no mount allowed here: the trainer's write fails as ENOSPC would make it
            run_dir = start_detached(tmp_path, asset_cache, 200, COCKPIT_TEST_FAULT="enospc:3")
        manifest = wait_end(run_dir)
        assert manifest["status"] == "failed"
        assert manifest["diagnosis"].startswith("disk full"), manifest["diagnosis"]
        assert_record_readable(run_dir)
    finally:
        if mounted:
            unmount(small)


def test_a_lost_supervisor_is_reported_and_its_run_can_be_ended(tmp_path: Path, asset_cache: Path) -> None:
    run_dir = start_detached(tmp_path, asset_cache, 200)
    wait_step(run_dir, 2)
    kill(supervisor_pid(run_dir), signal.SIGKILL)
    wait_for(
        lambda: "still running" in cockpit(asset_cache, "ls", "--runs-dir", str(tmp_path)).stdout, 30, "ls"
    )
    killed = cockpit(asset_cache, "stop", run_dir.name, "--kill", "--runs-dir", str(tmp_path))
    assert killed.returncode == 0, killed.stderr
    listing = wait_for(
        lambda: (
            (out := cockpit(asset_cache, "ls", "--runs-dir", str(tmp_path)).stdout) and "gone" in out and out
        ),
        30,
        "the lost run to be marked",
    )
    assert "failed" in listing
    assert load_manifest(run_dir)["diagnosis"].startswith("supervisor lost")


def test_host_ram_at_the_limit_stops_with_a_checkpoint(tmp_path: Path, asset_cache: Path) -> None:
    # The tiny run's processes hold about 1.2 GiB while training; from step 2 rank 0 holds 512 MiB more at
    # every step (3 GiB at most), so a 2.5 GiB limit is reached a few steps into training.
    run_dir = start_detached(
        tmp_path, asset_cache, 40, "--set", "hardware.host_ram_limit_gib=2.5", COCKPIT_TEST_FAULT="leak:2"
    )
    manifest = wait_end(run_dir)
    assert manifest["status"] == "stopped", manifest["diagnosis"]
    assert manifest["exit_code"] == 0, "the trainer checkpointed and exited; nothing was killed"
    stopped_at = rank0_steps(run_dir)[-1]["step"]
    match = re.fullmatch(
        rf"host RAM at (\d+\.\d+) of 2\.50* GiB; stopped before the OOM killer "
        rf"\(at step {stopped_at}, checkpoint saved\)",
        manifest["diagnosis"],
    )
    assert match and float(match[1]) >= 2.5, manifest["diagnosis"]
    assert (run_dir / "checkpoints" / f"checkpoint-{stopped_at}").is_dir()
    assert stopped_at < 40
    notes = [e for e in read_events(run_dir, "note") if "host_ram_limit_mib" in e]
    assert len(notes) == 1 and notes[0]["host_ram_limit_mib"] == 2560.0
    assert_record_readable(run_dir)
