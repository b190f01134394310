"""What a plan is computed from: the model, how its weights are stored, LoRA and the constants the model
assumes (`Inputs`, `Assumptions`), and how a profile gives them and its own configuration (`inputs_for`,
`setup_for`, `resolve_geometry`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

from cockpit.contract import TINY_MODEL, experts_storage_dtype, loader_of
from cockpit.plan.activations import Activations, activations
from cockpit.plan.configuration import Setup
from cockpit.plan.geometry import GeometryError, ModelGeometry, geometry_from_config, load_geometry
from cockpit.plan.hardware import Hardware
from cockpit.plan.speed import STORY_SLICE, MeasuredSpeed
from cockpit.plan.weights import Precision, Weights
from cockpit.profiles import BUILTIN_PREFIX, Profile

# The units the inputs are given in: memory in GiB (`hardware`, the process sizes), bandwidth in GB/s.
GiB = 1024**3
GB = 1e9

GPU_TFLOPS = {
    "H200": 989.0,
    "H100": 989.0,
    "GH200": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "A6000": 155.0,
    "4090": 165.0,
}


# GPUs FlashAttention-4 runs on (compute capability 9, trainer/layers/flash4.py's ARCHS), by name
HOPPER = ("H200", "H100", "GH200", "H800", "H20")


def runs_flash4(gpu_name: str, kernel: str | None = None) -> bool:
    """Whether the trainer's varlen attention runs FlashAttention-4 on this GPU (a Hopper, by name), the
    flash4 extra installed where it trains, unless `COCKPIT_VARLEN_KERNEL` (`kernel`; read from the
    environment by default) asks for torch's kernels or none."""
    import os

    kernel = os.environ.get("COCKPIT_VARLEN_KERNEL", "") if kernel is None else kernel
    upper = gpu_name.upper()
    return kernel not in ("torch", "0") and any(k in upper for k in HOPPER)


def datasheet_tflops(gpu_name: str) -> float:
    """The dense bf16 rate of a GPU by its name (GPU_TFLOPS); 0.0 for a GPU not in the table."""
    upper = gpu_name.upper()
    return next((v for k, v in GPU_TFLOPS.items() if k in upper), 0.0)


@dataclass(frozen=True)
class Assumptions:
    """Constants the model does not read from the profile; each with where it comes from."""

    h2d_gbps: float = 55.0  # pinned host-to-device copies measured on the H200 box (FACTS.md)
    nvlink_gbps: float = 150.0  # effective all-gather bandwidth per GPU over NVLink
    # Between nodes: what each node's network (e.g. 400 Gb/s InfiniBand) carries of an all-gather.
    # Assumed, not measured: no multi-node run has been measured yet.
    internode_gbps: float = 50.0
    nvme_gbps: float = 6.0  # aggregate read bandwidth of the NVMe offload drive(s)
    # Reading a checkpoint or the NF4 cache at load: the profile's `hardware.disk_gbps` (this default
    # assumed; the H200 host read the story slice's cache at 1.8 GB/s: results/load_cache_model.md).
    disk_gbps: float = 2.0
    # Step time from costs measured on a GPU (cockpit.plan.speed): fixed and per-layer seconds and the
    # efficiency of the model FLOPs, fitted by benchmarks/fit_speed.py (one H100, the story's slices).
    speed: MeasuredSpeed = STORY_SLICE
    target_fraction: float = 0.5  # share of tokens with a loss target (the head runs on those only)
    gpu_tflops: float = 0.0  # bf16 dense peak per GPU; 0 = from the GPU's name (default 300)
    process_rss_gib_gpu: float = (
        2.4  # RSS of a trainer rank before weights (torch, CUDA, NCCL): FACTS.md 12.4 GiB
    )
    process_rss_gib_cpu: float = 0.57  # the same on a CPU-only machine (measured with the CPU benchmark)
    gpu_usable_fraction: float = 0.92  # CUDA context, NCCL buffers, allocator fragmentation
    host_usable_fraction: float = 0.90  # the OS and everything else on the host

    def tflops(self, gpu_name: str) -> float:
        """The bf16 dense rate of a GPU: `gpu_tflops`, else its datasheet, else 300."""
        return self.gpu_tflops or datasheet_tflops(gpu_name) or 300.0


