"""Torch's extensions folder as DeepSpeed's ops use it: one per environment, a stale build lock found and
removed, and "built" meaning what the loader will do (a real, tiny op, compiled by torch's loader)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cockpit.ops import dsops, extcache
from cockpit.profiles import load_profile
from cockpit.service import doctor
from cockpit.service.ninja_plan import rebuild_reason

# Whether a build would be compiled again: the folder's files (the trainer's build phase), or ninja's dry
# run (the doctor's, from the service).
CHECKS = {"files": None, "ninja": rebuild_reason}

SOURCE = 'extern "C" int cockpit_tiny_op() { return 7; }\n'


class TinyBuilder:
    """A stand-in for a DeepSpeed op builder: `jit_load` calls torch's loader as DeepSpeed's does, with
    `flag` standing for what differs between two environments' compile commands."""

    def __init__(self, source: Path, flag: str = "-DCOCKPIT_A", name: str = "cockpit_tiny_op") -> None:
        self.name, self.source, self.flag = name, source, flag

    def is_compatible(self, verbose: bool = False) -> bool:
        return True

    def jit_load(self, verbose: bool = False) -> Any:
        from torch.utils.cpp_extension import load

        return load(
            name=self.name,
            sources=[str(self.source)],
            extra_cflags=[self.flag],
            is_python_module=False,
            verbose=verbose,
        )

    load = jit_load


@pytest.fixture
def ext_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty extensions folder, and torch's loader as in a new process: its in-process versions
    (a second load of a name with other arguments builds `<name>_v1`) forgotten before and after."""
    from torch.utils.cpp_extension import JIT_EXTENSION_VERSIONER

    folder = tmp_path / "torch_extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(folder))
    JIT_EXTENSION_VERSIONER.entries.clear()
    yield folder
    JIT_EXTENSION_VERSIONER.entries.clear()


def _new_process() -> None:
    """Forget what this process's loader built, as a run starting in another process would."""
    from torch.utils.cpp_extension import JIT_EXTENSION_VERSIONER

    JIT_EXTENSION_VERSIONER.entries.clear()


def _built(tmp_path: Path) -> TinyBuilder:
    """The tiny op compiled the way a run builds an op (`dsops._load`: the ninja beside the interpreter)."""
    source = tmp_path / "tiny.cpp"
    source.write_text(SOURCE)
    builder = TinyBuilder(source)
    dsops._load(builder, verbose=False)
    return builder


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


@pytest.mark.parametrize("how", CHECKS)
def test_a_build_of_this_environment_is_built_and_another_environments_is_not(
    ext_dir: Path, tmp_path: Path, how: str
) -> None:
    """Issue 27, item 3: a `.so` in the folder was taken for built although DeepSpeed would compile it
    again (built by another environment's commands, or older than its sources)."""
    check = CHECKS[how]
    builder = _built(tmp_path)
    folder = ext_dir / builder.name
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    state = dsops.op_state(builder, check)
    assert state.built and not state.rebuild and state.where == str(folder)
    other = dsops.op_state(TinyBuilder(builder.source, flag="-DCOCKPIT_B"), check)
    assert not other.built and other.due and "other compile commands" in other.rebuild
    assert "would be compiled again on first use" in other.describe
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before, "asked, not built"
    later = time.time() + 5
    os.utime(builder.source, (later, later))
    stale = dsops.op_state(builder, check)
    assert not stale.built and stale.rebuild == "its sources changed since it was built"
    assert not dsops.op_state(TinyBuilder(builder.source, name="cockpit_never_built"), check).built


def test_only_ninja_sees_a_changed_header(ext_dir: Path, tmp_path: Path) -> None:
    """The folder's files know the op's sources, not the headers they include (ninja's deps log does): the
    trainer's build phase then compiles unannounced, the doctor still says it will."""
    header = tmp_path / "tiny.h"
    header.write_text("#define COCKPIT_SEVEN 7\n")
    source = tmp_path / "tiny.cpp"
    source.write_text('#include "tiny.h"\nextern "C" int cockpit_tiny_op() { return COCKPIT_SEVEN; }\n')
    builder = TinyBuilder(source)
    dsops._load(builder, verbose=False)
    later = time.time() + 5
    os.utime(header, (later, later))
    assert dsops.op_state(builder).built
    ninja = dsops.op_state(builder, rebuild_reason)
    assert not ninja.built and ninja.rebuild == "its sources changed since it was built"


