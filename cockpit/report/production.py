"""The production path of the tuned adapter: the `vllm serve` command that serves it, and in what
quantization.

vLLM serves LoRA adapters on a Qwen3-MoE base (`--enable-lora`, its fused-MoE LoRA layers), and over a
quantized MoE base for FP8, MXFP4, GPTQ, AWQ and compressed-tensors checkpoints, but not over
bitsandbytes, in-flight or pre-quantized (vLLM's own table of LoRA support by quantization method on MoE
models: vllm-project/vllm#29424; a maintainer there: "MoE model does not support LoRA when using
bitsandbytes quantization", #29138). The cockpit trains and evaluates on a bitsandbytes NF4 base, so the
command serves the base in FP8 (`--quantization fp8`: vLLM quantizes the 16-bit checkpoint as it loads),
about half the 16-bit bytes and supported with LoRA; a profile trained on a 16-bit base is served as it
is. Tensor parallelism spans the profile's GPUs on a node (pipeline parallelism its nodes), and
`--max-lora-rank` is the smallest value vLLM accepts at or above the profile's `lora.r`.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

# The values vLLM accepts for --max-lora-rank (vllm.config.lora.MaxLoRARanks, vLLM 0.14 and later).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
SERVE_QUANTIZATION = "fp8"  # what a 4-bit-trained base is served in: vLLM's MoE LoRA has no bitsandbytes
SOURCE = "vllm-project/vllm#29424"  # where vLLM lists its MoE LoRA support by quantization method


def vllm_max_lora_rank(r: int) -> int:
    """The smallest `--max-lora-rank` vLLM accepts that holds rank `r` (r itself past vLLM's list)."""
    return next((rank for rank in VLLM_LORA_RANKS if rank >= r), r)


@dataclass(frozen=True)
class Production:
    """How the tuned adapter would be served in production: by vLLM, on the same base model."""

    base: str  # the base model's folder (or hub id) the evaluation loaded
    adapter: str  # the adapter's folder
    name: str  # the name requests give as their `model`
    lora_r: int
    gpus: int  # a node's GPUs: the tensor-parallel size
    nodes: int = 1  # the pipeline-parallel size
    quantization: str | None = SERVE_QUANTIZATION  # vLLM's --quantization; None: the checkpoint's own
    expert_lora: bool = False  # the experts' LoRA was trained: vLLM does not read it

    @property
    def max_lora_rank(self) -> int:
        return vllm_max_lora_rank(self.lora_r)

    @property
    def tensor_parallel(self) -> int:
        return max(1, self.gpus)

    def argv(self) -> list[str]:
        """The `vllm serve` command line."""
        argv = ["vllm", "serve", self.base, "--tensor-parallel-size", str(self.tensor_parallel)]
        if self.nodes > 1:
            argv += ["--pipeline-parallel-size", str(self.nodes)]
        if self.quantization:
            argv += ["--quantization", self.quantization]
        lora = f"{self.name}={self.adapter}"
        return [*argv, "--enable-lora", "--lora-modules", lora, "--max-lora-rank", str(self.max_lora_rank)]

    @property
    def command(self) -> str:
        return shlex.join(self.argv())

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "command": self.command}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Production:
        fields = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in fields})


def production_path(profile: Mapping[str, Any], base: str, adapter: str, name: str) -> Production:
    """The production path of `adapter` on `base` for the run's profile (its report.json form: run.json's
    `profile`)."""
    lora = profile.get("lora") or {}
    hardware = profile.get("hardware") or {}
    quantization = profile.get("quantization") or {}
    return Production(
        base=base,
        adapter=adapter,
        name=name,
        lora_r=int(lora.get("r", 16)),
        gpus=int(hardware.get("gpus", 0)),
        nodes=int(hardware.get("nodes", 1)),
        quantization=SERVE_QUANTIZATION if quantization.get("load_in_4bit", True) else None,
        expert_lora=bool(lora.get("target_experts", False)),
    )


def production_lines(p: Production, short: bool = False) -> list[str]:
    """The production path in sentences (the command itself apart: each renderer sets it as code);
    `short`: the app's panel, in fewer words."""
    if short:
        lines = [f"In production (vLLM, --max-lora-rank {p.max_lora_rank} for r={p.lora_r}):"]
        if p.quantization:
            lines.append(
                f"base in {p.quantization.upper()}: vLLM's MoE LoRA runs over FP8, MXFP4, GPTQ, AWQ or "
                f"compressed-tensors, not bitsandbytes NF4 ({SOURCE}); score the served model again."
            )
        if p.expert_lora:
            lines.append("vLLM does not read the experts' LoRA (expert_lora.safetensors).")
        return lines
    if p.gpus:
        spread = f"tensor parallel over the profile's {p.gpus} GPU{'s' if p.gpus > 1 else ''} a node"
        spread += f", pipeline parallel over its {p.nodes} nodes" if p.nodes > 1 else ""
    else:
        spread = "one GPU (the profile trains on the CPU; vLLM serves on a GPU)"
    lines = [
        f"In production, vLLM serves the adapter as a LoRA module on the same base: {spread}, "
        f"--max-lora-rank {p.max_lora_rank} for the adapter's r={p.lora_r}."
    ]
    if p.quantization:
        lines.append(
            f"It serves the base in {p.quantization.upper()}: vLLM runs LoRA on a quantized MoE base in "
            "FP8, MXFP4, GPTQ, AWQ or compressed-tensors, not in bitsandbytes NF4, the cockpit's "
            f"({SOURCE}). The adapter then runs on a base rounded differently from the NF4 one it was "
            "trained and evaluated on: score the served model before relying on these F1 figures for it."
        )
    else:
        lines.append("It serves the base in its own 16-bit weights, as the adapter was trained.")
    if p.expert_lora:
        lines.append(
            "vLLM reads the adapter on lora.target_modules only: the experts' LoRA "
            "(expert_lora.safetensors) is the cockpit's own format, so in vLLM the experts are the base's."
        )
    return lines


def engine_line(batch_size: int | None, short: bool = False) -> str:
    """What the cockpit's own serving figures are: its engine's, an upper bound on cost (`short`: the
    app's panel)."""
    if short:
        batch = f", batch {batch_size}" if batch_size else ""
        return f"The cockpit's own engine (HF generate on NF4{batch}): an upper bound on the cost of serving."
    batch = f", {batch_size} requests a batch" if batch_size else ""
    return (
        "The figures above are the cockpit's own engine's: Hugging Face generate on the NF4 base with the "
        f"adapter{batch}, without a serving engine's continuous batching, paged KV cache or fused MoE "
        "kernels. They are an upper bound on the cost of serving it: vLLM on the same GPUs should cost less, "
        "which this report does not measure."
    )
