"""Where the cockpit keeps what it builds once and reuses: the tiny model, the generated tenants,
`datasets`' Arrow copies of data files and tokenized data, imported logs, the ninja link of op builds.
`$COCKPIT_CACHE`, default `~/.cache/cockpit`.

The cache holds copies of the user's training data, so it is private like a run directory: made 0700,
and tightened to 0700 where an older cache of ours was more open (then nothing in it can be reached by
another user, whatever the modes beneath). A cache another user owns or can write (a shared
`$COCKPIT_CACHE`) is used for data as the user chose, but never trusted for what goes on a PATH
(`private_link`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path


def cache_root() -> Path:
    """The cockpit's cache folder, made private (0700) if it is missing or ours and more open."""
    root = Path(os.environ.get("COCKPIT_CACHE", Path.home() / ".cache" / "cockpit")).expanduser()
    private_dir(root)
    return root


def private_dir(path: Path) -> None:
    """Make `path` (and any missing parent) a folder; owner-only (0700) where it is ours. Nothing is raised:
    a folder that cannot be made or changed (read-only, another user's) is met by whoever writes there."""
    with contextlib.suppress(OSError):
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.stat()
        if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & 0o077:
            path.chmod(0o700)


def trusted_dir(path: Path) -> bool:
    """Whether no other user (root aside) can change what folder `path` holds, as written and once its
    links are followed: it is ours or root's and writable by us alone, and so is every folder above it,
    unless sticky (as /tmp: there others cannot move what is ours); a link on the way is ours or root's."""
    absolute = Path(os.path.abspath(path))
    return _chain_trusted(absolute) and _chain_trusted(absolute.resolve())


def _chain_trusted(path: Path) -> bool:
    me = os.getuid()
    for entry in (path, *path.parents):
        try:
            info = os.lstat(entry)
        except OSError:
            return False
        if info.st_uid not in (me, 0):
            return False
        if stat.S_ISLNK(info.st_mode):  # replaced only by whoever can write the folder above, checked next
            continue
        if not stat.S_ISDIR(info.st_mode):
            return False
        if info.st_mode & 0o022 and (entry == path or not info.st_mode & stat.S_ISVTX):
            return False
    return True


def private_link(folder: Path, name: str, target: Path) -> bool:
    """Make `folder` a private folder (0700, ours, `trusted_dir`) holding nothing but `name`, a symbolic
    link to `target`, and say whether it is: anything else found there (another file, a link elsewhere,
    left by whoever could write there before) is removed first. False, with nothing trusted, where the
    folder cannot be made so (another user's, read-only)."""
    private_dir(folder)
    try:
        if not trusted_dir(folder) or stat.S_IMODE(folder.stat().st_mode) & 0o077:
            return False
        link = folder / name
        for entry in folder.iterdir():
            if entry.name == name and entry.is_symlink() and os.readlink(entry) == str(target):
                continue
            with contextlib.suppress(FileNotFoundError):  # another rank removed it first
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        with contextlib.suppress(FileExistsError):  # another rank made it first
            link.symlink_to(target)
        return [p.name for p in folder.iterdir()] == [name] and os.readlink(link) == str(target)
    except OSError:
        return False
