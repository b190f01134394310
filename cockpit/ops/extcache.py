"""Torch's JIT extensions folder, as DeepSpeed's ops use it: where, its build lock, and what would rebuild.

- **Where.** Torch builds every environment's ops into one `~/.cache/torch_extensions/py311_cpu/<op>`:
  two virtual environments then rebuild each other's ops on load (their compile commands differ, so
  ninja starts over). `use_keyed_root` gives each environment its own folder (`keyed_root`), unless the
  user set `TORCH_EXTENSIONS_DIR`; the supervisor passes it down to every child.
- **The lock.** Torch's loader takes the folder's `lock` file (`torch.utils.file_baton.FileBaton`: an
  `O_EXCL` file, no process id in it) for the build and removes it after; a process that finds it waits,
  without a limit, for it to go. A build that was killed leaves it, and every later load waits forever.
  `build_lock` says whether one is there and whether a build is really running (ninja and the compiler
  run inside the folder); `clear_stale_lock` removes one that no build holds.
- **What would rebuild.** Torch's loader writes the op's `build.ninja` for this environment and runs
  ninja, which compiles again whatever its log says was built by another command or is older than its
  sources. `write_build_file` writes the build file this environment would write; `recorded_reason` says
  what the folder's own files tell against it (no record, other compile commands, a newer source), and
  `recorded_rebuild_reason` is the check made of it, which needs no process: the trainer's build phase
  announces a compile with it. The service asks ninja itself (`cockpit.service.ninja_plan`, a dry run),
  which also sees an older ninja's log and changed headers: the doctor passes that check to `dsops`.

Imports torch lazily, and only to write a build file.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

ENV = "TORCH_EXTENSIONS_DIR"
# A lock younger than this may be a build that has not started its compiler yet (torch writes the build
# file and asks the compiler its version first): never taken for stale.
LOCK_GRACE_S = 60.0
# No op build takes this long, even on two busy cores (cpu_adam: 100 to 330 s): a lock this old is stale
# whoever is in the folder.
LOCK_MAX_S = 3 * 3600.0
SOURCES_CHANGED = "its sources changed since it was built"
# Why torch's loader would compile an op again though its folder holds a build: (its DeepSpeed builder,
# the folder, the PATH the build finds ninja on) -> the reason in words, "" when it would load it as it is.
RebuildCheck = Callable[[Any, Path, str], str]


def keyed_root(prefix: str | None = None) -> Path:
    """This environment's own extensions folder: under torch's default root (`$XDG_CACHE_HOME` or
    `~/.cache`, `torch_extensions/`), one folder per interpreter prefix, Python and torch version."""
    prefix = os.path.realpath(prefix or sys.prefix)
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "none"
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    digest = hashlib.sha1(f"{prefix}\0{py}\0{torch_version}".encode()).hexdigest()[:10]
    folder = Path(prefix).name.lstrip(".") or "python"  # `.venv`: a visible name all the same
    name = f"{folder}-{py}-torch{torch_version}-{digest}".replace("+", "_")
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return base / "torch_extensions" / name


def use_keyed_root(env: MutableMapping[str, str]) -> str:
    """Set `TORCH_EXTENSIONS_DIR` in `env` to this environment's folder unless it is set; its value."""
    if not env.get(ENV):
        env[ENV] = str(keyed_root())
    return env[ENV]


# --- the lock ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Lock:
    """A build lock found in an op's folder: how old, and which processes work in the folder."""

    path: Path
    age_s: float
    builders: tuple[int, ...] = field(default=())  # processes (ninja, the compiler) inside the folder

    @property
    def stale(self) -> bool:
        """No build holds it: nothing works in the folder and it is past the grace, or it is older than
        any build."""
        return (not self.builders and self.age_s > LOCK_GRACE_S) or self.age_s > LOCK_MAX_S

    def describe(self) -> str:
        """One line: whose lock it is and what it does to a run."""
        age = f"{self.age_s:.0f} s"
        if self.stale:
            return (
                f"a stale build lock {self.path} ({age} old, no build running), left by a killed build: "
                "a load would wait for it forever; a run removes it first, `cockpit doctor --prebuild` now"
            )
        if self.builders:
            who = ", ".join(map(str, self.builders))
            return (
                f"a build is running in {self.path.parent} (process {who}, lock {age} old): runs wait for it"
            )
        return (
            f"a build lock {self.path} ({age} old, no build in the folder yet: one starting, or one killed, "
            f"which a run removes once it is {LOCK_GRACE_S:.0f} s old)"
        )


def _builders(folder: Path) -> tuple[int, ...]:
    """Processes whose working directory is `folder` (torch runs ninja there; the compiler inherits it)."""
    import psutil

    inside = []
    target = os.path.realpath(folder)
    for proc in psutil.process_iter(["pid"]):
        try:
            cwd = proc.cwd()
        except (psutil.Error, OSError):
            continue
        if cwd == target or cwd.startswith(target + os.sep):
            inside.append(proc.info["pid"])
    return tuple(inside)


