"""DeepSpeed's CPU Adam op: whether a run needs it, whether it is built, and building it.

DeepSpeed compiles its CPU ops (C++, with ninja) into torch's extensions cache the first time they are
used, 100 to 180 s on a fresh environment with nothing on screen. The trainer asks `cpu_adam_state`
before training and says so in the record while it builds; `cockpit doctor` reports it and
`cockpit doctor --prebuild` builds it ahead. Imports torch and DeepSpeed lazily.
"""

from __future__ import annotations

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
    def describe(self) -> str:
        if self.built:
            return f"{self.name} built ({self.where})"
        if not self.compatible:
            return f"{self.name} cannot be built here: {self.reason or 'incompatible'}"
        return f"{self.name} not built yet (it would be compiled into {self.where} on first use)"


def interpreter_first(path: str) -> str:
    """`path` (a PATH) with this interpreter's folder first, so that DeepSpeed's op builds run the ninja
    installed beside it. Ninja 1.13 (pip's `ninja`, a DeepSpeed dependency) keeps a build log that older
    system ninjas read as "too old; starting over", and the other way round: a run started from an
    activated environment and one started by the full path of its `cockpit` would each rebuild every op
    the other built, about 90 s before the first step on two cores."""
    here = str(Path(sys.executable).parent)
    return os.pathsep.join([here, *(p for p in path.split(os.pathsep) if p and p != here)])


def needs_cpu_adam(profile: Profile) -> bool:
    """DeepSpeed runs its own CPU Adam whenever the optimizer state is offloaded (cpu or nvme)."""
    return profile.deepspeed.offload_optimizer != "none"


def extensions_dir(name: str) -> Path:
    """The torch extensions folder an op named `name` is JIT-built into (honours TORCH_EXTENSIONS_DIR)."""
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(name, verbose=False))


def _builder() -> Any:  # the accelerator's CPUAdamBuilder
    from deepspeed.ops.op_builder import CPUAdamBuilder

    return CPUAdamBuilder()


def cpu_adam_state() -> OpState:
    """Whether DeepSpeed's CPU Adam is prebuilt in its wheel or already in the extensions cache."""
    from deepspeed.git_version_info import installed_ops

    builder = _builder()
    name = builder.name
    if installed_ops.get(name, False):
        return OpState(name, True, True, "installed with DeepSpeed")
    folder = extensions_dir(name)
    compatible = bool(builder.is_compatible(verbose=False))
    reason = "; ".join(str(x) for x in getattr(builder, "error_log", None) or []) if not compatible else ""
    built = (folder / f"{name}.so").is_file()
    return OpState(name, built, compatible, str(folder), reason)


def ensure_cpu_adam(before: Callable[[OpState], None] | None = None) -> OpState | None:
    """Build DeepSpeed's CPU Adam unless it is built already or cannot be (an incompatible op fails in
    DeepSpeed, with its own words); `before` hears of a build about to start. Returns the state of the op
    it built, else None."""
    state = cpu_adam_state()
    if state.built or not state.compatible:
        return None
    if before is not None:
        before(state)
    build_cpu_adam()
    return state


def build_cpu_adam(verbose: bool = False) -> None:
    """Build (or load, if cached) DeepSpeed's CPU Adam; DeepSpeed reuses the loaded module afterwards."""
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    os.environ["PATH"] = interpreter_first(os.environ.get("PATH", ""))
    _builder().load(verbose=verbose)
