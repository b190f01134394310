"""Every tensor of the model with how it is stored, and the byte sums the phases read.

`Precision` says how each frozen tensor is stored after load (`formats.py`: bf16, bitsandbytes 4-bit, the
trainer's packed NF4 experts); `Weights` holds every tensor (`geometry.py`) with its storage and counts
what ZeRO-3 gathers (`blocks`, `largest_layer`), partitions (`kept`, `persistent`), what a micro-batch
moves to a GPU (`moved_bytes`, shared with the trainer and the benchmarks) and what a load holds at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache

from cockpit.contract import ZERO3_LAYER_FETCHES, dequant_chunk_experts, load_builder
from cockpit.plan.configuration import Setup
from cockpit.plan.formats import DTYPE_BYTES, Stored, four_bit, packed_experts, plain
from cockpit.plan.geometry import ModelGeometry, TensorSpec

# Transformers' "auto" values for the DeepSpeed config (integrations/deepspeed.py).
PERSISTENCE_PER_HIDDEN = 10  # stage3_param_persistence_threshold = 10 * hidden_size


@dataclass(frozen=True)
class Precision:
    """How the frozen base weights are stored after load."""

    load_in_4bit: bool = True
    quant_type: str = "nf4"
    double_quant: bool = True
    storage_dtype: str = "bfloat16"
    compute_dtype: str = "bfloat16"
    experts_4bit: bool = False
    experts_storage_dtype: str = "bfloat16"  # cockpit.contract.experts_storage_dtype

    def packs_experts(self, t: TensorSpec) -> bool:
        """Whether the trainer packs this tensor to NF4: a fused experts weight, with experts_4bit."""
        return self.experts_4bit and t.kind == "experts" and len(t.shape) == 3

    def quantized(self, t: TensorSpec) -> bool:
        """bitsandbytes replaces nn.Linear (never lm_head); the trainer packs fused experts when asked."""
        if t.kind == "experts":
            return self.packs_experts(t)
        if not self.load_in_4bit:
            return False
        return t.linear and t.kind != "lm_head"

    def store(self, t: TensorSpec) -> Stored:
        """How `t` is stored after load: packed NF4 experts, bitsandbytes 4-bit, or plain."""
        if self.packs_experts(t):
            return packed_experts(*t.shape, self.experts_storage_dtype)
        if self.quantized(t):
            return four_bit(t.numel, self.double_quant, self.storage_dtype, self.quant_type)
        return plain(t.numel, self.compute_dtype)

    @property
    def act_bytes(self) -> int:
        """Bytes of one element in the compute dtype."""
        return DTYPE_BYTES[self.compute_dtype]


@dataclass(frozen=True)
class Weights:
    """Every tensor with its storage, plus the sums the phases need."""

    geometry: ModelGeometry
    precision: Precision
    items: tuple[tuple[TensorSpec, Stored], ...]

    @classmethod
    def of(cls, geometry: ModelGeometry, precision: Precision) -> Weights:
        """Every tensor of `geometry` stored as `precision` says."""
        return cls(geometry, precision, tuple((t, precision.store(t)) for t in geometry.tensors()))

    @property
    def data_bytes(self) -> int:
        """Bytes of every stored parameter (packed codes and scales included)."""
        return sum(s.data_bytes for _, s in self.items)

    @property
    def state_bytes(self) -> int:
        """Bytes of the bitsandbytes quantization state (not a parameter)."""
        return sum(s.state_bytes for _, s in self.items)

    @property
    def stored_bytes(self) -> int:
        """Everything the weights hold after load: data and quantization state."""
        return self.data_bytes + self.state_bytes

    @property
    def checkpoint_bytes(self) -> int:
        """Bytes of the safetensors files (every tensor in the checkpoint's dtype)."""
        size = DTYPE_BYTES[self.geometry.checkpoint_dtype]
        return sum(t.numel * size for t, _ in self.items)

    @cached_property
    def blocks(self) -> dict[str, int]:
        """Stored data bytes of each unit ZeRO-3 gathers together."""
        blocks: dict[str, int] = {}
        for t, s in self.items:
            blocks[t.block] = blocks.get(t.block, 0) + s.data_bytes
        return blocks

    def checkpoint_reads(self, ranks: int) -> list[int]:
        """Checkpoint bytes each rank of a layer-by-layer load reads: the units `load_builder` gives it."""
        size = DTYPE_BYTES[self.geometry.checkpoint_dtype]
        layers = sum(1 for b in self.blocks if b.startswith("layer."))
        reads = [0] * ranks
        for t, _ in self.items:
            unit = int(t.block.split(".")[1]) if t.block.startswith("layer.") else layers
            reads[load_builder(unit, ranks)] += t.numel * size
        return reads

    def largest_layer(self) -> tuple[str, int]:
        """The decoder layer ZeRO-3 gathers most bytes for, and its bytes ("none", 0 without layers)."""
        layers = {k: v for k, v in self.blocks.items() if k.startswith("layer.")}
        if not layers:
            return "none", 0
        name = max(layers, key=lambda k: layers[k])
        return name, layers[name]

    def head_bytes(self) -> int:
        """The weight the loss multiplies by: lm_head, or the embedding when they are tied."""
        return self.blocks.get("lm_head", self.blocks.get("embed", 0))

    def embeddings_bytes(self) -> int:
        """The input embedding and the lm_head (once when tied): what `deepspeed.embeddings_on_gpu` keeps."""
        return self.blocks.get("embed", 0) + self.blocks.get("lm_head", 0)

    def moved_bytes(self, setup: Setup) -> int:
        """Bytes ZeRO-3 brings to a rank's GPU in one micro-batch, all ranks' partitions together: every
        layer twice (forward, and recompute with backward), the final norm, and the embeddings unless they
        are kept on the GPU (`contract.ZERO3_LAYER_FETCHES`)."""
        layers = sum(v for k, v in self.blocks.items() if k.startswith("layer."))
        kept = setup.keeps_embeddings
        return (
            ZERO3_LAYER_FETCHES * layers
            + self.blocks.get("norm", 0)
            + (0 if kept else self.embeddings_bytes())
        )

    def persistent(self, numel: int) -> bool:
        """ZeRO-3 keeps parameters this small whole on every GPU (never partitioned nor offloaded)."""
        return numel <= PERSISTENCE_PER_HIDDEN * self.geometry.hidden

    @cached_property
    def by_block(self) -> dict[str, list[tuple[TensorSpec, Stored]]]:
        """Every tensor with its storage, by the unit ZeRO-3 gathers it in."""
        out: dict[str, list[tuple[TensorSpec, Stored]]] = {}
        for t, s in self.items:
            out.setdefault(t.block, []).append((t, s))
        return out

    def kept(self, block: str, ranks: int, on_gpu: bool) -> tuple[int, int]:
        """Per rank, after ZeRO-3 partitioned `block`: (partition bytes, and on the GPU when not
        offloaded; persistent small params' bytes, whole on the GPU)."""
        part = persistent = 0
        for _, s in self.by_block.get(block, []):
            for numel, size in s.pieces():
                if self.persistent(numel):
                    persistent += numel * size
                elif on_gpu:
                    part += math.ceil(numel / ranks) * size
        return part, persistent

    def partition_copy(self, block: str, ranks: int) -> int:
        """The largest partition ZeRO-3 allocates on the GPU while the whole parameter still exists."""
        return max(
            (
                math.ceil(numel / ranks) * size
                for _, s in self.by_block.get(block, [])
                for numel, size in s.pieces()
            ),
            default=0,
        )

    def layerwise_unit_peak(self, block: str) -> int:
        """GPU bytes while the layerwise loader reads and quantizes one unit (before it is partitioned).

        Derived from `trainer/weights/loader.py` and `trainer/layers/experts4bit.py`, tensor by tensor in
        order: what is already loaded of the unit stays whole; a `Linear4bit` weight is copied to the GPU in
        the compute dtype and quantized there; a packed experts weight allocates its packed tensors whole,
        then streams `chunk` experts (`cockpit.contract.dequant_chunk_experts`): the per-expert copies and
        their stack coexist (2 chunks in the checkpoint dtype), beside the previous chunk's quantize outputs
        (codes, fp32 absmax, 8-bit absmax) that are still referenced. On the H200 (1 layer of the story
        geometry) this gives 2,379 MiB against 2,378 MiB measured (`cuda_peak_per_layer_mib`).
        """
        ckpt = DTYPE_BYTES[self.geometry.checkpoint_dtype]
        held = peak = 0
        for t, s in self.by_block.get(block, []):
            if s.fmt == "nf4-packed":
                per_expert = t.numel // t.shape[0]
                chunk = dequant_chunk_experts(t.shape[0], per_expert)
                m = chunk * per_expert
                transient = 2 * m * ckpt + m // 2 + 4 * m // 64 + m // 64
                peak = max(peak, held + s.data_bytes + transient)
                held += s.data_bytes
            elif s.is_4bit:
                peak = max(peak, held + t.numel * self.precision.act_bytes + s.total)
                held += s.total
            else:  # copied whole (16-bit fused experts are filled in place, one expert row at a time)
                held += s.total
                peak = max(peak, held)
        return peak

    def load_excess(self) -> int:
        """Extra bytes on the loading device while the worst tensor is materialized.

        A fused expert tensor is stacked from its per-expert pieces (pieces and stack coexist, then the
        concatenation): twice its compute-dtype size at once. A Linear that bitsandbytes quantizes
        exists in the compute dtype next to its packed result.
        """
        worst = 0
        for t, s in self.items:
            full = t.numel * self.precision.act_bytes
            during = full + (s.total if s.is_4bit else 0)
            if t.merged_from > 1:
                during = max(during, 2 * full)
            worst = max(worst, during - s.total)
        return worst

    def dequant_chunk_bytes(self) -> int:
        """16-bit weights of the experts one forward (or backward) chunk dequantizes at once
        (`NF4Experts.chunk_experts`: `cockpit.contract.dequant_chunk_experts` over both fused weights)."""
        per_expert = {}
        for t, s in self.items:
            if s.fmt == "nf4-packed":
                per_expert[t.block] = per_expert.get(t.block, 0) + t.numel // t.shape[0]
        if not per_expert:
            return 0
        numel = max(per_expert.values())
        experts = self.geometry.experts
        chunk = dequant_chunk_experts(experts, numel)
        return chunk * numel * self.precision.act_bytes

    def kept_dequant_bytes(self) -> int:
        """16-bit weights the dequant path keeps from a layer's recompute for its backward: both fused
        weights of every expert of one layer. Measured on one H100 at 8 rows of 4,096 (story geometry),
        the training peak rose by 3.3 GiB with them kept, at 4 and at 8 layers, where this counts 4.5
        (benchmarks/results/step_speed_h100_keep_profile.md): the plan errs on the safe side."""
        per_layer: dict[str, int] = {}
        for t, s in self.items:
            if s.fmt == "nf4-packed":
                per_layer[t.block] = per_layer.get(t.block, 0) + t.numel
        return max(per_layer.values(), default=0) * self.precision.act_bytes

    def largest_tensor(self) -> int:
        """The largest single parameter (one of a packed weight's three)."""
        return max(numel * size for _, s in self.items for numel, size in s.pieces())


def lora_params(geometry: ModelGeometry, targets: list[str] | tuple[str, ...], r: int) -> int:
    """LoRA adds r * (in + out) to every nn.Linear whose leaf name is a target (never the fused experts)."""
    return r * _lora_widths(geometry, frozenset(targets))


@lru_cache(maxsize=32)
def _lora_widths(geometry: ModelGeometry, targets: frozenset[str]) -> int:
    """The sum of in + out over the targeted nn.Linear weights (what one unit of LoRA rank adds)."""
    total = 0
    for t in geometry.tensors():
        if t.linear and t.name.endswith(".weight") and t.module in targets:
            out_f, in_f = t.shape
            total += in_f + out_f
    return total
