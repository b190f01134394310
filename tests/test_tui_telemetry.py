"""The telemetry sampler: NVML readings that never raise, host readings, its own event file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from cockpit.service import telemetry
from cockpit.service.telemetry import Nvml, ProcessTree, Sampler

REPO = Path(__file__).resolve().parents[1]


def running_child() -> subprocess.Popen[str]:
    """A stand-in run process, returned once its interpreter is up (its RSS is then real, not a fork's)."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None and child.stdout.readline().strip() == "up"
    return child


class NVMLError(Exception):
    pass


def fake_pynvml(unsupported: set[str], count: int = 2) -> types.ModuleType:
    """A pynvml stand-in with `count` GPUs; calls named in `unsupported` raise like NVML's NotSupported."""
    m = types.ModuleType("pynvml")
    m.NVML_TEMPERATURE_GPU = 0

    def call(name, value):
        def fn(*_args):
            if name in unsupported:
                raise NVMLError("Not Supported")
            return value(*_args) if callable(value) else value

        return fn

    m.nvmlInit = call("init", None)
    m.nvmlShutdown = call("shutdown", None)
    m.nvmlDeviceGetCount = call("count", count)
    m.nvmlDeviceGetHandleByIndex = call("handle", lambda i: i)
    m.nvmlDeviceGetName = call("name", lambda h: b"NVIDIA H100 80GB HBM3")
    m.nvmlDeviceGetMemoryInfo = call(
        "memory", lambda h: types.SimpleNamespace(used=(10 + h) * 2**30, total=80 * 2**30)
    )
    m.nvmlDeviceGetUtilizationRates = call("util", lambda h: types.SimpleNamespace(gpu=97))
    m.nvmlDeviceGetPowerUsage = call("power", lambda h: 612_345)
    m.nvmlDeviceGetTemperature = call("temp", lambda h, sensor: 71)
    return m


def test_nvml_readings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(set()))
    nv = Nvml()
    sample = nv.sample()
    assert nv.available and nv.names == ["NVIDIA H100 80GB HBM3"] * 2
    assert sample["gpu_mem_used_mib"] == [10240.0, 11264.0]
    assert sample["gpu_mem_total_mib"] == [81920.0, 81920.0]
    assert sample["gpu_util_pct"] == [97.0, 97.0] and sample["gpu_power_w"] == [612.3, 612.3]
    assert sample["gpu_temp_c"] == [71.0, 71.0]


def test_unsupported_fields_are_absent_not_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml({"power", "temp"}))
    sample = Nvml().sample()
    assert "gpu_power_w" not in sample and "gpu_temp_c" not in sample
    assert sample["gpu_mem_used_mib"] == [10240.0, 11264.0]


def test_one_gpu_unsupported_is_null(monkeypatch: pytest.MonkeyPatch) -> None:
    m = fake_pynvml(set())
    m.nvmlDeviceGetPowerUsage = lambda h: (
        (_ for _ in ()).throw(NVMLError("Not Supported")) if h == 1 else 500_000
    )
    monkeypatch.setitem(sys.modules, "pynvml", m)
    assert Nvml().sample()["gpu_power_w"] == [500.0, None]


def test_a_gpu_whose_handle_fails_keeps_its_place(monkeypatch: pytest.MonkeyPatch) -> None:
    m = fake_pynvml(set(), count=3)
    m.nvmlDeviceGetHandleByIndex = lambda i: (_ for _ in ()).throw(NVMLError("Unknown")) if i == 1 else i
    monkeypatch.setitem(sys.modules, "pynvml", m)
    nv = Nvml()
    assert nv.available and len(nv.names) == 3
    assert nv.sample()["gpu_mem_used_mib"] == [10240.0, None, 12288.0]  # GPU2 stays GPU2


