"""One configuration estimated: both phases' memory (`memory.py`), the step time, and whether it fits.

Step time: a micro-batch's compute is `speed.MeasuredSpeed` over its model FLOPs (`flops.py`); an
offloaded step moves each layer's weights host-to-device twice (forward, then recompute and backward
share one gather), and the embeddings and lm_head once unless `deepspeed.embeddings_on_gpu` keeps them on
the GPU (the default): `Weights.moved_bytes`. The copies overlap compute; a step takes at least
`MeasuredSpeed.copy_factor` times their bytes at the link's rate (measured with the trainer's overlapped
fetch and 3 layers prefetched, where the copies bound the step).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from cockpit.plan.configuration import Setup
from cockpit.plan.inputs import GB, Assumptions, GiB, Inputs, datasheet_tflops
from cockpit.plan.memory import Phase, Shares, memory_notes, phases
from cockpit.plan.weights import lora_params


@dataclass(frozen=True)
class Check:
    """One resource's need in one phase against its usable limit (0: unknown)."""

    resource: str  # "GPU memory", "host RAM"
    phase: str  # "at load", "in training"
    need: int
    limit: int

    @property
    def name(self) -> str:
        """The resource and the phase, as the plan prints them."""
        return f"{self.resource} {self.phase}"

    @property
    def checked(self) -> bool:
        """False when the limit is unknown (no NVML, nothing in the profile or on the command line)."""
        return self.limit > 0

    @property
    def ok(self) -> bool:
        """Within the limit, or the limit unknown."""
        return not self.checked or self.need <= self.limit

    @property
    def ratio(self) -> float:
        """Need over limit (0.0 with the limit unknown)."""
        return self.need / self.limit if self.checked else 0.0


@dataclass
class Estimate:
    """One configuration's phases, step time and checks."""

    setup: Setup
    load: Phase
    train: Phase
    compute_s: float | None
    transfer_s: float | None
    step_s: float | None
    tokens_per_s: float | None
    pinned_exact: int
    pinned_rounded: int
    checks: list[Check]
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        """Within every known limit (see `unchecked` for the limits nobody knows)."""
        return all(c.ok for c in self.checks)

    @property
    def unchecked(self) -> list[str]:
        """Resources whose limit is unknown, so `fits` says nothing about them."""
        return sorted({c.resource for c in self.checks if not c.checked})

    @property
    def binding(self) -> Check | None:
        """The failed check furthest over its limit, or (when it fits) the tightest one."""
        known = [c for c in self.checks if c.checked]
        if not known:
            return None
        return max(known, key=lambda c: c.ratio)


@dataclass(frozen=True)
class StepTime:
    """Seconds of one micro-batch on each rank, and the job's tokens a second."""

    compute_s: float
    transfer_s: float  # offloaded copies and all-gathers, overlapped or not
    step_s: float
    tokens_per_s: float


@cache
def _packed_fill(mean_tokens: int, seq_len: int) -> float:
    from cockpit.contract import packed_fill

    return packed_fill(mean_tokens, seq_len)


def micro_batch_flops(inputs: Inputs, setup: Setup) -> tuple[float, float]:
    """Tokens of one micro-batch and their model FLOPs (`cockpit.plan.flops`): packed rows hold the
    assumed examples at `packed_fill`; unpacked, an example fills its sequence at most."""
    from cockpit.plan.flops import token_flops

    doc = min(setup.doc_tokens or setup.seq_len, setup.seq_len)
    if setup.packing and setup.doc_tokens:
        fill = _packed_fill(setup.doc_tokens, setup.seq_len)
    else:
        fill = doc / setup.seq_len
    tokens = setup.seq_len * setup.micro_batch * fill
    lora = lora_params(inputs.geometry, inputs.lora_targets, inputs.lora_r)
    per_token = token_flops(inputs.geometry, doc, inputs.assumptions.target_fraction, lora, setup.grad_ckpt)
    return tokens, tokens * per_token.total


def step_time(inputs: Inputs, setup: Setup) -> StepTime:
    """A micro-batch's step on GPUs: measured compute, scaled to this GPU, and the copies ZeRO-3 makes."""
    a, n = inputs.assumptions, setup.ranks
    tokens, flops = micro_batch_flops(inputs, setup)
    speed = a.speed
    # The measured rate, scaled to this GPU by the two datasheet rates (1.0 between H100 and H200).
    rate = speed.measured_tflops * a.tflops(setup.gpu_name) / (datasheet_tflops(speed.gpu) or a.tflops(""))
    compute_s = speed.compute_s(inputs.geometry.layers, flops, rate)
    moved = inputs.weights.moved_bytes(setup)
    gather_s = 0.0
    copies_s = nvme_s = 0.0
    if setup.stage == 3 and setup.offload_param in ("cpu", "nvme"):
        copies_s = speed.copy_factor * moved / n / (a.h2d_gbps * GB)
    if setup.stage == 3 and setup.offload_param == "nvme":
        nvme_s = moved / (a.nvme_gbps * GB)
    if setup.stage == 3 and n > 1:
        gather_s = moved * (n - 1) / n / (a.nvlink_gbps * GB)
    if setup.stage == 3 and setup.nodes > 1:  # the other nodes' partitions come over the network
        gather_s += moved * (setup.nodes - 1) / setup.nodes / (a.internode_gbps * GB)
    # Host-to-device copies overlap compute and bound the step where longer (speed.copy_factor, measured);
    # all-gathers over NVLink and the network are not measured here: assumed to overlap compute too. NVMe
    # reads are not overlapped.
    step_s = max(compute_s, gather_s, copies_s) + nvme_s
    return StepTime(compute_s, copies_s + nvme_s + gather_s, step_s, n * tokens / step_s)


def checks(setup: Setup, a: Assumptions, load: Phase, train: Phase) -> list[Check]:
    """GPU memory (with GPUs) and host RAM, at load and in training, against their usable shares."""
    gpu_limit = int(setup.gpu_mem_gib * GiB * a.gpu_usable_fraction)
    host_limit = int(setup.host_ram_gib * GiB * a.host_usable_fraction)
    out: list[Check] = []
    if setup.gpus:
        out.append(Check("GPU memory", "at load", load.gpu_peak, gpu_limit))
        out.append(Check("GPU memory", "in training", train.gpu_peak, gpu_limit))
    out.append(Check("host RAM", "at load", load.host_peak, host_limit))
    out.append(Check("host RAM", "in training", train.host_peak, host_limit))
    return out


def estimate(inputs: Inputs, setup: Setup) -> Estimate:
    """Both phases of one configuration, its speed, and whether it fits."""
    shares = Shares.of(inputs, setup)
    load, train = phases(inputs, setup, shares)
    step = step_time(inputs, setup) if setup.gpus else None
    pinned = setup.offload_param == "cpu"
    return Estimate(
        setup=setup,
        load=load,
        train=train,
        compute_s=step.compute_s if step else None,
        transfer_s=step.transfer_s if step else None,
        step_s=step.step_s if step else None,
        tokens_per_s=step.tokens_per_s if step else None,
        pinned_exact=shares.partition if pinned else 0,
        pinned_rounded=shares.pinned if pinned else 0,
        checks=checks(setup, inputs.assumptions, load, train),
        notes=memory_notes(setup),
    )
