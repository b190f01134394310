"""The packed NF4 model caches: what keys a cache, what one holds, and listing and clearing them.

The first layer-by-layer load of a checkpoint reads its 16-bit weights and quantizes them; it also keeps
what it built, unit by unit (each decoder layer, then the rest), in `$COCKPIT_CACHE/nf4/<key>/`, and
the next load reads that instead: about a quarter of the bytes and no quantization
(`trainer/weights/nf4_cache.py` writes and reads the units). A cache folder holds `manifest.json` (the
checkpoint's folder and fingerprint, the settings, how many units) and one safetensors file a unit
(`layer-00012.safetensors`, `rest.safetensors`), each valid on its own: a load that stops halfway keeps the
units it wrote.

The key is a digest of the checkpoint's fingerprint (per shard: its name, size, modification time and
safetensors header; a hub blob's sha256 where the shard links to one) and of the settings that change
the quantized bytes (`settings`). A changed checkpoint makes another key: the cache of the old one is
then stale, and says why (`changes`). This module is torch-free: `cockpit doctor` and `cockpit ls
--caches` list and clear caches through it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from cockpit import contract
from cockpit.cache import cache_root
from cockpit.record.atomic import write_json_atomic
from cockpit.units import about, size

FORMAT = 1  # the layout of a unit file; a change makes every key new
FOLDER = "nf4"
MANIFEST = "manifest.json"
REST = "rest.safetensors"
_BLOB = re.compile(r"[0-9a-f]{64}")
_HEADER_MAX = 100 * 2**20  # safetensors' own limit on a header


class CacheError(ValueError):
    """A cache asked for that is not there (one line: which, and where was looked)."""


def caches_dir() -> Path:
    """The folder of every NF4 cache."""
    return cache_root() / FOLDER


def unit_name(index: int, layers: int) -> str:
    """The file of unit `index` of a model of `layers` decoder layers (the rest is unit `layers`)."""
    return REST if index == layers else f"layer-{index:05d}.safetensors"


# --- a checkpoint's identity -----------------------------------------------------------------------------
def shard_files(model_dir: Path) -> list[Path]:
    """The checkpoint's safetensors files: its index's, else every one in the folder."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / name for name in names]
    return sorted(model_dir.glob("*.safetensors"))


def _header_sha(path: Path) -> str:
    """The sha256 of a safetensors file's header (its tensors' names, dtypes, shapes and offsets)."""
    with path.open("rb") as f:
        length = int.from_bytes(f.read(8), "little")
        return hashlib.sha256(f.read(min(length, _HEADER_MAX))).hexdigest()


def shard_identity(path: Path) -> dict[str, Any]:
    """What names a shard's contents: the hub's sha256 where it links to `blobs/<sha256>`, else its size,
    modification time and header."""
    real = path.resolve()
    if real.parent.name == "blobs" and _BLOB.fullmatch(real.name):
        return {"sha256": real.name}
    info = real.stat()
    return {"size": info.st_size, "mtime_ns": info.st_mtime_ns, "header_sha256": _header_sha(real)}


def fingerprint(model_dir: str | Path) -> dict[str, dict[str, Any]]:
    """Every shard's identity by file name, and config.json's contents (OSError where one is unreadable)."""
    folder = Path(model_dir)
    out = {path.name: shard_identity(path) for path in shard_files(folder)}
    config = folder / "config.json"
    if config.is_file():
        out["config.json"] = {"sha256": hashlib.sha256(config.read_bytes()).hexdigest()}
    return out