@pytest.mark.parametrize("how", CHECKS)
def test_an_empty_so_without_a_build_log_is_not_a_build(ext_dir: Path, tmp_path: Path, how: str) -> None:
    source = tmp_path / "tiny.cpp"
    source.write_text(SOURCE)
    (ext_dir / "cockpit_tiny_op").mkdir(parents=True)
    (ext_dir / "cockpit_tiny_op" / "cockpit_tiny_op.so").write_bytes(b"")
    state = dsops.op_state(TinyBuilder(source), CHECKS[how])
    assert not state.built and state.due and state.rebuild


def test_a_lock_left_by_a_killed_build_is_stale_and_one_being_built_is_not(tmp_path: Path) -> None:
    """Issue 27, item 2: torch's loader waits forever on a `lock` no process will remove."""
    folder = tmp_path / "cpu_adam"
    folder.mkdir()
    assert extcache.build_lock(folder) is None
    (folder / "lock").touch()
    young = extcache.build_lock(folder)
    assert young is not None and not young.stale, "a build that has not started its compiler yet"
    _age(folder / "lock", extcache.LOCK_GRACE_S + 5)
    old = extcache.build_lock(folder)
    assert old.stale and not old.builders
    line = old.describe()
    assert len(line.splitlines()) == 1 and str(folder / "lock") in line and "stale" in line
    compiler = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=folder)
    try:  # a process working in the folder, as ninja and the compiler do: a build is running
        held = extcache.build_lock(folder)
        assert compiler.pid in held.builders and not held.stale
        assert extcache.clear_stale_lock(folder) is None and (folder / "lock").exists()
    finally:
        compiler.kill()
        compiler.wait()
    _age(folder / "lock", extcache.LOCK_MAX_S + 5)
    assert extcache.build_lock(folder).stale, "older than any build, whoever is in the folder"
    removed = extcache.clear_stale_lock(folder)
    assert removed is not None and not (folder / "lock").exists()


