"""Reading a profile: a name (`./profiles/`, then the shipped ones) or a path to TOML, `--set` overrides,
relative paths made absolute, and every problem as a `ProfileError` naming the file, the field and what was
expected (with a did-you-mean for a misspelt key or name).
"""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cockpit.profiles.schema import Profile
from cockpit.profiles.shipped import BUILTIN_PREFIX, DEFAULT_PROFILE, PROFILES_DIR
from cockpit.textfile import NotUtf8, read_utf8


class ProfileError(Exception):
    """A profile that cannot be used; the message names the file and field."""


def resolve_profile_path(name_or_path: str) -> Path:
    """Find a profile by path, or by name (with or without `.toml`) in `./profiles/`, then shipped ones."""
    candidate = Path(name_or_path).expanduser()
    if candidate.is_file():
        return candidate
    for directory in (Path.cwd() / "profiles", PROFILES_DIR):
        for name in (name_or_path, f"{name_or_path}.toml"):
            path = directory / name
            if path.is_file():
                return path
    names = sorted({p.stem for d in (Path.cwd() / "profiles", PROFILES_DIR) for p in d.glob("*.toml")})
    close = difflib.get_close_matches(Path(name_or_path).stem, names, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    raise ProfileError(
        f"{name_or_path}: no such profile file or name ({hint}known: {', '.join(names)}; "
        "`cockpit profiles` lists them with their files)"
    )


def profile_names() -> list[tuple[str, str, Path]]:
    """Every profile a name finds (`./profiles` first, then the shipped ones): name, description, file."""
    found: dict[str, tuple[str, str, Path]] = {}
    for directory in (Path.cwd() / "profiles", PROFILES_DIR):
        for path in sorted(directory.glob("*.toml")):
            if path.stem in found:
                continue
            try:
                description = str(tomllib.loads(read_utf8(path)).get("description", ""))
            except (OSError, tomllib.TOMLDecodeError, NotUtf8):
                description = "(cannot be read as TOML)"
            found[path.stem] = (path.stem, description, path)
    return sorted(found.values())


def _keys_at(loc: tuple[Any, ...]) -> list[str]:
    """The field names a profile allows at `loc` (a section, or the top level); none if it is no model."""
    model: Any = Profile
    for part in loc:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None or not isinstance(field.annotation, type):
            return []
        model = field.annotation
    return list(getattr(model, "model_fields", {}))


def _describe(error: dict[str, Any]) -> str:
    loc = ".".join(str(part) for part in error["loc"]) or "(top level)"
    kind = error["type"]
    if kind == "extra_forbidden":
        near = difflib.get_close_matches(str(error["loc"][-1]), _keys_at(error["loc"][:-1]), n=1)
        return f"{loc}: unknown key" + (f" (did you mean {near[0]}?)" if near else "")
    if kind == "missing":
        return f"{loc}: required field is missing"
    given = error.get("input")
    shown = "" if isinstance(given, dict) else f" (got {given!r})"
    message = error["msg"].removeprefix("Value error, ")
    if not error["loc"]:  # a whole-profile check: its message names the fields itself
        return f"{message}{shown}"
    return f"{loc}: {message}{shown}"


def parse_profile(data: dict[str, Any], source: str) -> Profile:
    """Validate a profile mapping; `source` names it in errors."""
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        lines = [_describe(err) for err in exc.errors(include_url=False)]
        if len(lines) == 1:  # one line naming the file and the field
            raise ProfileError(f"{source}: {lines[0]}") from None
        raise ProfileError(f"{source}: invalid profile\n  " + "\n  ".join(lines)) from None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `section.key=value` overrides to a profile mapping (value as a TOML literal, else a string)."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ProfileError(f"--set {item!r}: expected section.key=value")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        *parents, leaf = key.strip().split(".")
        node = data
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ProfileError(f"--set {item!r}: {part} is not a section")
            node = child
        node[leaf] = value
    return data


def load_profile(
    name_or_path: str = DEFAULT_PROFILE, overrides: list[str] | None = None
) -> tuple[Profile, Path]:
    """Read and validate a profile, with optional `section.key=value` overrides; returns it and its file.

    Relative `model.config`, `data.source` and `launcher.hostfile` paths are taken relative to the
    profile's folder when the file gives them, and to the working directory when `--set` does.
    """
    path = resolve_profile_path(name_or_path)
    try:
        data = tomllib.loads(read_utf8(path))
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from None
    except (OSError, NotUtf8) as exc:  # a NotUtf8 says where: the line, the column and the byte
        raise ProfileError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    if overrides:
        data = apply_overrides(data, overrides)
        anchor_set_paths(data, overrides, Path.cwd())
    profile = parse_profile(data, str(path) + (" (with --set overrides)" if overrides else ""))
    return _anchor_paths(profile, path.parent), path


ANCHORED = (("model", "config"), ("data", "source"), ("launcher", "hostfile"))  # relative paths resolved


def _anchored(value: str, base: Path) -> str:
    """A path field's value made absolute against `base` (`~` expanded); empty and built-in ones kept."""
    if not value or value.startswith(BUILTIN_PREFIX):
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (base / path).resolve())


def anchor_set_paths(data: dict[str, Any], overrides: list[str], cwd: Path) -> None:
    """Paths given on the command line are where the user stands: made absolute against `cwd` (the file's
    own stay relative to the file, `_anchor_paths`)."""
    given = {tuple(item.partition("=")[0].strip().split(".")) for item in overrides}
    for section, key in ANCHORED:
        node = data.get(section)
        if (section, key) in given and isinstance(node, dict) and isinstance(node.get(key), str):
            node[key] = _anchored(node[key], cwd)


def _anchor_paths(profile: Profile, base: Path) -> Profile:
    """The file's relative paths (ANCHORED) made absolute against its folder."""
    update = {}
    for section, key in ANCHORED:
        part = getattr(profile, section)
        update[section] = part.model_copy(update={key: _anchored(getattr(part, key), base)})
    return profile.model_copy(update=update)
