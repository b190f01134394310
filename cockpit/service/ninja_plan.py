"""What ninja would compile in an op's build folder, asked without building: a dry run (`ninja -n`).

Torch's loader writes the op's `build.ninja` for this environment and runs ninja, which compiles again
whatever its log says was built by another command or is older than its sources (headers included,
through its deps log), and starts over on a log another ninja version wrote. `ninja_plan` asks ninja
that question over the build file this environment would write (`cockpit.ops.extcache.write_build_file`),
in a stand-in of the folder, so nothing in it changes. `rebuild_reason` is the check the doctor passes to
`cockpit.ops.dsops` (a process: only the service starts one); the trainer's build phase reads the
folder's files instead (`extcache.recorded_rebuild_reason`).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cockpit.ops.extcache import SOURCES_CHANGED, load_arguments, recorded_reason, write_build_file

# What ninja itself keeps in a build folder: copied, so that a dry run cannot change the real ones (a ninja
# of another version rewrites an older log even with -n). The lock and the build file are not copied.
NINJA_STATE = (".ninja_log", ".ninja_deps")
NOT_COPIED = ("build.ninja", "lock", ".ninja_lock")


@dataclass(frozen=True)
class Plan:
    """What ninja would do in an op's folder with this environment's build file."""

    commands: int  # compile and link commands it would run (0: up to date)
    why: str = ""  # in words, when it would run some


def _shadow(folder: Path, into: Path) -> None:
    """`into` made a stand-in for `folder`: ninja's state copied, the outputs linked (ninja reads their
    times through the links)."""
    for entry in Path(folder).iterdir():
        if entry.name in NINJA_STATE:
            shutil.copy2(entry, into / entry.name)
        elif entry.name not in NOT_COPIED:
            (into / entry.name).symlink_to(entry)


def ninja_plan(folder: Path, build_file: Path, path: str) -> Plan:
    """Ask ninja (the one first on `path`, as the build finds it) what it would run in `folder` for
    `build_file`, without running it (`-n`) and without touching `folder` (a stand-in of it is asked)."""
    ninja = shutil.which("ninja", path=path)
    if ninja is None:
        raise FileNotFoundError("no ninja on PATH")
    with tempfile.TemporaryDirectory(prefix="cockpit-ninja-") as tmp:
        work = Path(tmp)
        _shadow(folder, work)
        shutil.copy2(build_file, work / "build.ninja")
        out = subprocess.run(
            [ninja, "-n", "-C", str(work)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    text = out.stdout + out.stderr
    if out.returncode != 0:
        raise RuntimeError(f"ninja -n failed: {text.strip().splitlines()[-1:] or out.returncode}")
    commands = sum(1 for line in text.splitlines() if line.startswith("["))
    if not commands:
        return Plan(0)
    if "starting over" in text:  # ninja's own words for a log it cannot read
        return Plan(commands, "its build log is another ninja version's")
    # The folder's files say why, where they can; else what ninja saw is a source (or header) newer.
    return Plan(commands, recorded_reason(folder, build_file) or SOURCES_CHANGED)


def rebuild_reason(builder: Any, folder: Path, path: str) -> str:
    """Why torch's loader would compile the op of `builder` again although `folder` holds its `.so`, or ""
    when it would load it as it is (`extcache.RebuildCheck`, asked of ninja)."""
    with tempfile.TemporaryDirectory(prefix="cockpit-build-") as tmp:
        build_file = Path(tmp) / "build.ninja"
        write_build_file(load_arguments(builder), build_file)
        return ninja_plan(folder, build_file, path).why
