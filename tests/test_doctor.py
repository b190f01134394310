"""`cockpit doctor` on this machine, its JSON, known-bad combinations, and the trainer's `build` phase."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from cockpit import cli
from cockpit.headless import PlainLog
from cockpit.ops import dsops
from cockpit.profiles import load_profile
from cockpit.record import EventWriter, RunReader
from cockpit.record.view import RunView
from cockpit.service import doctor


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh torch extensions cache: nothing JIT-built in it yet."""
    cache = tmp_path / "torch_extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(cache))
    return cache


def _by_name(exam: doctor.Examination) -> dict[str, doctor.Check]:
    return {c.name: c for c in exam.checks}


def test_each_check_on_this_machine_tells_the_truth(tmp_path: Path) -> None:
    profile, _ = load_profile("tiny-cpu")
    checks = _by_name(doctor.examine(profile, tmp_path / "runs"))
    # no shm op line: the tiny profile's one rank does not use it
    assert set(checks) == {
        "libraries", "model and data", "experts in 4 bit", "partition at load", "packed attention",
        "DeepSpeed CPU Adam",
        "c++ compiler", "ninja", "GPUs", "host RAM", "disk", "NF4 cache", "plan",
    }  # fmt: skip
    assert all(c.status in ("ok", "warn", "fail") and c.reason for c in checks.values())
    # The compiler and ninja are reported as they are on PATH here, present or not.
    assert (checks["c++ compiler"].status == "ok") == (shutil.which("c++") is not None)
    beside_first = dsops.ninja_first(os.environ.get("PATH", ""))
    assert (checks["ninja"].status == "ok") == (shutil.which("ninja", path=beside_first) is not None)
    gpus, why = doctor.nvml_gpus()
    if not gpus:  # this machine: no GPU, NVML says why; the tiny profile needs none
        assert "NVML" in why and why in checks["GPUs"].reason
        assert checks["GPUs"].status == "ok"
    assert checks["libraries"].status == "ok" and "deepspeed 0.19" in checks["libraries"].reason
    assert checks["disk"].status == "ok" and checks["plan"].reason.startswith("FITS")
    assert checks["model and data"].status == "ok" and "on the CPU" in checks["plan"].reason
    missing, _ = load_profile("tiny-cpu", [f'data.source="{tmp_path / "nope.jsonl"}"'])
    check = _by_name(doctor.examine(missing, tmp_path / "runs", "mine.toml"))["model and data"]
    assert check.status == "fail" and check.reason.startswith("mine.toml: data.source: no such file")
    # a model folder with its config but no weights nor tokenizer, and no data: every piece named at once
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    bare, _ = load_profile(
        "tiny-cpu", [f'model.path="{tmp_path / "model"}"', f'data.source="{tmp_path / "nope.jsonl"}"']
    )
    check = _by_name(doctor.examine(bare, tmp_path / "runs", "mine.toml"))["model and data"]
    assert check.status == "fail" and len(check.reason.splitlines()) == 1
    assert "model.path: no weights (*.safetensors) and no tokenizer (tokenizer.json)" in check.reason
    assert "; data.source: no such file" in check.reason


def test_a_profile_that_wants_gpus_fails_where_nvml_sees_none_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if doctor.nvml_gpus()[0]:
        pytest.skip("this machine has GPUs")
    code = cli.main(
        ["doctor", "--runs-dir", str(tmp_path), "--format", "json", "--profile", _profile(tmp_path)]
    )
    answer = json.loads(capsys.readouterr().out)
    gpus = next(c for c in answer["checks"] if c["name"] == "GPUs")
    assert gpus["status"] == "fail" and "wants 1" in gpus["reason"]
    assert code == 1 and answer["counts"]["fail"] >= 1


def _profile(tmp_path: Path, **sections: str) -> str:
    """The tiny profile with `hardware.gpus = 1` and any extra lines, as a file."""
    text = (Path(cli.__file__).parents[2] / "profiles" / "tiny-cpu.toml").read_text()
    text = text.replace("[hardware]\ngpus = 0", "[hardware]\ngpus = 1")
    for old, new in sections.items():
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "crafted.toml"
    path.write_text(text)
    return str(path)


def test_json_format_and_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["doctor", "--runs-dir", str(tmp_path / "runs"), "--format", "json"])
    answer = json.loads(capsys.readouterr().out)
    assert answer["profile"] == "tiny-cpu"
    assert {tuple(sorted(c)) for c in answer["checks"]} == {("facts", "name", "reason", "status")}
    assert sum(answer["counts"].values()) == len(answer["checks"])
    assert code == (1 if answer["counts"]["fail"] else 0)


