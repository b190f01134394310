"""Each rank of a multi-rank load builds only its share of the model; the others receive it by broadcast.

The layer-by-layer loader (`trainer.weights.loader`) fills a meta-device model one unit at a time: each
decoder layer, then the rest (embeddings, final norm, head). With several ranks, unit u is read from the
checkpoint and quantized only by rank `u % world` (the rest is unit `layers`); the units go in rounds
of `world`, one unit a rank, so every rank reads and quantizes at the same time. Then, unit by unit, the
rank that built it broadcasts it over torch.distributed's default group (the one DeepSpeed partitions
over): first what it is (a small manifest: which modules became `Linear4bit` or `NF4Experts`, every
tensor's shape and dtype, bitsandbytes' non-tensor quantization state), then every tensor, quantized
bytes and scales included. The other ranks build the same modules from that and hold the same bytes, so
ZeRO-3 partitions exactly what it partitions when every rank builds every unit; bitsandbytes' quantization
state, which is not a parameter, arrives too. One unit a rank is in memory at a time plus the one being
received: about two layers.

`COCKPIT_LOAD_SHARE=0` (read once; only a benchmark's control rows set it) makes every rank build every
unit, as before.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from cockpit.contract import load_builder
from trainer.layers.experts4bit import NF4Experts, is_fused_experts

SWITCH = "COCKPIT_LOAD_SHARE"
SHARING = os.environ.get(SWITCH, "1") != "0"


@dataclass(frozen=True)
class Share:
    """Who builds which unit: unit u on rank u % world (`cockpit.contract.load_builder`)."""

    rank: int
    world: int

    def owner(self, unit: int) -> int:
        return load_builder(unit, self.world)

    def mine(self, unit: int) -> bool:
        return self.owner(unit) == self.rank

    def rounds(self, units: int) -> Iterator[range]:
        """The units in rounds of `world`: in each, every rank builds at most one."""
        for first in range(0, units, self.world):
            yield range(first, min(units, first + self.world))

    def union(self, items: list[str]) -> list[str]:
        """Every rank's `items` together, sorted (a collective: every rank calls it)."""
        import torch.distributed as dist

        gathered: list[list[str] | None] = [None] * self.world
        dist.all_gather_object(gathered, items)
        return sorted({item for part in gathered for item in part or []})


def job_share() -> Share | None:
    """This rank's share when the load is spread over the job's ranks: torch.distributed is up with
    several ranks and `COCKPIT_LOAD_SHARE` is not 0. None otherwise (every rank builds everything)."""
    import torch.distributed as dist

    if not SHARING or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    return Share(dist.get_rank(), dist.get_world_size())


# --- what a built unit is, for the ranks that did not build it -------------------------------------


@dataclass
class Slot:
    """One tensor of a unit: where it goes and what it is."""

    path: str  # the module's path inside the unit ("" for the unit itself)
    name: str  # parameter or buffer name, or "weight"/a quant-state key for a Linear4bit
    role: str  # "param", "buffer", "weight4bit", "bias4bit", "qstate"
    shape: tuple[int, ...]
    dtype: torch.dtype
    cpu: bool  # lives on the CPU even when the unit is on a GPU (sent through the load device)


@dataclass
class Manifest:
    """A built unit: modules to make (Linear4bit, NF4Experts) and every tensor, in broadcast order."""

    linear4bit: dict[str, dict[str, Any]] = field(default_factory=dict)
    nf4_experts: dict[str, dict[str, Any]] = field(default_factory=dict)
    experts_16bit: list[str] = field(default_factory=list)
    slots: list[Slot] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """The loader's counts for this unit (`trainer.weights.loader.LayerwiseLoader.counts`)."""
        return {
            "linear_4bit": len(self.linear4bit),
            "experts_nf4": len(self.nf4_experts),
            "experts_16bit": len(self.experts_16bit),
        }


def _is_linear4bit(module: nn.Module) -> bool:
    return type(module).__name__ == "Linear4bit" and hasattr(module.weight, "quant_state")


def _inside(name: str, containers: set[str]) -> bool:
    return any(name == c or name.startswith(f"{c}.") for c in containers)


def _slot(path: str, name: str, role: str, tensor: torch.Tensor, device: torch.device) -> Slot:
    cpu = tensor.device.type == "cpu" and device.type != "cpu"
    return Slot(path, name, role, tuple(tensor.shape), tensor.dtype, cpu)


def manifest_of(unit: nn.Module, device: torch.device, skip: tuple[nn.Module, ...] = ()) -> Manifest:
    """What the builder of `unit` sends: every tensor not on the meta device, outside `skip`."""
    skipped = {name for name, m in unit.named_modules() if any(m is s for s in skip)}
    out = Manifest()
    for path, module in unit.named_modules():
        if _inside(path, skipped):
            continue
        if _is_linear4bit(module):
            weight = module.weight
            state = weight.quant_state.as_dict(packed=False)
            tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
            out.linear4bit[path] = {
                "in_features": module.in_features,
                "out_features": module.out_features,
                "bias": module.bias is not None,
                "compute_dtype": module.compute_dtype,
                "compress_statistics": weight.compress_statistics,
                "quant_type": weight.quant_type,
                "quant_storage": weight.quant_storage,
                "state": {k: v for k, v in state.items() if k not in tensors},
            }
            out.slots.append(_slot(path, "weight", "weight4bit", weight.data, device))
            out.slots += [_slot(path, k, "qstate", v, device) for k, v in tensors.items()]
            if module.bias is not None:
                out.slots.append(_slot(path, "bias", "bias4bit", module.bias.data, device))
            continue
        if _inside(path, set(out.linear4bit)):
            continue
        if isinstance(module, NF4Experts):
            out.nf4_experts[path] = {
                "num_experts": module.num_experts,
                "hidden_dim": module.hidden_dim,
                "intermediate_dim": module.intermediate_dim,
                "compute_dtype": module.compute_dtype,
                "storage_dtype": module.layouts["gate_up_proj"].storage_dtype,
            }
        elif is_fused_experts(module):
            out.experts_16bit.append(path)
        for name, param in module.named_parameters(recurse=False):
            if not param.is_meta:
                out.slots.append(_slot(path, name, "param", param.data, device))
        for name, buf in module.named_buffers(recurse=False):
            if not buf.is_meta:
                out.slots.append(_slot(path, name, "buffer", buf, device))
    return out