def build_lock(folder: Path, now: float | None = None) -> Lock | None:
    """The lock in an op's build folder, if there is one."""
    path = Path(folder) / "lock"
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return None
    now = time.time() if now is None else now
    return Lock(path, max(0.0, now - mtime), _builders(Path(folder)))


def clear_stale_lock(folder: Path) -> Lock | None:
    """Remove the folder's lock if it is stale (`Lock.stale`); the lock removed, or None."""
    lock = build_lock(folder)
    if lock is None or not lock.stale:
        return None
    try:
        lock.path.unlink()
    except FileNotFoundError:  # its build ended meanwhile
        return None
    return lock


def wait_unlocked(
    folder: Path, poll_s: float = 1.0, sleep: Callable[[float], None] = time.sleep
) -> Lock | None:
    """Wait while a build holds the folder's lock, as torch's loader would, but remove the lock once it is
    stale (torch's loader waits for it forever). The stale lock removed, or None."""
    while (lock := build_lock(folder)) is not None:
        if lock.stale:
            removed = clear_stale_lock(folder)
            if removed is not None:
                return removed
        sleep(poll_s)
    return None


# --- what torch's loader would build ---------------------------------------------------------------------
class _Captured(Exception):
    """Raised in place of torch's `load`: DeepSpeed's arguments for it are in `arguments`."""

    def __init__(self, args: dict[str, Any]) -> None:
        super().__init__("captured")
        self.arguments = args


def load_arguments(builder: Any) -> dict[str, Any]:
    """The arguments DeepSpeed's `builder.jit_load` passes to `torch.utils.cpp_extension.load` here
    (its flags, sources and include paths as this environment computes them), without loading."""
    import torch.utils.cpp_extension as ext

    real = ext.load

    def capture(**kwargs: Any) -> Any:
        raise _Captured(kwargs)

    ext.load = capture
    try:
        builder.jit_load(verbose=False)
    except _Captured as got:
        return got.arguments
    finally:
        ext.load = real
    raise RuntimeError(f"DeepSpeed's {builder.name} builder loaded without calling torch's loader")


def _call(fn: Any, **kwargs: Any) -> Any:
    """`fn` with those of `kwargs` it takes (torch's private helpers gain arguments between versions)."""
    accepted = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in kwargs.items() if k in accepted})


def write_build_file(args: dict[str, Any], path: Path) -> None:
    """The `build.ninja` torch's loader writes for `args` (`load_arguments`) in this environment."""
    import torch.utils.cpp_extension as ext

    sources = list(args["sources"])
    with_cuda = args.get("with_cuda")
    with_cuda = any(map(ext._is_cuda_file, sources)) if with_cuda is None else with_cuda
    with_sycl = args.get("with_sycl")
    is_sycl = getattr(ext, "_is_sycl_file", lambda _f: False)
    with_sycl = any(map(is_sycl, sources)) if with_sycl is None else with_sycl
    ldflags = _call(
        ext._prepare_ldflags,
        extra_ldflags=list(args.get("extra_ldflags") or []),
        with_cuda=with_cuda,
        with_sycl=with_sycl,
        verbose=False,
        is_standalone=False,
    )
    _call(
        ext._write_ninja_file_to_build_library,
        path=str(path),
        name=args["name"],
        sources=sources,
        extra_cflags=list(args.get("extra_cflags") or []),
        extra_cuda_cflags=list(args.get("extra_cuda_cflags") or []),
        extra_sycl_cflags=list(args.get("extra_sycl_cflags") or []),
        extra_ldflags=ldflags,
        extra_include_paths=list(args.get("extra_include_paths") or []),
        with_cuda=with_cuda,
        with_sycl=with_sycl,
        is_standalone=False,
    )


def recorded_reason(folder: Path, build_file: Path, sources: Iterable[str] = ()) -> str:
    """Why the build recorded in `folder` is not what `build_file` (this environment's) would build, as the
    folder's files tell without asking ninja: no record of a build, other compile commands, or one of
    `sources` newer than the op's library; "" when they agree."""
    folder = Path(folder)
    old = folder / "build.ninja"
    if not old.is_file() or not (folder / ".ninja_log").is_file():
        return "no record of its build here (build.ninja, .ninja_log)"
    if old.read_text() != Path(build_file).read_text():
        return "it was built with other compile commands (another environment, or other flags)"
    libraries = [p.stat().st_mtime for p in folder.glob("*.so")]
    newest_source = max((os.path.getmtime(s) for s in sources if os.path.exists(s)), default=None)
    if libraries and newest_source is not None and newest_source > min(libraries):
        return SOURCES_CHANGED
    return ""


def recorded_rebuild_reason(builder: Any, folder: Path, path: str = "") -> str:
    """The `RebuildCheck` that starts no process: `recorded_reason` for the build file this environment
    would write for `builder`'s op (`path` is not needed: ninja is not asked)."""
    with tempfile.TemporaryDirectory(prefix="cockpit-build-") as tmp:
        build_file = Path(tmp) / "build.ninja"
        args = load_arguments(builder)
        write_build_file(args, build_file)
        return recorded_reason(folder, build_file, args.get("sources") or ())