def test_the_json_answer_is_all_that_goes_to_stdout(tmp_path: Path) -> None:
    """DeepSpeed logs its accelerator's choice to stdout on import: it went before the JSON."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "cockpit", "doctor", "--runs-dir", str(tmp_path), "--format", "json"],
        capture_output=True,
        text=True,
    )
    assert json.loads(done.stdout)["profile"] == "tiny-cpu", done.stdout[:300]


def test_bad_input_exits_2(tmp_path: Path) -> None:
    assert cli.main(["doctor", "--runs-dir", str(tmp_path), "--profile", str(tmp_path / "nope.toml")]) == 2


def test_known_bad_combination_from_a_crafted_profile(tmp_path: Path) -> None:
    """Experts left to bitsandbytes with Transformers 5, and from_pretrained skipping zero.Init."""
    bad, _ = load_profile("tiny-cpu", ["quantization.quantize_experts=false", "model.loader=transformers"])
    experts = doctor.check_fused_experts(bad, "5.24.0", is_moe=True)
    assert experts.status == "warn" and "16 bit" in experts.reason and "quantize_experts" in experts.reason
    assert doctor.check_fused_experts(bad, "4.57.1", is_moe=True).status == "ok"
    assert doctor.check_zero_init(bad, "5.24.0").status == "warn"
    good, _ = load_profile("tiny-cpu")
    assert doctor.check_fused_experts(good, "5.24.0", is_moe=True).status == "ok"
    assert doctor.check_zero_init(good, "5.24.0").status == "ok"
    # Packed attention on GPUs without FlashAttention-4: said, with the extra that brings it
    story, _ = load_profile("qwen3-235b-a22b-thinking-4xh100")
    missing = doctor.check_flash4(story, None)
    assert missing.status == "warn" and "cockpit[flash4]" in missing.reason
    assert doctor.check_flash4(story, "4.0.0b40").status == "ok"
    assert doctor.check_flash4(good, None).status == "ok"  # the tiny profile: no GPU
    # Through the whole examination, with the Transformers installed here (5.x).
    checks = _by_name(doctor.examine(bad, tmp_path / "runs"))
    assert checks["experts in 4 bit"].status == "warn"
    assert checks["partition at load"].status == "warn"


def test_cpu_adam_in_an_empty_cache_is_not_built(empty_cache: Path) -> None:
    state = dsops.cpu_adam_state()
    if state.where == "installed with DeepSpeed":
        pytest.skip("DeepSpeed was installed with its ops prebuilt")
    assert not state.built and Path(state.where) == empty_cache / "cpu_adam"
    offload, _ = load_profile("tiny-cpu")
    check = doctor.check_cpu_adam(offload, state)
    assert check.status == "warn" and "--prebuild" in check.reason
    no_offload, _ = load_profile(
        "tiny-cpu", ["deepspeed.offload_optimizer=none", "deepspeed.offload_param=none"]
    )
    assert doctor.check_cpu_adam(no_offload, state).status == "ok"
    (empty_cache / "cpu_adam" / "cpu_adam.so").write_bytes(b"")  # a .so alone: DeepSpeed would compile
    again = dsops.cpu_adam_state()
    assert not again.built and again.rebuild == "no record of its build here (build.ninja, .ninja_log)"


def test_host_ram_and_disk_against_the_plan(tmp_path: Path) -> None:
    gib = doctor.GiB
    assert doctor.check_host_ram(64 * gib, 60 * gib, 10 * gib).status == "ok"
    assert doctor.check_host_ram(64 * gib, 5 * gib, 10 * gib).status == "warn"
    assert doctor.check_host_ram(8 * gib, 5 * gib, 10 * gib).status == "fail"
    assert doctor.check_disk(tmp_path, 1 * gib, 2 * gib).status == "fail"
    assert doctor.check_disk(tmp_path, 3 * gib, 2 * gib).status == "ok"
    assert doctor.existing_parent(tmp_path / "a" / "b") == tmp_path


def test_the_trainer_says_it_builds_before_it_builds(
    empty_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each compile is a `build` phase of its own, in the record before the compile starts; viewers show
    its message. Ops already built are loaded too (DeepSpeed then compiles nothing later), unannounced."""
    from trainer.ops import build_ops

    if dsops.cpu_adam_state().where == "installed with DeepSpeed":
        pytest.skip("DeepSpeed was installed with its ops prebuilt")
    events = tmp_path / "events" / "trainer-rank0.jsonl"
    events.parent.mkdir()
    writer = EventWriter(events, rank=0)
    seen_at_build: list[str] = []
    monkeypatch.setattr(dsops, "build_cpu_adam", lambda: seen_at_build.append(events.read_text()))
    monkeypatch.setattr(dsops, "build_shm_comm", lambda: seen_at_build.append(events.read_text()))
    profile, _ = load_profile("tiny-cpu", ["hardware.gpus=2"])  # two ranks: on a CPU host, shm too
    shm = dsops.shm_comm_state()  # the CPU accelerator's shared-memory op (None on a GPU machine)
    expected = ["cpu_adam"] + ([shm.name] if shm is not None and shm.compatible else [])
    assert build_ops(profile, lambda name, **f: writer.write("phase", phase=name, **f)) == expected
    assert len(seen_at_build) == len(expected)
    for n, (name, seen) in enumerate(zip(expected, seen_at_build, strict=True)):
        assert seen.count('"phase":"build"') == n + 1, "one phase a compile, each before its compile"
        assert f"compiling DeepSpeed's {name} op (not built in this environment yet)" in seen

    view = RunView()
    view.apply(RunReader(tmp_path).poll())
    words = dsops.cpu_adam_state().compile_words if len(expected) == 1 else shm.compile_words
    assert view.phase == "build" and view.phase_message == words
    lines = PlainLog().update(view, now=view.last_t or 0.0)
    assert any(line.endswith(f"phase build: {words}") for line in lines)

    built = dsops.OpState("cpu_adam", True, True, str(empty_cache / "cpu_adam"))
    monkeypatch.setattr(dsops, "cpu_adam_state", lambda check=None: built)
    monkeypatch.setattr(dsops, "shm_comm_state", lambda check=None: None)
    loaded: list[str] = []
    monkeypatch.setattr(dsops, "build_cpu_adam", lambda: loaded.append("cpu_adam"))
    assert build_ops(profile, lambda name, **f: pytest.fail("no build phase expected")) == []
    assert loaded == ["cpu_adam"], "loaded in the build phase all the same"
    no_offload, _ = load_profile(
        "tiny-cpu", ["deepspeed.offload_optimizer=none", "deepspeed.offload_param=none"]
    )
    assert build_ops(no_offload, lambda name, **f: pytest.fail("no build phase expected")) == []


