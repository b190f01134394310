"""The packed NF4 model kept on disk after a first load, and read instead of the checkpoint next time.

`cockpit.model_cache` says what keys a cache and where it lives; here the layer-by-layer loader's units
are written and read. A unit built from the checkpoint (its `Linear4bit` weights, scales and
bitsandbytes' quantization state, its packed experts, its 16-bit tensors) is described and its tensors
listed exactly as `trainer.weights.load_share` broadcasts it (`manifest_of`, `tensors_of`): the description
goes in a safetensors file's header with the cache's key, the tensors in its body, one file a unit, written
under a temporary name and renamed (by a worker thread, while the loader builds the next unit). Reading
one makes the same modules with the same bytes through the broadcast's receiving end
(`load_share.assemble`): no checkpoint read, no quantization.

What cannot be used is refused with a one-line reason, and that unit comes from the checkpoint as before
(and is written again): a unit file that cannot be read (truncated, damaged), made for another key
(other settings: foreign; another checkpoint: stale), or that does not fit the model. A cache of the
same checkpoint folder and settings whose checkpoint has changed since is stale: it is removed and a new
one written. Nothing about the cache fails a load: a write that fails, or that would leave less than
`MARGIN_BYTES` free on the cache's disk, is skipped with its reason.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cockpit import model_cache
from cockpit.cache import private_dir
from cockpit.units import size
from trainer.layers.experts4bit import is_fused_experts
from trainer.weights.load_share import Manifest, Slot, assemble, manifest_of, tensors_of

MARGIN_BYTES = 8 * 2**30  # free space a write leaves on the cache's disk, at least
_DTYPE, _TUPLE = "__torch_dtype__", "__tuple__"  # JSON has neither
log = logging.getLogger(__name__)


class Refused(Exception):
    """A unit file that is there but cannot be used (the message says why)."""


# --- a unit's description as text ------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return {_DTYPE: str(value).removeprefix("torch.")}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return {_TUPLE: [_plain(v) for v in value]}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _typed(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {_DTYPE}:
            return getattr(torch, value[_DTYPE])
        if set(value) == {_TUPLE}:
            return tuple(_typed(v) for v in value[_TUPLE])
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return value


def manifest_text(manifest: Manifest) -> str:
    """A unit's description (`load_share.Manifest`) as JSON."""
    slots = [[s.path, s.name, s.role, s.shape, s.dtype, s.cpu] for s in manifest.slots]
    body = {
        "linear4bit": manifest.linear4bit,
        "nf4_experts": manifest.nf4_experts,
        "experts_16bit": manifest.experts_16bit,
        "slots": slots,
    }
    return json.dumps(_plain(body))


def manifest_from_text(text: str) -> Manifest:
    """The description `manifest_text` wrote."""
    body = _typed(json.loads(text))
    slots = [Slot(*fields) for fields in body["slots"]]
    return Manifest(body["linear4bit"], body["nf4_experts"], list(body["experts_16bit"]), slots)


def _inside(path: str, containers: set[str]) -> bool:
    return any(path == c or path.startswith(f"{c}.") for c in containers)


def misfit(unit: nn.Module, manifest: Manifest, skip: tuple[nn.Module, ...] = ()) -> str | None:
    """Why `manifest` cannot fill `unit` (still on meta): a module or tensor it names is not in the model
    as it says, or a parameter of the model has no tensor in it. None when it fits."""
    modules = dict(unit.named_modules())
    for path, spec in manifest.linear4bit.items():
        m = modules.get(path)
        if not isinstance(m, nn.Linear) or (m.in_features, m.out_features) != (
            spec["in_features"],
            spec["out_features"],
        ):
            return f"the model has no {spec['in_features']}x{spec['out_features']} linear layer {path!r}"
    for path, spec in manifest.nf4_experts.items():
        m = modules.get(path)
        want = (spec["num_experts"], 2 * spec["intermediate_dim"], spec["hidden_dim"])
        if m is None or not is_fused_experts(m) or tuple(m.gate_up_proj.shape) != want:
            return f"the model has no fused experts {path!r} of {want}"
    replaced = set(manifest.linear4bit) | set(manifest.nf4_experts)
    covered = set()
    for slot in manifest.slots:
        if slot.role not in ("param", "buffer") or _inside(slot.path, replaced):
            continue
        m = modules.get(slot.path)
        held = None if m is None else (m._parameters if slot.role == "param" else m._buffers).get(slot.name)
        if held is None or tuple(held.shape) != slot.shape:
            return f"the model has no {slot.role} {slot.path}.{slot.name} of shape {slot.shape}"
        covered.add((slot.path, slot.name))
    skipped = {path for path, m in modules.items() if any(m is s for s in skip)}
    for path, m in modules.items():
        if _inside(path, skipped) or _inside(path, replaced):
            continue
        for name, param in m._parameters.items():
            if param is not None and (path, name) not in covered:
                return f"no tensor for the model's {path}.{name}".replace(" .", " ")
    return None