def test_the_build_phase_removes_a_stale_lock_and_says_so(
    ext_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's repro: a built op with a `lock` left in its folder hung every later run at "building the
    DeepSpeed engine". The build phase removes it, in a line of its own, then loads the op."""
    from trainer.ops import build_ops

    builder = _built(tmp_path)
    lock = ext_dir / builder.name / "lock"
    lock.touch()
    _age(lock, extcache.LOCK_GRACE_S + 30)
    loaded: list[str] = []
    monkeypatch.setattr(
        dsops,
        "run_ops",
        lambda _p, check=None: [(lambda: dsops.op_state(builder, check), lambda: loaded.append("tiny"))],
    )
    phases: list[dict[str, Any]] = []
    profile, _ = load_profile("tiny-cpu")
    assert build_ops(profile, lambda name, **f: phases.append({"phase": name, **f})) == []
    assert not lock.exists() and loaded == ["tiny"]
    assert [p["phase"] for p in phases] == ["build"]
    assert phases[0]["message"].startswith(f"removed a stale build lock {lock} (")


def test_doctor_names_a_stale_lock_in_one_line_and_prebuild_removes_it(
    ext_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builder = _built(tmp_path)
    lock = ext_dir / builder.name / "lock"
    lock.touch()
    _age(lock, 2 * extcache.LOCK_GRACE_S)
    state = dsops.op_state(builder)
    assert state.built and state.lock is not None and state.lock.stale
    profile, _ = load_profile("tiny-cpu")
    check = doctor.check_cpu_adam(profile, state)
    assert check.status == "warn" and len(check.reason.splitlines()) == 1
    assert f"a stale build lock {lock}" in check.reason and check.facts["lock"]["stale"] is True
    monkeypatch.setattr(
        dsops, "run_ops", lambda _p, check=None: [(lambda: dsops.op_state(builder, check), builder.load)]
    )
    said: list[str] = []
    result = doctor.prebuild(profile, said.append)
    assert not lock.exists() and result.status == "ok" and result.reason.startswith("nothing to compile")
    assert any(f"removed a stale build lock {lock}" in line for line in said)


def test_prebuild_compiles_what_deepspeed_would_compile_again(
    ext_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--prebuild` said "nothing to do" for another environment's build; the run then compiled for
    minutes under "building the DeepSpeed engine"."""
    _built(tmp_path)
    other = TinyBuilder(tmp_path / "tiny.cpp", flag="-DCOCKPIT_B")
    _new_process()
    checks: list[Any] = []

    def run_ops(_profile: Any, check: Any = None) -> list[Any]:
        checks.append(check)
        return [(lambda: dsops.op_state(other, check), other.load)]

    monkeypatch.setattr(dsops, "run_ops", run_ops)
    profile, _ = load_profile("tiny-cpu")
    said: list[str] = []
    result = doctor.prebuild(profile, said.append)
    assert checks == [rebuild_reason], "the doctor asks ninja"
    assert result.status == "ok" and result.reason.startswith(f"built {other.name} in ")
    assert said[0].startswith(f"compiling DeepSpeed's {other.name} op again: it was built with other")
    assert dsops.op_state(other).built


def test_each_environment_builds_into_its_own_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    from cockpit.service.spawn import child_env

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    mine = extcache.keyed_root()
    assert extcache.keyed_root("/some/other/venv") != mine
    assert mine.parent.name == "torch_extensions" and Path(sys.prefix).name.lstrip(".") in mine.name
    assert not mine.name.startswith("."), "a folder `ls` shows"
    assert child_env()["TORCH_EXTENSIONS_DIR"] == str(mine), "the supervisor's children get it"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/chosen/by/the/user")
    assert child_env()["TORCH_EXTENSIONS_DIR"] == "/chosen/by/the/user"


def test_a_fresh_lock_is_waited_for_and_removed_once_no_build_holds_it(
    ext_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's repro touches the lock just before the run: young, so possibly a build starting. The
    build phase waits as torch would, but only until it is plainly stale (torch waits forever)."""
    from trainer.ops import build_ops

    builder = _built(tmp_path)
    lock = ext_dir / builder.name / "lock"
    lock.touch()

    def time_passes(_s: float) -> None:  # the wait's first poll: the lock is past its grace now
        monkeypatch.setattr(extcache, "LOCK_GRACE_S", -1.0)

    wait = extcache.wait_unlocked
    monkeypatch.setattr(extcache, "wait_unlocked", lambda folder: wait(folder, sleep=time_passes))
    monkeypatch.setattr(
        dsops, "run_ops", lambda _p, check=None: [(lambda: dsops.op_state(builder, check), builder.load)]
    )
    phases: list[str] = []
    profile, _ = load_profile("tiny-cpu")
    assert build_ops(profile, lambda name, **f: phases.append(f["message"])) == []
    assert not lock.exists() and len(phases) == 2
    assert phases[0].startswith(f"waiting for another process's build of {builder.name}")
    assert phases[1].startswith(f"removed a stale build lock {lock}")


def test_a_lock_its_build_removes_is_waited_for_and_left_to_it(
    ext_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builder = _built(tmp_path)
    lock = ext_dir / builder.name / "lock"
    lock.touch()
    # Another process's build: it works in the folder, and removes its lock when it is done.
    other = subprocess.Popen(
        [sys.executable, "-c", "import os, time; time.sleep(2); os.remove('lock')"], cwd=lock.parent
    )
    monkeypatch.setattr(extcache, "LOCK_GRACE_S", 0.0)  # no grace: only the process in the folder holds it
    monkeypatch.setattr(
        dsops, "run_ops", lambda _p, check=None: [(lambda: dsops.op_state(builder, check), builder.load)]
    )
    said: list[str] = []
    profile, _ = load_profile("tiny-cpu")
    try:
        assert dsops.ensure_ops(profile, lambda _s, words: said.append(words)) == []
    finally:
        other.wait()
    assert other.returncode == 0, "the other build removed its own lock"
    assert [w.split(" of ")[0] for w in said] == ["waiting for another process's build"]


def test_the_cpus_facts_are_asked_once_a_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSpeed asked py-cpuinfo (a subprocess of 1 to 3 s on a busy machine) twice for each op's flags,
    again for the look at what the loader would do, and again in its CPU Adam: most of what loading built
    ops cost before the first step."""
    import cpuinfo
    import cpuinfo.cpuinfo

    original = getattr(cpuinfo.get_cpu_info, "__wrapped__", cpuinfo.get_cpu_info)
    monkeypatch.setattr(cpuinfo, "get_cpu_info", original)  # as a new process has it; put back after
    asked: list[int] = []
    real = cpuinfo.cpuinfo.get_cpu_info_json  # what get_cpu_info runs: a subprocess
    monkeypatch.setattr(cpuinfo.cpuinfo, "get_cpu_info_json", lambda: asked.append(1) or real())
    for _ in range(2):
        extcache.load_arguments(dsops._builder())  # the look a run takes, then the load's own flags
    assert len(asked) == 4, "DeepSpeed asks for its architecture and its SIMD width each time"
    asked.clear()
    dsops.cpu_info_once()
    for _ in range(2):
        extcache.load_arguments(dsops._builder())
    from cpuinfo import get_cpu_info  # as DeepSpeed's CPU Adam does

    get_cpu_info()["flags"].append("changed by one caller")
    assert len(asked) == 1 and "changed by one caller" not in get_cpu_info()["flags"]