def test_prebuild_says_what_it_does_and_reports_a_failed_build(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    if dsops.cpu_adam_state().where == "installed with DeepSpeed":
        pytest.skip("DeepSpeed was installed with its ops prebuilt")
    said: list[str] = []
    monkeypatch.setattr(dsops, "build_cpu_adam", lambda: time.sleep(0.3))
    monkeypatch.setattr(dsops, "build_shm_comm", lambda: None)
    profile, _ = load_profile("tiny-cpu")
    check = doctor.prebuild(profile, said.append, every_s=0.05)
    assert check.status == "ok" and check.reason.startswith("built cpu_adam") and " in " in check.reason
    assert (
        said[0].startswith("compiling DeepSpeed's cpu_adam op") and f"({empty_cache / 'cpu_adam'})" in said[0]
    )
    assert any("still building" in s for s in said[1:])

    def broken() -> None:
        raise RuntimeError("Unable to JIT load the cpu_adam op due to ninja not being installed.")

    monkeypatch.setattr(dsops, "build_cpu_adam", broken)
    failed = doctor.prebuild(profile, said.append)
    assert failed.status == "fail" and "ninja not being installed" in failed.reason


def test_a_stop_while_building_unwinds_and_restores_the_handler(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM (a stop before training) during an op build raises SystemExit, so torch's build lock is
    released on the way out (a stale lock would hang every later run); the handler before is restored."""
    import os
    import signal

    from trainer.ops import build_ops

    if dsops.cpu_adam_state().where == "installed with DeepSpeed":
        pytest.skip("DeepSpeed was installed with its ops prebuilt")
    released: list[bool] = []

    def build_then_stopped() -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        finally:
            released.append(True)  # what torch's `finally: baton.release()` gets to do

    monkeypatch.setattr(dsops, "build_cpu_adam", build_then_stopped)
    monkeypatch.setattr(dsops, "build_shm_comm", lambda: None)
    before = signal.getsignal(signal.SIGTERM)
    profile, _ = load_profile("tiny-cpu")
    with pytest.raises(SystemExit) as stopped:
        build_ops(profile, lambda name, **f: None)
    assert stopped.value.code == 128 + signal.SIGTERM and released == [True]
    assert signal.getsignal(signal.SIGTERM) == before


def test_the_shm_op_belongs_to_several_ranks_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU accelerator's shared-memory op serves ranks that share a node: built and checked for those
    runs only. With one rank DeepSpeed is told not to load it: the issue's first run compiled it for
    4 minutes, inside "reading and tokenizing the training data", to use it for nothing."""
    import deepspeed.ops
    from deepspeed.comm.torch import build_shm_op

    one, _ = load_profile("tiny-cpu")
    two, _ = load_profile("tiny-cpu", ["hardware.gpus=2"])
    gpu, _ = load_profile("tiny-cpu", ["hardware.gpus=1", 'deepspeed.offload_optimizer="none"'])
    assert [build for _, build in dsops.run_ops(one)] == [dsops.build_cpu_adam]
    assert [build for _, build in dsops.run_ops(two)] == [dsops.build_cpu_adam, dsops.build_shm_comm]
    assert dsops.run_ops(gpu) == []
    shm = dsops._shm_builder()
    if shm is None:
        pytest.skip("DeepSpeed's accelerator here has no shared-memory op")
    compatible = deepspeed.ops.__compatible_ops__
    monkeypatch.setitem(compatible, shm.NAME, compatible.get(shm.NAME, False))  # put back after
    monkeypatch.setattr(dsops, "build_cpu_adam", lambda: None)
    dsops.ensure_ops(one)
    assert build_shm_op() is None, "DeepSpeed's communication starts without it: nothing to compile"