# --- the cache of one load --------------------------------------------------------------------------------
class NF4Cache:
    """The units of one checkpoint and settings on disk: read where they are, written where not."""

    def __init__(
        self,
        folder: Path | None,
        layers: int,
        prints: dict[str, Any] | None = None,
        wanted: dict[str, Any] | None = None,
        off: str = "",
    ) -> None:
        self.folder = folder
        self.key = folder.name if folder else ""
        self.layers = layers
        self.prints = prints or {}
        self.wanted = wanted or {}
        self.off = off  # why there is no cache for this load
        self.stride = 1  # from one unit this rank loads to its next (the ranks of a shared load)
        self.read: list[int] = []
        self.written: list[int] = []
        self.bytes_read = 0
        self.bytes_written = 0
        self.refused: list[str] = []
        self.others: list[str] = []  # caches of this checkpoint made with other settings
        self.not_written = ""  # why writing stopped
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None

    @property
    def on(self) -> bool:
        return self.folder is not None

    def say(self, reason: str) -> None:
        log.warning("NF4 cache: %s", reason)

    def refuse(self, reason: str) -> None:
        self.refused.append(reason)
        self.say(f"refused: {reason}; loading from the checkpoint")

    # --- opening -----------------------------------------------------------------------------------------
    def look_beside(self, model: Path) -> None:
        """Other caches of this checkpoint folder: with the same settings they are stale (its checkpoint
        changed since): removed; with other settings, noted and kept."""
        root = self.folder.parent if self.folder else None
        for other in sorted(root.iterdir()) if root and root.is_dir() else []:
            made = model_cache.read_manifest(other)
            if other.name == self.key or not made or made.get("model") != str(model):
                continue
            differ = model_cache.foreign(made.get("settings") or {}, self.wanted)
            if differ:
                self.others.append(f"{other.name} (made with {differ})")
                continue
            changed = model_cache.changes(made.get("fingerprint") or {}, self.prints) or "another fingerprint"
            held = sum(f.st_size for f in model_cache.folder_files(other))
            shutil.rmtree(other, ignore_errors=True)
            self.refuse(f"stale: {changed} since cache {other.name} was made (removed, {size(held)})")

    # --- reading -----------------------------------------------------------------------------------------
    def _read(self, path: Path, index: int) -> tuple[Manifest, list[torch.Tensor]]:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            if meta.get("key") != self.key:
                made = json.loads(meta.get("settings") or "{}")
                differ = model_cache.foreign(made, self.wanted)
                if differ:
                    raise Refused(f"foreign: made with {differ}")
                changed = model_cache.changes(json.loads(meta.get("fingerprint") or "{}"), self.prints)
                raise Refused(f"stale: {changed}" if changed else f"made for key {meta.get('key')}")
            if meta.get("unit") != str(index):
                raise Refused(f"holds unit {meta.get('unit')}, not {index}")
            manifest = manifest_from_text(meta["manifest"])
            tensors = [f.get_tensor(str(i)) for i in range(len(manifest.slots))]
        for i, (slot, tensor) in enumerate(zip(manifest.slots, tensors, strict=True)):
            if tuple(tensor.shape) != slot.shape or tensor.dtype != slot.dtype:
                raise Refused(
                    f"tensor {i} is {tensor.dtype} {tuple(tensor.shape)}, not {slot.dtype} {slot.shape}"
                )
        return manifest, tensors

    def load(
        self, index: int, unit: nn.Module, device: torch.device, skip: tuple[nn.Module, ...] = ()
    ) -> Manifest | None:
        """Fill `unit` (on meta) from its cached file: its description, or None (no file, or refused)."""
        if not self.on:
            return None
        path = self.folder / model_cache.unit_name(index, self.layers)
        if not path.is_file():
            return None
        self._read_ahead(index + self.stride)
        try:
            manifest, tensors = self._read(path, index)
            problem = misfit(unit, manifest, skip)
            if problem:
                raise Refused(f"does not fit the model: {problem}")
        except Refused as exc:
            self.refuse(f"{path.name}: {exc}")
            return None
        except Exception as exc:  # truncated, damaged, unreadable: the checkpoint instead
            self.refuse(f"{path.name} unreadable ({type(exc).__name__}: {exc})")
            return None
        order = iter(tensors)
        try:
            assemble(unit, manifest, lambda slot: next(order), device)
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # half put in place: no way back to the checkpoint for this load
            with contextlib.suppress(OSError):
                path.unlink()  # the next load rebuilds it
            raise RuntimeError(
                f"{path}: the NF4 cache's unit could not be put in place ({type(exc).__name__}: {exc}); "
                "it is removed, and the next load rebuilds it from the checkpoint"
            ) from exc
        self.read.append(index)
        self.bytes_read += path.stat().st_size
        return manifest

    def _read_ahead(self, index: int) -> None:
        """Ask the kernel to start reading the next unit this rank loads while this one is put in place."""
        path = self.folder / model_cache.unit_name(min(index, self.layers), self.layers)
        with contextlib.suppress(OSError, AttributeError):  # no such file, or no posix_fadvise here
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)

    # --- writing -----------------------------------------------------------------------------------------
    def store(
        self, index: int, unit: nn.Module, device: torch.device, skip: tuple[nn.Module, ...] = ()
    ) -> None:
        """Write `unit`, just built from the checkpoint and not yet partitioned, as its cached file (a copy
        on the host now, the file by the worker thread); skipped with a reason where it cannot be."""
        if not self.on or self.not_written:
            return
        path = self.folder / model_cache.unit_name(index, self.layers)
        try:
            manifest = manifest_of(unit, device, skip)
            tensors = {
                str(i): t.detach().to("cpu", copy=True).contiguous()
                for i, t in enumerate(tensors_of(unit, manifest))
            }
            self.wait()  # one write at a time: at most one unit's copy waits on the host
            if self.not_written:
                return
            need = sum(t.nbytes for t in tensors.values())
            free = shutil.disk_usage(self.folder).free
            if free - need < MARGIN_BYTES:
                self.stop(
                    f"not written from {path.name} on: {size(free)} free on the cache's disk "
                    f"({self.folder.parent}), a unit needs {size(need)} and {size(MARGIN_BYTES)} stay free"
                )
                return
            meta = {
                "key": self.key,
                "unit": str(index),
                "settings": json.dumps(self.wanted, sort_keys=True),
                "fingerprint": json.dumps(self.prints, sort_keys=True),
                "manifest": manifest_text(manifest),
            }
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="nf4-cache")
            self._pending = self._pool.submit(self._write, path, tensors, meta, index)
        except Exception as exc:
            self.stop(f"not written ({type(exc).__name__}: {exc})")

    def _write(self, path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, str], index: int) -> None:
        from safetensors.torch import save_file

        tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
        try:
            save_file(tensors, str(tmp), metadata=meta)
            with tmp.open("rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except Exception as exc:
            tmp.unlink(missing_ok=True)
            self.stop(f"{path.name} not written ({type(exc).__name__}: {exc})")
            return
        self.written.append(index)
        self.bytes_written += path.stat().st_size

    def stop(self, reason: str) -> None:
        """No more writes this load, for `reason`."""
        self.not_written = reason
        self.say(reason)

    def wait(self) -> None:
        """Until the write under way (if any) is done."""
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def close(self) -> None:
        self.wait()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    # --- what the load did ---------------------------------------------------------------------------------
    def facts(self, produced: int) -> dict[str, Any]:
        """The load facts: `weights` ("nf4-cache" when every unit this rank produced was read from the
        cache, else "checkpoint") and `nf4_cache` (where, what was read and written, what was refused)."""
        if not self.on:
            return {"weights": "checkpoint", "nf4_cache": {"off": self.off}}
        cache: dict[str, Any] = {
            "path": str(self.folder),
            "units_read": len(self.read),
            "units_written": len(self.written),
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
        }
        for key, value in (
            ("refused", self.refused),
            ("not_written", self.not_written),
            ("others", self.others),
        ):
            if value:
                cache[key] = value
        every = bool(self.read) and len(self.read) == produced
        return {"weights": "nf4-cache" if every else "checkpoint", "nf4_cache": cache}


def _remove_orphans(folder: Path) -> None:
    """Remove the half-written units (`._write`'s temporary files) of writers on this host that are gone:
    a rank killed while it wrote (the out-of-memory killer, a SIGKILL) leaves one behind."""
    host = socket.gethostname()
    for tmp in folder.glob(".*.tmp"):
        rest, _, pid = tmp.name.removesuffix(".tmp").rpartition(".")
        if not rest.endswith(f".{host}") or not pid.isdigit():
            continue  # another host's writer (a shared disk), or not a file of ours: left as it is
        if not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                tmp.unlink()


def open_cache(
    profile: Any, model_dir: str, device: torch.device, layers: int, random: bool = False
) -> NF4Cache:
    """The cache of this checkpoint and the profile's quantization on `device`'s kind, made ready to be
    written (its folder and manifest); one that is off (`random` weights, the profile's choice, nothing
    quantized, no folder to be had) says why. Never raises."""
    off = model_cache.off_reason(profile, random=random)  # only the layer-by-layer loader opens one
    if off:
        return NF4Cache(None, layers, off=off)
    try:
        model = Path(model_dir).resolve()
        prints = model_cache.fingerprint(model)
        wanted = model_cache.settings(profile, device.type)
        folder = model_cache.caches_dir() / model_cache.cache_key(prints, wanted)
        cache = NF4Cache(folder, layers, prints, wanted)
        if not folder.is_dir():
            cache.look_beside(model)
        private_dir(folder.parent)
        private_dir(folder)
        _remove_orphans(folder)
        if model_cache.read_manifest(folder) is None:
            model_cache.write_manifest(folder, model, prints, wanted, layers)
        os.utime(folder / model_cache.MANIFEST)  # last used
    except (OSError, ValueError) as exc:
        reason = f"cannot open the cache ({type(exc).__name__}: {exc})"
        log.warning("NF4 cache: %s", reason)
        return NF4Cache(None, layers, off=reason)
    return cache
