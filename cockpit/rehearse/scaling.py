"""From the machine a rehearsal ran on to the profile's: every assumption with its value (`Scaling`), and
the offloaded step part by part on either (`offload_step_target`), and the target's optimizer step from
the step's fit (`step_target`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from cockpit.contract import ZERO3_LAYER_FETCHES, overlapped_fetch


@dataclass(frozen=True)
class Scaling:
    """From the machine the rehearsal ran on to the profile's: every assumption, with its value."""

    measured_gpus: int
    measured_gpu: str
    target_gpus: int  # every rank of the target: nodes x GPUs a node
    target_gpu: str
    target_gpu_mem_gib: float
    target_host_ram_gib: float
    compute_ratio: float  # target step compute time / measured (datasheet bf16 rates; 1.0 when unknown)
    h2d_gbps_measured: float
    h2d_gbps_target: float
    gpu2gpu_gbps: float
    disk_gbps: float
    target_nodes: int = 1  # hosts of the target, each with target_gpus / target_nodes ranks
    internode_gbps: float = 0.0  # what each node's network carries of an all-gather (several nodes)

    @property
    def target_machine(self) -> str:
        """`4 x H100-80GB`, or `2 nodes x 4 x H100-80GB` when the target spans several hosts."""
        gpu = self.target_gpu or self.measured_gpu or "CPU"
        if self.target_nodes > 1:
            return f"{self.target_nodes} nodes x {self.target_gpus // self.target_nodes} x {gpu}"
        return f"{self.target_gpus} x {gpu}"

    def lines(self) -> list[str]:
        network = (
            [
                f"between nodes: {self.internode_gbps:g} GB/s a node for the other nodes' partitions (the "
                "network, assumed: no run over several nodes measured yet); host RAM is a node's"
            ]
            if self.target_nodes > 1
            else []
        )
        return [
            f"GPUs: measured on {self.measured_gpus} x {self.measured_gpu or 'CPU'}, predicted for "
            f"{self.target_machine}",
            f"bf16 rate: target compute time = measured x {self.compute_ratio:.2f} (datasheet dense bf16 "
            "rates; the H100 and the H200 share one chip, so 1.00 between them)",
            f"GPU memory: {self.target_gpu_mem_gib or 'unknown'} GiB a GPU on the target; host RAM "
            f"{self.target_host_ram_gib or 'unknown'} GiB",
            f"host-to-device: {self.h2d_gbps_measured:g} GB/s here, {self.h2d_gbps_target:g} GB/s "
            "a GPU on the target (pinned copies, each GPU its own link; 55 GB/s measured on the H200 hosts); "
            f"a layer crosses {ZERO3_LAYER_FETCHES} times a micro-batch; with offload, past the prefetch "
            "window every further layer costs the longer of its copy and its compute (as measured here)",
            f"GPU-to-GPU: ZeRO-3 gathers {self.gpu2gpu_gbps:g} GB/s a GPU (NVLink all-gather, assumed); "
            "prefetch hides them under compute when shorter",
            f"disk: the 16-bit checkpoint read once at {self.disk_gbps:g} GB/s at load (random weights read "
            "nothing); each layer's load work as measured on one rank here (its share on several ranks "
            "not counted: an upper bound)",
            "ZeRO-3 partitions: weights (GPU without offload, pinned host memory with it: what a layer "
            "adds to a rank's RSS here, the allocator's rounding included) divide by the rank count; "
            "activations and the gathered working set do not (one rank's layers in flight, as measured "
            "here, an upper bound where several ranks keep fewer)",
            *network,
        ]


def gather_s(moved_bytes: float, scaling: Scaling) -> float:
    """Seconds the target's ranks spend all-gathering `moved_bytes` of weights (each rank receives the
    others' partitions over NVLink, and over the network those of other nodes)."""
    nt, nodes = scaling.target_gpus or 1, scaling.target_nodes
    seconds = moved_bytes * (nt - 1) / nt / (scaling.gpu2gpu_gbps * 1e9)
    if nodes > 1 and scaling.internode_gbps:
        seconds += moved_bytes * (nodes - 1) / nodes / (scaling.internode_gbps * 1e9)
    return seconds


