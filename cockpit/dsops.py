"""DeepSpeed's JIT-built ops a run compiles: which, whether they are built, and building them.

DeepSpeed compiles its C++ ops (with ninja) into torch's extensions cache the first time they are used:
CPU Adam whenever the optimizer state is offloaded (100 to 180 s on a fresh environment), and on the CPU
accelerator its shared-memory communication op (about 35 s) as soon as its communication starts, both
with nothing on screen. The trainer asks `ensure_ops` before anything loads and says so in the record
while it builds; `cockpit doctor` reports them and `cockpit doctor --prebuild` builds them ahead.
Imports torch and DeepSpeed lazily.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cockpit.profiles import Profile

CPU_ADAM = "cpu_adam"
BUILD_NOTE = "building DeepSpeed CPU ops (first run in this environment, ~2 min)"


@dataclass(frozen=True)
class OpState:
    """One JIT-compiled DeepSpeed op as this environment has it."""

    name: str
    built: bool
    compatible: bool
    where: str  # "installed with DeepSpeed", or the extensions cache folder it is (or would be) built in
    reason: str = ""  # why it is not compatible

    @property
    def due(self) -> bool:
        """Not built yet, and buildable here: a run compiles it first."""
        return not self.built and self.compatible

    @property
    def describe(self) -> str:
        if self.built:
            return f"{self.name} built ({self.where})"
        if not self.compatible:
            return f"{self.name} cannot be built here: {self.reason or 'incompatible'}"
        return f"{self.name} not built yet (it would be compiled into {self.where} on first use)"


def ninja_first(path: str) -> str:
    """`path` (a PATH) with the ninja installed beside this interpreter found first, through a folder of the
    cockpit's cache that holds nothing but a link to it (so no compiler or other tool changes); `path`
    unchanged where no ninja is installed beside the interpreter.

    Ninja 1.13 (pip's `ninja`, a DeepSpeed dependency) keeps a build log that older system ninjas read as
    "too old; starting over", and the other way round: a run started from an activated environment and
    one started by the full path of its `cockpit` would each rebuild every op the other built, about 90 s
    before the first step on two cores."""
    from cockpit.cache import cache_root

    path = path or os.defpath
    beside = Path(sys.executable).parent / "ninja" if sys.executable else None
    if beside is None or not beside.is_file():
        return path
    tools = cache_root() / "tools" / hashlib.sha1(str(beside).encode()).hexdigest()[:12]
    link = tools / "ninja"
    try:
        tools.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(beside)
    except FileExistsError:  # another rank made it first
        pass
    except OSError:  # a read-only cache: the PATH as it was
        return path
    return os.pathsep.join([str(tools), *(p for p in path.split(os.pathsep) if p and p != str(tools))])


def needs_cpu_adam(profile: Profile) -> bool:
    """DeepSpeed runs its own CPU Adam whenever the optimizer state is offloaded (cpu or nvme)."""
    return profile.deepspeed.offload_optimizer != "none"


def needs_shm_comm(profile: Profile) -> bool:
    """A run on the CPU (`hardware.gpus = 0`) starts DeepSpeed's communication on the CPU accelerator,
    which loads its shared-memory op."""
    return profile.hardware.gpus == 0


def extensions_dir(name: str) -> Path:
    """The torch extensions folder an op named `name` is JIT-built into (honours TORCH_EXTENSIONS_DIR)."""
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(name, verbose=False))


def _builder() -> Any:  # the accelerator's CPUAdamBuilder
    from deepspeed.ops.op_builder import CPUAdamBuilder

    return CPUAdamBuilder()


def _shm_builder() -> Any | None:
    """The accelerator's shared-memory communication op: the CPU accelerator's; None elsewhere."""
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().create_op_builder("ShareMemCommBuilder")


def cpu_adam_state() -> OpState:
    """Whether DeepSpeed's CPU Adam is prebuilt in its wheel or already in the extensions cache."""
    return op_state(_builder())


def shm_comm_state() -> OpState | None:
    """The shared-memory communication op's state, where the accelerator has one (the CPU's)."""
    builder = _shm_builder()
    return op_state(builder) if builder is not None else None


def op_state(builder: Any) -> OpState:
    """Whether the op `builder` makes is prebuilt in DeepSpeed's wheel or already in the extensions cache."""
    from deepspeed.git_version_info import installed_ops

    name = builder.name
    if installed_ops.get(name, False):
        return OpState(name, True, True, "installed with DeepSpeed")
    folder = extensions_dir(name)
    compatible = bool(builder.is_compatible(verbose=False))
    reason = "; ".join(str(x) for x in getattr(builder, "error_log", None) or []) if not compatible else ""
    built = (folder / f"{name}.so").is_file()
    return OpState(name, built, compatible, str(folder), reason)


def run_ops(profile: Profile) -> list[tuple[Callable[[], OpState | None], Callable[[], None]]]:
    """(state, build) of each op a run of `profile` compiles here: CPU Adam when the optimizer state is
    offloaded, and for a run on the CPU (`hardware.gpus = 0`) the CPU accelerator's shared-memory op."""
    ops: list[tuple[Callable[[], OpState | None], Callable[[], None]]] = []
    if needs_cpu_adam(profile):
        ops.append((cpu_adam_state, build_cpu_adam))
    if needs_shm_comm(profile):
        ops.append((shm_comm_state, build_shm_comm))
    return ops


def ensure_ops(profile: Profile, before: Callable[[list[OpState]], None] | None = None) -> list[OpState]:
    """Build the ops a run of `profile` compiles that are not built yet and can be (an incompatible op
    fails in DeepSpeed, with its own words); `before` hears of them once, before the first build.
    Returns the states of the ops it built."""
    todo = [(state, build) for get, build in run_ops(profile) if (state := get()) is not None and state.due]
    if todo and before is not None:
        before([state for state, _ in todo])
    for _, build in todo:
        build()
    return [state for state, _ in todo]


def build_cpu_adam(verbose: bool = False) -> None:
    """Build (or load, if cached) DeepSpeed's CPU Adam; DeepSpeed reuses the loaded module afterwards."""
    _load(_builder(), verbose)


def build_shm_comm(verbose: bool = False) -> None:
    """Build (or load, if cached) the CPU accelerator's shared-memory communication op, if it has one."""
    builder = _shm_builder()
    if builder is not None:
        _load(builder, verbose)


def _load(builder: Any, verbose: bool) -> None:
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    os.environ["PATH"] = ninja_first(os.environ.get("PATH", ""))
    builder.load(verbose=verbose)
