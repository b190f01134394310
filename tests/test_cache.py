"""The cache holds copies of the user's data and a folder put first on the ranks' PATH: it is private,
and what goes on the PATH is checked, not trusted because it is there (issue 27, item 21)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from cockpit.cli import main
from cockpit.ops import dsops


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("older", [False, True], ids=["new", "an older open cache"])
def test_the_cache_holding_arrow_copies_of_the_data_is_private(
    older: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    cache = tmp_path / "cache"
    if older:
        (cache / "datasets").mkdir(parents=True)
        cache.chmod(0o755)
    monkeypatch.setenv("COCKPIT_CACHE", str(cache))
    data = tmp_path / "d.jsonl"
    rows = [{"tenant": "t", "id": f"{i}", "user": "u", "gold": "A", "split": "eval" if i == 3 else "train"}
            for i in range(4)]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["data", str(data), "--no-tokens"]) == 0, capsys.readouterr().err
    assert list((cache / "datasets").rglob("*.arrow")), "datasets' Arrow copy of the data is in the cache"
    assert _mode(cache) == 0o700, "no other user reaches anything in the cache, as with run directories"


def _tools(path: str) -> Path:
    return Path(path.split(os.pathsep)[0])


def test_a_tampered_ninja_folder_is_made_again_before_it_goes_on_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A link elsewhere, another tool beside it and a folder others could write (a shared cache's): the
    folder is made private again and holds only the link to this interpreter's ninja."""
    beside = Path(sys.executable).parent / "ninja"
    assert beside.is_file(), "pip's ninja is installed beside the interpreter (a DeepSpeed dependency)"
    monkeypatch.setenv("COCKPIT_CACHE", str(tmp_path / "cache"))
    tools = _tools(dsops.ninja_first("/usr/bin"))
    assert os.readlink(tools / "ninja") == str(beside)
    evil = tmp_path / "evil"
    evil.write_text("#!/bin/sh\necho hijacked\n")
    evil.chmod(0o755)
    (tools / "ninja").unlink()
    (tools / "ninja").symlink_to(evil)
    shutil.copy(evil, tools / "c++")  # first on PATH, it would shadow the compiler too
    tools.chmod(0o777)
    path = dsops.ninja_first("/usr/bin")
    assert _tools(path) == tools and path.endswith(":/usr/bin")
    assert sorted(p.name for p in tools.iterdir()) == ["ninja"] and _mode(tools) == 0o700
    assert Path(shutil.which("ninja", path=path) or "").resolve() == beside.resolve()


def test_a_cache_others_can_write_is_not_put_on_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a folder any user can write (not sticky), another user could move the cache's tools away and
    put their own in its place: the PATH stays as it was."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("COCKPIT_CACHE", str(shared / "cache"))
    assert dsops.ninja_first("/usr/bin:/bin") == "/usr/bin:/bin"
    shared.chmod(0o1777)  # sticky, as /tmp: others cannot move what is ours
    assert _tools(dsops.ninja_first("/usr/bin:/bin")).parent.parent == shared / "cache"
