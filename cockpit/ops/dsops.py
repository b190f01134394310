"""DeepSpeed's JIT-built ops a run compiles: which, whether they are built, and building them.

DeepSpeed compiles its C++ ops (with ninja) into torch's extensions cache the first time they are used:
CPU Adam whenever the optimizer state is offloaded (100 to 330 s on two cores), and on the CPU
accelerator its shared-memory communication op (35 to 60 s) as soon as its communication starts, both
with nothing on screen. "Built" means what DeepSpeed's loader will find: a `.so` that another environment
built, or that its sources outdate, is compiled again, and a lock left by a killed build makes every load
wait (`extcache.build_lock`). Whether it would compile again is a check the caller chooses
(`extcache.RebuildCheck`): by default the folder's own files (`extcache.recorded_rebuild_reason`, no
process started), or ninja's dry run, which the doctor passes from the service
(`cockpit.service.ninja_plan.rebuild_reason`, which also sees a changed header or another ninja's log).
The trainer's build phase loads every op a run uses with `ensure_ops` before anything else, each compile
it foresees its own `build` phase, so nothing compiles later, inside another phase; `cockpit doctor`
reports them and `--prebuild` builds them ahead.
The ops are built in this environment's own folder (`extcache.use_keyed_root`).
Imports torch and DeepSpeed lazily.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cockpit.ops import extcache
from cockpit.profiles import Profile

CPU_ADAM = "cpu_adam"
# How long a compile takes on two busy cores, for the words said before it (measured: fresh_clone).
BUILD_TIME = {CPU_ADAM: "2 to 6 min", "deepspeed_shm_comm": "about 1 min"}


@dataclass(frozen=True)
class OpState:
    """One JIT-compiled DeepSpeed op as this environment has it."""

    name: str
    built: bool
    compatible: bool
    where: str  # "installed with DeepSpeed", or the extensions cache folder it is (or would be) built in
    reason: str = ""  # why it is not compatible
    rebuild: str = ""  # why DeepSpeed would compile it again though its folder holds a build
    lock: extcache.Lock | None = None  # torch's build lock in its folder, if one is there

    @property
    def due(self) -> bool:
        """Not built for this environment (or outdated), and buildable here: a run compiles it first."""
        return not self.built and self.compatible

    @property
    def describe(self) -> str:
        lock = f"; {self.lock.describe()}" if self.lock is not None else ""
        if self.built:
            return f"{self.name} built ({self.where}){lock}"
        if not self.compatible:
            return f"{self.name} cannot be built here: {self.reason or 'incompatible'}"
        if self.rebuild:
            return f"{self.name} would be compiled again on first use: {self.rebuild} ({self.where}){lock}"
        return f"{self.name} not built yet (it would be compiled into {self.where} on first use){lock}"

    @property
    def compile_words(self) -> str:
        """What the build phase says before compiling it."""
        why = f"again: {self.rebuild}" if self.rebuild else "(not built in this environment yet)"
        took = BUILD_TIME.get(self.name, "minutes")
        return f"compiling DeepSpeed's {self.name} op {why}; {took} on two cores, once per environment"


def ninja_first(path: str) -> str:
    """`path` (a PATH) with the ninja installed beside this interpreter found first, through a folder of the
    cockpit's cache that holds nothing but a link to it (so no compiler or other tool changes); `path`
    unchanged where no ninja is installed beside the interpreter.

    Ninja 1.13 (pip's `ninja`, a DeepSpeed dependency) keeps a build log that older system ninjas read as
    "too old; starting over", and the other way round: a run started from an activated environment and
    one started by the full path of its `cockpit` would each rebuild every op the other built, about 90 s
    before the first step on two cores.

    The folder goes first on the ranks' PATH, so it is trusted only as `cache.private_link` leaves it:
    ours, 0700, under folders no one else can write, holding nothing but the link to this interpreter's
    ninja (anything else found there is removed); a cache where that cannot be (another user's, one
    others can write, read-only) leaves the PATH as it was."""
    from cockpit.cache import cache_root, private_link

    path = path or os.defpath
    beside = Path(sys.executable).parent / "ninja" if sys.executable else None
    if beside is None or not beside.is_file():
        return path
    tools = cache_root() / "tools" / hashlib.sha1(str(beside).encode()).hexdigest()[:12]
    if not private_link(tools, "ninja", beside):
        return path
    return os.pathsep.join([str(tools), *(p for p in path.split(os.pathsep) if p and p != str(tools))])


def needs_cpu_adam(profile: Profile) -> bool:
    """DeepSpeed runs its own CPU Adam whenever the optimizer state is offloaded (cpu or nvme)."""
    return profile.deepspeed.offload_optimizer != "none"


def needs_shm_comm(profile: Profile) -> bool:
    """Several ranks share a node: DeepSpeed's communication on the CPU accelerator loads its shared-memory
    op for them (only the CPU accelerator has it: `shm_comm_state` is None elsewhere, so is a run on GPUs).
    A single rank has no peer to share memory with: `shm_comm_off`."""
    return profile.ranks_per_node > 1


def shm_comm_off() -> None:
    """Tell DeepSpeed's CPU communication not to load its shared-memory op, for a run with one rank a node:
    it would compile it first (35 s on two idle cores, minutes on a busy machine) and use it for nothing.
    DeepSpeed keeps the compatible ops in one dict, read when its communication starts."""
    builder = _shm_builder()
    if builder is not None:
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__[builder.NAME] = False


def cpu_info_once() -> None:
    """py-cpuinfo's `get_cpu_info` answered once a process. DeepSpeed asks it for every op's compile flags
    (twice an op: its architecture and its SIMD width, and again for our look at what the loader would do)
    and in its CPU Adam, each time a subprocess of 1 to 3 s on a busy machine, about a CPU that does not
    change: 5 of the 6 s a run spent on ops that were already built."""
    try:
        import cpuinfo
    except ImportError:
        return
    ask = cpuinfo.get_cpu_info
    if getattr(ask, "cockpit_once", False):
        return
    cached = functools.cache(ask)

    def once() -> dict[str, Any]:
        return copy.deepcopy(cached())  # each caller its own copy, as before

    once.cockpit_once = True  # type: ignore[attr-defined]
    once.__wrapped__ = ask  # type: ignore[attr-defined]
    cpuinfo.get_cpu_info = once


def extensions_dir(name: str) -> Path:
    """The torch extensions folder an op named `name` is JIT-built into: under TORCH_EXTENSIONS_DIR, which
    is this environment's own folder unless the user set it (`extcache.use_keyed_root`)."""
    from torch.utils.cpp_extension import _get_build_directory

    extcache.use_keyed_root(os.environ)

    return Path(_get_build_directory(name, verbose=False))


def _quiet_import() -> None:
    """Import DeepSpeed with its logger writing to stderr. It logs to stdout (its accelerator's "Setting
    accelerator to CPU" warning), which mixed into a command's answer: `cockpit doctor --format json`
    printed a log line before its JSON. In the trainer both streams go to `output.log` alike."""
    if "deepspeed" not in sys.modules:
        with contextlib.redirect_stdout(sys.stderr):
            import deepspeed  # noqa: F401


def _builder() -> Any:  # the accelerator's CPUAdamBuilder
    _quiet_import()
    from deepspeed.ops.op_builder import CPUAdamBuilder

    return CPUAdamBuilder()


def _shm_builder() -> Any | None:
    """The accelerator's shared-memory communication op: the CPU accelerator's; None elsewhere."""
    _quiet_import()
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().create_op_builder("ShareMemCommBuilder")


def cpu_adam_state(check: extcache.RebuildCheck | None = None) -> OpState:
    """Whether DeepSpeed's CPU Adam is prebuilt in its wheel or already in the extensions cache."""
    return op_state(_builder(), check)


def shm_comm_state(check: extcache.RebuildCheck | None = None) -> OpState | None:
    """The shared-memory communication op's state, where the accelerator has one (the CPU's)."""
    builder = _shm_builder()
    return op_state(builder, check) if builder is not None else None


def op_state(builder: Any, check: extcache.RebuildCheck | None = None) -> OpState:
    """What DeepSpeed's loader will do with the op `builder` makes: load it from its wheel, load this
    environment's build as it is, or compile it (not built, or outdated: `check` says, by default
    `extcache.recorded_rebuild_reason`); and any build lock in its way."""
    _quiet_import()
    from deepspeed.git_version_info import installed_ops

    cpu_info_once()
    name = builder.name
    if installed_ops.get(name, False):
        return OpState(name, True, True, "installed with DeepSpeed")
    folder = extensions_dir(name)
    lock = extcache.build_lock(folder)
    compatible = bool(builder.is_compatible(verbose=False))
    reason = "; ".join(str(x) for x in getattr(builder, "error_log", None) or []) if not compatible else ""
    rebuild = ""
    if compatible and (folder / f"{name}.so").is_file():
        try:
            would_rebuild = check or extcache.recorded_rebuild_reason
            rebuild = would_rebuild(builder, folder, ninja_first(os.environ.get("PATH", "")))
        except Exception as exc:  # cannot tell: a run loads it in its build phase, announced
            rebuild = f"cannot tell whether it is up to date ({type(exc).__name__}: {exc})"
        built = not rebuild
    else:
        built = False
    return OpState(name, built, compatible, str(folder), reason, rebuild, lock)


def run_ops(
    profile: Profile, check: extcache.RebuildCheck | None = None
) -> list[tuple[Callable[[], OpState | None], Callable[[], None]]]:
    """(state, build) of each op a run of `profile` compiles here: CPU Adam when the optimizer state is
    offloaded, and the CPU accelerator's shared-memory op for several ranks a node (`needs_shm_comm`); each
    state as `check` tells whether a build would be compiled again (`op_state`)."""
    ops: list[tuple[Callable[[], OpState | None], Callable[[], None]]] = []
    if needs_cpu_adam(profile):
        ops.append((functools.partial(cpu_adam_state, check), build_cpu_adam))
    if needs_shm_comm(profile):
        ops.append((functools.partial(shm_comm_state, check), build_shm_comm))
    return ops


def ensure_ops(
    profile: Profile,
    announce: Callable[[OpState, str], None] | None = None,
    check: extcache.RebuildCheck | None = None,
) -> list[OpState]:
    """Load every op a run of `profile` uses, so that DeepSpeed finds them loaded later and compiles
    nothing unannounced. `announce(state, words)` hears, before it happens, of each op that compiles (not
    built for this environment, or outdated), each on its own, of a wait for another process's build, and
    of a stale lock a killed build left (removed: `extcache.clear_stale_lock`). An incompatible op is left
    to fail in DeepSpeed, with its own words. With one rank a node, DeepSpeed's shared-memory op is turned
    off (`shm_comm_off`). `check` tells whether a build would be compiled again (`op_state`). Returns the
    states of the ops compiled."""
    say = announce or (lambda _state, _words: None)
    if not needs_shm_comm(profile):
        shm_comm_off()
    compiled: list[OpState] = []
    for get, load in run_ops(profile, check):
        state = get()
        if state is None or not state.compatible:
            continue
        if state.lock is not None:
            if not state.lock.stale:
                say(state, f"waiting for another process's build of {state.name} in {state.where}")
            removed = extcache.wait_unlocked(Path(state.where))
            if removed is not None:
                words = f"a build that was killed left it; no build running, {removed.age_s:.0f} s old"
                say(state, f"removed a stale build lock {removed.path} ({words})")
            state = get() or state  # what the other build, or none, left
        if state.due:
            say(state, state.compile_words)
            compiled.append(state)
        load()
    return compiled


def build_cpu_adam(verbose: bool = False) -> None:
    """Build (or load, if cached) DeepSpeed's CPU Adam; DeepSpeed reuses the loaded module afterwards."""
    _load(_builder(), verbose)


def build_shm_comm(verbose: bool = False) -> None:
    """Build (or load, if cached) the CPU accelerator's shared-memory communication op, if it has one."""
    builder = _shm_builder()
    if builder is not None:
        _load(builder, verbose)


def _load(builder: Any, verbose: bool) -> None:
    cpu_info_once()
    extcache.use_keyed_root(os.environ)
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    os.environ["PATH"] = ninja_first(os.environ.get("PATH", ""))
    builder.load(verbose=verbose)