def test_no_nvml_means_no_gpu_fields(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml({"init"}))
    child = running_child()
    try:
        sampler = Sampler(tmp_path, root_pid=child.pid, interval_s=0.01)
        assert sampler.run(max_samples=3) == 0
    finally:
        child.kill()
        child.wait()
    events = [json.loads(line) for line in (tmp_path / "events" / "telemetry.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in events] == [
        "telemetry_start",
        "telemetry",
        "telemetry",
        "telemetry",
        "telemetry_end",
    ]
    assert events[0]["nvml"].startswith("not available")
    sample = events[1]
    assert not any(k.startswith("gpu_") for k in sample)
    assert sample["ram_total_mib"] > sample["ram_used_mib"] > 0 and "swap_used_mib" in sample
    assert sample["run_processes"] == 1 and sample["run_rss_mib"] > 1  # the stand-in run process


def test_each_sample_says_how_much_the_run_has_printed(tmp_path: Path) -> None:
    """`output_log_bytes`: output.log's size as the sampler saw it (0 before the file exists), so that a
    replay shows the log as it stood by its clock (issue 27, item 30)."""
    sampler = Sampler(tmp_path, root_pid=None, interval_s=0.01)
    start = sampler.start_event()
    (tmp_path / "output.log").write_text("phase setup\n")
    first = sampler.sample()
    with open(tmp_path / "output.log", "a") as log:
        log.write("WARNING a later line\n")
    second = sampler.sample()
    sampler.writer.close()
    assert (start["output_log_bytes"], first["output_log_bytes"], second["output_log_bytes"]) == (0, 12, 33)


def test_process_tree_counts_children_not_itself() -> None:
    child = running_child()
    try:
        tree = ProcessTree(os.getpid())  # this process is the sampler here: only the child counts
        sample = tree.sample()
        assert sample["run_processes"] >= 1 and sample["run_rss_mib"] > 1
        tree_gone = ProcessTree(2**22 + 12345)
        assert tree_gone.sample() == {"run_processes": 0, "run_rss_mib": 0.0}
    finally:
        child.kill()
        child.wait()
    assert telemetry.INTERVAL_S == 1.0


def test_module_entry_point(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "cockpit.service.telemetry", str(tmp_path), "--root-pid", str(os.getpid()),
         "--samples", "2", "--interval", "0.05"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    kinds = [
        json.loads(line)["kind"]
        for line in (tmp_path / "events" / "telemetry.jsonl").read_text().splitlines()
    ]
    assert kinds.count("telemetry") == 2


def test_supervisor_starts_and_stops_the_sampler(tmp_path: Path) -> None:
    """The supervisor's two telemetry methods, on a run's supervisor that launches nothing else."""
    from cockpit.profiles import load_profile
    from cockpit.service.runs import create_run
    from cockpit.service.supervisor import Supervisor

    profile, source = load_profile("tiny-cpu")
    sup = Supervisor(create_run(tmp_path, profile, source, ["cockpit", "run"]))
    sup._start_telemetry()
    assert sup.telemetry is not None
    import time

    deadline = time.time() + 30
    path = sup.paths.events("telemetry")
    while time.time() < deadline and (not path.exists() or '"telemetry"' not in path.read_text()):
        time.sleep(0.1)
    sup._stop_telemetry()
    assert sup.telemetry.returncode is not None
    kinds = [json.loads(line)["kind"] for line in path.read_text().splitlines()]
    assert kinds[0] == "telemetry_start" and "telemetry" in kinds and kinds[-1] == "telemetry_end"


def test_supervisor_reads_gpu_utilization_from_telemetry(tmp_path: Path) -> None:
    """The stall check's 'GPUs idle' comes from the sampler's per-GPU utilization lists."""
    from cockpit.profiles import load_profile
    from cockpit.service.runs import create_run
    from cockpit.service.supervisor import Supervisor

    profile, path = load_profile("tiny-cpu")
    sup = Supervisor(create_run(tmp_path, profile, path, ["cockpit", "run"]))
    stall = sup.runner.stall
    assert stall.gpus_idle is None
    stall.observe([{"t": 1.0, "kind": "telemetry", "gpu_util_pct": [0.0, 3.0], "ram_used_mib": 1.0}])
    assert stall.gpus_idle is True
    stall.observe([{"t": 2.0, "kind": "telemetry", "gpu_util_pct": [0.0, 97.0]}])
    assert stall.gpus_idle is False
    stall.observe([{"t": 3.0, "kind": "telemetry", "ram_used_mib": 1.0}])  # no GPU fields: unchanged
    assert stall.gpus_idle is False


def test_a_full_disk_stops_the_sampler_quietly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml({"init"}))
    sampler = Sampler(tmp_path, root_pid=None, interval_s=0.01)
    calls = {"n": 0}
    real_write = sampler.writer.write

    def write(kind, **fields):
        calls["n"] += 1
        if calls["n"] > 2:
            raise OSError(28, "No space left on device")
        return real_write(kind, **fields)

    monkeypatch.setattr(sampler.writer, "write", write)
    assert sampler.run(max_samples=10) == 0
    kinds = [
        json.loads(line)["kind"]
        for line in (tmp_path / "events" / "telemetry.jsonl").read_text().splitlines()
    ]
    assert kinds == ["telemetry_start", "telemetry"]