# --- sending and receiving ------------------------------------------------------------------------


def _wire(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A tensor's bytes as one flat uint8 tensor on the device the group talks through (a view when it
    is contiguous and there already)."""
    flat = tensor.detach().contiguous().reshape(-1)
    return (flat if flat.device == device else flat.to(device)).view(torch.uint8)


def _module(unit: nn.Module, path: str) -> nn.Module:
    return unit.get_submodule(path) if path else unit


def _replace(unit: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, attr = path.rpartition(".")
    setattr(_module(unit, parent), attr, new)


def _set(module: nn.Module, name: str, tensor: torch.Tensor, param: bool) -> None:
    """Put a received tensor in place; a parameter keeps the attributes its meta stand-in carried (the
    packed experts' `cockpit_4bit`, `cockpit_logical_numel`)."""
    if not param:
        module._buffers[name] = tensor
        return
    new = nn.Parameter(tensor, requires_grad=False)
    old = module._parameters.get(name)
    if old is not None:
        new.__dict__.update({k: v for k, v in old.__dict__.items() if k.startswith("cockpit_")})
    module._parameters[name] = new


def send_unit(unit: nn.Module, device: torch.device, skip: tuple[nn.Module, ...] = ()) -> Manifest:
    """Broadcast a unit this rank built (its manifest, then its tensors) to every other rank."""
    import torch.distributed as dist

    manifest = manifest_of(unit, device, skip)
    rank = dist.get_rank()
    dist.broadcast_object_list([manifest], src=rank)
    for tensor in tensors_of(unit, manifest):
        dist.broadcast(_wire(tensor, device), src=rank)
    return manifest


def tensors_of(unit: nn.Module, manifest: Manifest) -> Iterator[torch.Tensor]:
    """The builder's tensors in the manifest's order (what `send_unit` broadcasts, and the NF4 cache
    stores)."""
    states: dict[str, dict[str, Any]] = {}
    for slot in manifest.slots:
        module = _module(unit, slot.path)
        if slot.role == "qstate":
            if slot.path not in states:
                states[slot.path] = module.weight.quant_state.as_dict(packed=False)
            yield states[slot.path][slot.name]
        elif slot.role == "param" or slot.role == "weight4bit" or slot.role == "bias4bit":
            yield getattr(module, slot.name).data
        else:
            yield module._buffers[slot.name]


def receive_unit(unit: nn.Module, src: int, device: torch.device) -> Manifest:
    """Build, on this rank, the unit rank `src` built and broadcasts (`unit` is still on meta)."""
    import torch.distributed as dist

    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=src)
    manifest: Manifest = box[0]

    def receive(slot: Slot) -> torch.Tensor:
        tensor = torch.empty(slot.shape, dtype=slot.dtype, device=device)
        dist.broadcast(tensor.reshape(-1).view(torch.uint8), src=src)
        return tensor

    assemble(unit, manifest, receive, device)
    return manifest


def assemble(
    unit: nn.Module, manifest: Manifest, tensor_of: Callable[[Slot], torch.Tensor], device: torch.device
) -> None:
    """Make the modules `manifest` names (`Linear4bit`, `NF4Experts`) in `unit` (still on meta) and put
    every tensor in place, `tensor_of(slot)` giving each in the manifest's order (on `device`, or
    anywhere: it is moved there unless the slot lives on the CPU). The broadcast's receiving end, and
    the NF4 cache's reading end (`trainer.weights.nf4_cache`)."""
    import bitsandbytes as bnb

    for path, spec in manifest.nf4_experts.items():
        old = _module(unit, path)
        new = NF4Experts(
            spec["num_experts"],
            spec["hidden_dim"],
            spec["intermediate_dim"],
            old.act_fn,
            spec["compute_dtype"],
            spec["storage_dtype"],
            "meta",  # its parameters arrive below
        )
        _replace(unit, path, new)
    received: dict[str, dict[str, torch.Tensor]] = {path: {} for path in manifest.linear4bit}
    for slot in manifest.slots:
        tensor = tensor_of(slot)
        tensor = tensor.cpu() if slot.cpu else tensor.to(device)
        if slot.path in received:
            received[slot.path][slot.name] = tensor
            continue
        _set(_module(unit, slot.path), slot.name, tensor, slot.role == "param")
    for path, spec in manifest.linear4bit.items():
        tensors = received[path]
        new = bnb.nn.Linear4bit(
            spec["in_features"],
            spec["out_features"],
            bias=spec["bias"],
            compute_dtype=spec["compute_dtype"],
            compress_statistics=spec["compress_statistics"],
            quant_type=spec["quant_type"],
            quant_storage=spec["quant_storage"],
            device="meta",
        )
        weight = tensors.pop("weight")
        bias = tensors.pop("bias", None)
        state = {**spec["state"], **tensors}
        new.weight = bnb.nn.Params4bit.from_prequantized(
            weight, state, requires_grad=False, device=device, module=new
        )
        if bias is not None:
            new.bias = nn.Parameter(bias, requires_grad=False)
        _replace(unit, path, new)