@dataclass(frozen=True)
class Inputs:
    """What does not change between options: the model, its precision, LoRA and the assumptions."""

    geometry: ModelGeometry
    precision: Precision
    lora_targets: tuple[str, ...]
    lora_r: int
    assumptions: Assumptions = Assumptions()

    @cached_property
    def weights(self) -> Weights:
        """Every tensor with its storage (computed once)."""
        return Weights.of(self.geometry, self.precision)

    def activations(self, setup: Setup) -> Activations:
        """One micro-batch's activations in `setup` (its length, rows, loss and paths)."""
        return activations(
            self.geometry,
            setup.seq_len,
            setup.micro_batch,
            self.precision.act_bytes,
            self.lora_r,
            setup.chunked_loss,
            setup.fast_paths,
            setup.flash4,
        )

    def with_experts_4bit(self, on: bool) -> Inputs:
        """The same inputs with the fused experts packed to NF4 (`on`) or kept in 16 bit."""
        return replace(self, precision=replace(self.precision, experts_4bit=on))


class PlanError(ValueError):
    """A profile that cannot be planned (no readable config.json)."""


def resolve_geometry(profile: Profile) -> ModelGeometry:
    """The model's geometry: `model.config`, else `model.path`/config.json, else the built-in config."""
    name = profile.model.name or Path(profile.model.path).name
    try:
        if profile.model.config:
            return load_geometry(profile.model.config, name)
        if profile.model.path.startswith(BUILTIN_PREFIX):
            return geometry_from_config({"model_type": "qwen3_moe", **TINY_MODEL}, name)
        return load_geometry(profile.model.path, name)
    except GeometryError as exc:
        raise PlanError(
            f"{exc} (set model.config to the model's config.json to plan without the weights)"
        ) from None


def inputs_for(profile: Profile, geometry: ModelGeometry, assumptions: Assumptions | None = None) -> Inputs:
    """A profile's model, precision, LoRA and `assumptions` (default: `Assumptions()` with the profile's
    disk rate, `hardware.disk_gbps`)."""
    q = profile.quantization
    return Inputs(
        geometry=geometry,
        precision=Precision(
            load_in_4bit=q.load_in_4bit,
            quant_type=q.quant_type,
            double_quant=q.double_quant,
            storage_dtype=q.storage_dtype,
            compute_dtype=q.compute_dtype,
            experts_4bit=q.quantize_experts,
            experts_storage_dtype=experts_storage_dtype(profile.training.bf16, q.storage_dtype),
        ),
        lora_targets=tuple(profile.lora.target_modules),
        lora_r=profile.lora.r,
        assumptions=assumptions or Assumptions(disk_gbps=profile.hardware.disk_gbps),
    )


def setup_for(profile: Profile, hw: Hardware) -> Setup:
    """The profile's own configuration, loaded the way the trainer loads it."""
    ds, t = profile.deepspeed, profile.training
    return Setup(
        gpus=hw.gpus,
        nodes=hw.nodes,
        stage=ds.stage,
        offload_param=ds.offload_param,
        offload_optimizer=ds.offload_optimizer,
        loader=loader_of(profile.model.loader, profile.model.trust_remote_code),
        seq_len=t.seq_len,
        micro_batch=t.micro_batch_size,
        grad_accum=t.grad_accum,
        grad_ckpt=t.gradient_checkpointing,
        gpu_mem_gib=hw.gpu_mem_gib,
        host_ram_gib=hw.host_ram_gib,
        gpu_name=hw.gpu_name,
        packing=t.packing,
        doc_tokens=profile.data.mean_tokens,
        prefetch_layers=ds.prefetch_layers if ds.stage == 3 else 0.0,
        embeddings_on_gpu=ds.embeddings_on_gpu,
        chunked_loss=t.chunked_loss,
        attention=t.attention,
        flash4=hw.gpus > 0 and runs_flash4(hw.gpu_name),
        keep_dequant=t.keep_dequantized_experts,
    )
