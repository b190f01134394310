"""One configuration to evaluate: GPUs and nodes, ZeRO stage and offload, loader, sequence and rows, and
the trainer's paths that change what a step holds. Each option of the plan is one `Setup`.
"""

from __future__ import annotations

from dataclasses import dataclass

from cockpit.contract import keeps_embeddings

# The offload modes the planner compares, (offload_param, offload_optimizer) -> name.
# How a setup without the kept dequantized experts (`Setup.keep_dequant` false) is said, in lines and tables.
DEQUANTIZED_AGAIN = "experts dequantized again for backward"
OFFLOAD_MODES = {
    ("none", "none"): "no offload",
    ("none", "cpu"): "optimizer offload",
    ("cpu", "cpu"): "param + optimizer offload",
    ("nvme", "nvme"): "NVMe offload",
}


@dataclass(frozen=True)
class Setup:
    """One configuration to evaluate."""

    gpus: int  # a node; 0: train on the CPU
    stage: int = 3
    offload_param: str = "cpu"
    offload_optimizer: str = "cpu"
    loader: str = "layerwise"  # model.loader: "layerwise" or "transformers" (from_pretrained)
    seq_len: int = 1024
    micro_batch: int = 1
    grad_accum: int = 1  # micro-batches a step (training.grad_accum)
    grad_ckpt: bool = True
    gpu_mem_gib: float = 0.0
    host_ram_gib: float = 0.0
    gpu_name: str = ""
    packing: bool = False
    doc_tokens: int = 0  # mean tokens an example (data.mean_tokens); 0: every example fills its sequence
    prefetch_layers: float = 0.0  # deepspeed.prefetch_layers: layers gathered ahead of the one computing
    # deepspeed.embeddings_on_gpu under parameter offload: the embedding and lm_head live on the GPUs
    embeddings_on_gpu: bool = False
    nodes: int = 1  # hosts, each with `gpus` GPUs (hardware.nodes)
    chunked_loss: bool = False  # training.chunked_loss: the logits a chunk of target rows at a time
    attention: str = ""  # training.attention: "varlen" is the fast path the working memory was fitted on
    # varlen attention by FlashAttention-4 (Hopper, trainer/layers/flash4.py), whose working memory is
    # WORKING_LAYERS_FAST; elsewhere the varlen path of before, WORKING_LAYERS_VARLEN
    flash4: bool = False
    # training.keep_dequantized_experts: the dequant path's expert weights kept from recompute to backward
    # (trainer/layers/frozen_experts.py); benchmarks/fit_memory.py plans rows measured before it existed as
    # False.
    keep_dequant: bool = True

    @property
    def fast_paths(self) -> bool:
        """The trainer's fast paths, those the working memory was measured on: chunked loss, varlen."""
        return self.chunked_loss and self.attention == "varlen"

    @property
    def keeps_embeddings(self) -> bool:
        """The embedding and lm_head on the GPUs while the layers are offloaded (`embeddings_on_gpu`)."""
        return keeps_embeddings(self.embeddings_on_gpu, self.stage, self.offload_param, self.gpus)

    @property
    def ranks_per_node(self) -> int:
        """Ranks on each host: one a GPU, or one on the CPU."""
        return max(1, self.gpus)

    @property
    def ranks(self) -> int:
        """Every rank of the job: nodes x ranks a node (ZeRO partitions divide by this)."""
        return self.nodes * self.ranks_per_node

    @property
    def offload(self) -> str:
        """The offload mode's name (OFFLOAD_MODES), or both devices spelled out."""
        return OFFLOAD_MODES.get(
            (self.offload_param, self.offload_optimizer),
            f"param {self.offload_param}, optimizer {self.offload_optimizer}",
        )

    def describe(self) -> str:
        """One line: ZeRO stage and offload, loader, GPUs and nodes, sequence and rows."""
        mode = self.offload
        if self.stage != 3:
            mode = f"ZeRO-{self.stage}, {mode}"
        where = "layer-by-layer load" if self.loader == "layerwise" else "from_pretrained load"
        hw = f"{self.gpus} GPU" + ("s" if self.gpus != 1 else "") if self.gpus else "CPU"
        if self.nodes > 1:
            hw = f"{self.nodes} nodes x {hw}"
        rows = f" x {self.micro_batch}" if self.micro_batch > 1 else ""
        again = "" if self.keep_dequant else f", {DEQUANTIZED_AGAIN}"
        return f"{mode}, {where}, {hw}, seq {self.seq_len}{rows}{again}"