def changes(old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> str | None:
    """How the checkpoint differs from the one a cache was made of (one line), None when it does not."""
    words = {"size": "size", "mtime_ns": "mtime", "header_sha256": "header", "sha256": "contents"}
    found = []
    for name in sorted(set(old) | set(new)):
        if name not in new:
            found.append(f"{name} is gone")
        elif name not in old:
            found.append(f"{name} is new")
        elif old[name] != new[name]:
            keys = sorted(set(old[name]) | set(new[name]), key=list(words).index)
            what = [words[k] for k in keys if old[name].get(k) != new[name].get(k)]
            found.append(f"shard {name} changed {'/'.join(what)}")
    if not found:
        return None
    return ", ".join(found[:2]) + (f" (and {len(found) - 2} more)" if len(found) > 2 else "")


# --- the settings that change the bytes ----------------------------------------------------------------
def off_reason(profile: Any, loader: str = "layerwise", random: bool = False) -> str:
    """Why a load of `profile` keeps no NF4 cache ("" when it keeps one): the trainer's rule
    (`trainer.weights.nf4_cache.open_cache`), which the plan counts too. Only the layer-by-layer loader writes
    one, of a real checkpoint, with something quantized, unless the profile turns it off."""
    q = profile.quantization
    if random:
        return "random weights"
    if loader != "layerwise":
        return 'only the layer-by-layer loader keeps one (model.loader = "layerwise")'
    if not q.cache:
        return "quantization.cache = false"
    if not (q.load_in_4bit or q.quantize_experts):
        return "nothing is quantized"
    return ""


def settings(profile: Any, device_type: str) -> dict[str, Any]:
    """What the quantized bytes depend on besides the checkpoint: the profile's quantization, the packed
    experts' storage dtype, the NF4 block size, where it quantizes (`cpu`, `cuda`), bitsandbytes' version
    and this module's `FORMAT`."""
    q = profile.quantization
    experts = contract.experts_storage_dtype(profile.training.bf16, q.storage_dtype)
    return {
        "format": FORMAT,
        "load_in_4bit": q.load_in_4bit,
        "quant_type": q.quant_type,
        "double_quant": q.double_quant,
        "compute_dtype": q.compute_dtype,
        "storage_dtype": q.storage_dtype,
        "quantize_experts": q.quantize_experts,
        "experts_storage_dtype": experts if q.quantize_experts else None,
        "nf4_blocksize": contract.NF4_BLOCKSIZE,
        "device": device_type,
        "bitsandbytes": bitsandbytes_version(),
    }


def bitsandbytes_version() -> str | None:
    """The installed bitsandbytes' version (its quantization makes the bytes), None without one."""
    try:
        return metadata.version("bitsandbytes")
    except metadata.PackageNotFoundError:
        return None


def foreign(made: dict[str, Any], wanted: dict[str, Any]) -> str | None:
    """The settings a cache was made with that differ from those wanted ('quant_type fp4, ...'), or None."""
    keys = sorted(set(made) | set(wanted))
    differ = [f"{k} {made.get(k)}" for k in keys if made.get(k) != wanted.get(k)]
    return ", ".join(differ) or None


def cache_key(prints: dict[str, dict[str, Any]], wanted: dict[str, Any]) -> str:
    """The key of the cache of a checkpoint of fingerprint `prints` quantized with settings `wanted`."""
    text = json.dumps({"fingerprint": prints, "settings": wanted}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def write_manifest(folder: Path, model_dir: Path, prints: dict, wanted: dict, layers: int) -> None:
    """A cache's manifest (atomic: several ranks may write the same one)."""
    manifest = {
        "format": FORMAT,
        "key": folder.name,
        "model": str(model_dir),
        "fingerprint": prints,
        "settings": wanted,
        "layers": layers,
        "units": layers + 1,
    }
    write_json_atomic(folder / MANIFEST, manifest)


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """A cache's manifest, None where it is missing or unreadable."""
    try:
        data = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# --- listing and clearing ------------------------------------------------------------------------------
@dataclass(frozen=True)
class CacheInfo:
    """One cache on disk, as `cockpit ls --caches` and `cockpit doctor` show it."""

    key: str
    folder: Path
    model: str
    settings: dict[str, Any] = field(default_factory=dict)
    units: int = 0  # a complete cache's unit files
    done: int = 0  # those on disk
    bytes: int = 0
    last_used: float = 0.0
    problem: str = ""  # empty, or why no load would use it (stale, model gone, no manifest)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "folder": str(self.folder),
            "model": self.model,
            "settings": self.settings,
            "units": self.units,
            "units_on_disk": self.done,
            "bytes": self.bytes,
            "last_used": self.last_used,
            "problem": self.problem,
        }


def _problem(manifest: dict[str, Any]) -> str:
    """Why no load here would read a cache, or '': its checkpoint changed or is gone, or it was made by
    another bitsandbytes or cache format than this environment's."""
    made = manifest.get("settings") or {}
    if made.get("format") != FORMAT:
        return f"format {made.get('format')}, this cockpit reads format {FORMAT}"
    here = bitsandbytes_version()
    if made.get("bitsandbytes") != here:
        return f"made with bitsandbytes {made.get('bitsandbytes')}, {here} here"
    model = Path(str(manifest.get("model", "")))
    if not model.is_dir():
        return f"model gone: no folder {model}"
    try:
        changed = changes(manifest.get("fingerprint") or {}, fingerprint(model))
    except (OSError, ValueError) as exc:
        return f"model unreadable: {exc}"
    return f"stale: {changed}" if changed else ""


def folder_files(folder: Path) -> list[os.stat_result]:
    """The files under `folder` (those another process removes meanwhile left out)."""
    found = []
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file():
                found.append(path.stat())
    return found


def inspect(folder: Path) -> CacheInfo:
    """What one cache folder holds."""
    files = folder_files(folder)
    held = sum(f.st_size for f in files)
    manifest = read_manifest(folder)
    if manifest is None:
        used = max((f.st_mtime for f in files), default=folder.stat().st_mtime)
        return CacheInfo(folder.name, folder, "?", bytes=held, last_used=used, problem="no readable manifest")
    layers = int(manifest.get("layers") or 0)
    done = sum((folder / unit_name(i, layers)).is_file() for i in range(layers + 1))
    return CacheInfo(
        key=folder.name,
        folder=folder,
        model=str(manifest.get("model", "?")),
        settings=dict(manifest.get("settings") or {}),
        units=layers + 1,
        done=done,
        bytes=held,
        last_used=(folder / MANIFEST).stat().st_mtime,
        problem=_problem(manifest),
    )


def list_caches() -> list[CacheInfo]:
    """Every cache, the most recently used first."""
    root = caches_dir()
    found = [inspect(p) for p in sorted(root.iterdir()) if p.is_dir()] if root.is_dir() else []
    return sorted(found, key=lambda c: -c.last_used)


def describe(info: CacheInfo, now: float | None = None) -> str:
    """One line: key, model, settings, units on disk, bytes, last use, and what is wrong with it."""
    s = info.settings
    how = "?"
    if s:
        how = f"{s.get('quant_type')}{'+dq' if s.get('double_quant') else ''} {s.get('compute_dtype')}"
        how += f" on {s.get('device')}" + (", experts nf4" if s.get("quantize_experts") else "")
    ago = about(max(0.0, (now or time.time()) - info.last_used))
    line = (
        f"{info.key}  {info.model}  {how}  {info.done}/{info.units} units  {size(info.bytes)}  used {ago} ago"
    )
    return line + (f"  ({info.problem})" if info.problem else "")


def summary(caches: list[CacheInfo]) -> str:
    """'3 caches, 12.5 GiB in <folder>' (or that there is none)."""
    if not caches:
        return f"no NF4 cache in {caches_dir()}"
    total = sum(c.bytes for c in caches)
    stale = sum(bool(c.problem) for c in caches)
    unusable = f" ({stale} no load would use)" if stale else ""
    return f"{len(caches)} NF4 cache{'s' * (len(caches) != 1)}, {size(total)} in {caches_dir()}{unusable}"


def select(which: str) -> list[CacheInfo]:
    """The caches `which` names: `all`, `stale` (those no load would use), or a key (or its first
    characters); CacheError when a key names none or several."""
    caches = list_caches()
    if which == "all":
        return caches
    if which == "stale":
        return [c for c in caches if c.problem]
    hits = [c for c in caches if c.key.startswith(which)] if which else []
    if not hits:
        raise CacheError(f"{which!r}: no NF4 cache of that key in {caches_dir()} (see `cockpit ls --caches`)")
    if len(hits) > 1:
        raise CacheError(f"{which!r}: {len(hits)} NF4 caches' keys begin so: give more of the key")
    return hits


def remove(which: str) -> list[CacheInfo]:
    """Delete the caches `which` names (`select`); those removed."""
    chosen = select(which)
    for info in chosen:
        shutil.rmtree(info.folder, ignore_errors=True)
    return chosen