def _offload_parts(
    fixed: float, per_layer: float, facts: Any, profile: Any, machine: Scaling, overlap: bool = True
) -> float:
    """The offloaded step part by part on `machine` (its target fields), from the line past the prefetch
    window measured on its measuring ranks: each rank copies its share of a layer over its own link and
    all-gathers the rest; compute scales by the bf16 rate; every layer costs the longer of its transfer
    and its compute (the line's slope: compute's, or an upper bound on it where the copy set it), or
    both (`overlap` false: the transfers not hidden). The measuring ranks' all-gathers are taken out of
    the measured line first."""
    nm = max(1, machine.measured_gpus or 1)
    micro = profile.training.grad_accum
    # the bytes a layer, and the embeddings and head beyond a layer's, move an optimizer step
    layer_gather = ZERO3_LAYER_FETCHES * micro * facts.layer_bytes
    other_gather = micro * max(0.0, facts.other_bytes - facts.layer_bytes)
    per_second = nm * machine.h2d_gbps_measured * 1e9  # the measuring ranks' links
    copy, other = layer_gather / per_second, other_gather / per_second
    link = (nm / (machine.target_gpus or 1)) * (machine.h2d_gbps_measured / machine.h2d_gbps_target)
    measured = replace(machine, target_gpus=nm, target_nodes=1)
    layer_move = link * copy + gather_s(layer_gather, machine)
    compute = max(0.0, per_layer - gather_s(layer_gather, measured)) * machine.compute_ratio
    rest = (fixed - other - gather_s(other_gather, measured)) * machine.compute_ratio
    rest += link * other + gather_s(other_gather, machine)
    return rest + facts.layers * (max(layer_move, compute) if overlap else layer_move + compute)


def serial_fetch(profile: Any, s: Scaling) -> bool:
    """Whether the target's ranks fetch offloaded layers by DeepSpeed's own fetch (several ranks; the
    overlapped fetch, `trainer/weights/zero3_fetch.py`, runs on one) while these depths ran the
    overlapped one: how much of the transfers compute hides there is not measured."""
    offload = profile.deepspeed.offload_param
    return overlapped_fetch(s.measured_gpus or 1, offload) and not overlapped_fetch(
        s.target_gpus or 1, offload
    )


def offload_step_target(
    fixed: float, per_layer: float, facts: Any, profile: Any, s: Scaling, overlap: bool = True
) -> float:
    """The offloaded step on the target: the measured line at full depth plus what the modelled parts
    change from this machine to the target (a rehearsal on the target itself predicts its own line);
    `overlap` false: on the target the transfers add to compute."""
    here = replace(
        s,
        target_gpus=s.measured_gpus or 1,
        target_nodes=1,
        compute_ratio=1.0,
        h2d_gbps_target=s.h2d_gbps_measured,
    )
    change = _offload_parts(fixed, per_layer, facts, profile, s, overlap) - _offload_parts(
        fixed, per_layer, facts, profile, here
    )
    return max(0.0, fixed + per_layer * facts.layers + change)


def step_target(fit: Any, facts: Any, profile: Any, s: Scaling) -> tuple[float, tuple[float, float]]:
    """The target's optimizer step and its range, from the step's fit."""
    full = facts.layers
    ds = profile.deepspeed
    offload = ds.offload_param != "none"
    nm, nt = s.measured_gpus or 1, s.target_gpus or 1
    weights = facts.layer_bytes * full + facts.other_bytes

    def target(fixed: float, per_layer: float) -> float:
        if fit.knee:  # the offloaded step past its prefetch window
            return offload_step_target(fixed, per_layer, facts, profile, s)
        step = fixed + per_layer * full
        moved = ZERO3_LAYER_FETCHES * profile.training.grad_accum * weights  # a step's gathered bytes
        h2d_here = moved / nm / (s.h2d_gbps_measured * 1e9) if offload else 0.0
        h2d_target = moved / nt / (s.h2d_gbps_target * 1e9) if offload else 0.0
        compute = max(0.0, step - h2d_here) * s.compute_ratio
        return max(compute, gather_s(moved, s)) + h2d_target

    value = target(fit.fixed, fit.per_layer)
    ends = [value]
    if fit.knee and serial_fetch(profile, s):  # the transfers not hidden: the range's far end
        ends.append(offload_step_target(fit.fixed, fit.per_layer, facts, profile, s, overlap=False))
    if fit.used:
        anchor = max(fit.used, key=lambda p: p.layers)
        ends += [target(anchor.value - slope * anchor.layers, slope) for slope in fit.bounds]
    here = fit.at(full)
    band = fit.band(full) * (value / here if here > 0 else 1.0)
    return value, (max(0.0, min(ends) - band), max(ends) + band)
