"""The memory and time model of one configuration: where every byte sits at load and in training.

Pure arithmetic over the model's tensors (`geometry.py`) and how each is stored (`formats.py`). What
the model assumes, and why (see `../shared/FACTS.md` for the measurements it leans on):

Load (from process start to the end of `deepspeed.initialize`), by `model.loader`:
- "layerwise" (the trainer's default, `trainer/loader.py`): the model is built on the meta device and
  filled one decoder layer at a time on each rank's GPU: the layer's tensors are read, attention (and
  dense MLP) `nn.Linear`s quantized by bitsandbytes there, the fused experts packed to NF4 a chunk of
  experts at a time, and under ZeRO-3 the layer is partitioned at once (`zero.Init(module=layer)`):
  this rank keeps its slice, on the GPU without parameter offload, in pinned host memory with it.
  Embeddings, final norm and lm_head are loaded whole onto the GPU last, then partitioned. So the GPU
  peak at load is the larger of (the partitions kept so far + one layer being loaded) and (every layer's
  partition + embeddings and lm_head whole), not the whole model per GPU; host RAM holds each rank's
  partitions (pinned, with offload), never ranks x the whole model.
- "transformers" (`from_pretrained`): a quantized model skips `zero.Init`, so every rank builds the
  *whole* model on its GPU (bitsandbytes quantizes there; the fused experts stay in 16 bit until the
  trainer packs them after loading); the fused experts are stacked from per-expert checkpoint tensors,
  which holds a second copy of the largest fused tensor for a moment. DeepSpeed partitions at
  `initialize`.
- Every rank maps the safetensors files: its RSS counts every page it reads (physically one shared,
  reclaimable page cache); the layerwise loader keeps them mapped until the whole model is loaded.
- With several ranks the layerwise loader reads and quantizes each unit (a decoder layer, or the rest)
  on one rank only (`cockpit.contract.load_builder`) and broadcasts it (`trainer/load_share.py`): a
  rank maps only the checkpoint pages of its own units, a host's page cache holds its ranks' units, and
  a GPU holds the unit its rank built, whole, while it receives another before ZeRO-3 partitions both.
- With parameter offload, DeepSpeed copies each rank's partitions into pinned host memory, and PyTorch's
  pinned allocator rounds every block up to a power of two (each of the three packed-expert parameters
  on its own).
Training (peak after the engine is built):
- Offloaded or partitioned over several GPUs, ZeRO-3 gathers one decoder layer at a time (with gradient
  checkpointing); autograd keeps the lm_head weight gathered from its forward to its backward, beside
  the fp32 logits and loss buffers. Both are counted at once: this is what the 8.5 GiB measured on the
  1-layer 235B slice (FACTS.md) shows.
- NF4 experts are dequantized a chunk of routed experts at a time (~512 MiB of 16-bit weights), in the
  forward and again in the backward; that chunk comes on top of the gathered (packed) layer.
- Without gradient checkpointing autograd keeps a view of every gathered weight until backward, so the
  whole model ends up gathered: offload then saves no GPU memory.
- The bitsandbytes quantization state of `Linear4bit` is not a parameter: whole, on every GPU. The
  packed experts' scales are parameters: partitioned like the codes.
- An offloaded step moves each layer's weights host-to-device twice (forward, then recompute and
  backward share one gather), and the embeddings and lm_head once unless `deepspeed.embeddings_on_gpu`
  keeps them on the GPU (the default). A fitted share of those copies is not hidden under compute
  (`MeasuredSpeed.offload_exposed`: 0.19 with the trainer's overlapped fetch and 3 layers prefetched).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cache, cached_property

from cockpit.contract import (
    ZERO3_LAYER_FETCHES,
    dequant_chunk_experts,
    keeps_embeddings,
    load_builder,
    loss_chunk_rows,
)
from cockpit.plan.formats import DTYPE_BYTES, Stored, four_bit, packed_experts, plain, pow2_ceil
from cockpit.plan.geometry import ModelGeometry, TensorSpec
from cockpit.plan.speed import H200_STORY_SLICE, MeasuredSpeed

GiB = 1024**3
GB = 1e9

# Transformers' "auto" values for the DeepSpeed config (integrations/deepspeed.py).
PERSISTENCE_PER_HIDDEN = 10  # stage3_param_persistence_threshold = 10 * hidden_size
# DeepSpeed NVMe offload defaults: 5 swap buffers of 1e8 elements; up to 1e9 elements kept in host RAM.
NVME_BUFFERS = 5 * 100_000_000
NVME_MAX_IN_CPU = 1_000_000_000
# Measured, not derived: bytes per logit alive at the training peak beyond the logits' own dtype (fp32
# upcast for the loss and what the loss keeps). Fitted on the H200 slices (experts4bit_h200.md, seq 1024,
# bf16): every one of the 8 configurations (bf16 or NF4 experts, with or without param offload, 1 or
# 4 layers) leaves 1.04-1.05 GiB for the logits once the other terms are counted, 7.2 bytes a logit.
# The earlier derived guess (12 bytes: fp32 copy, log-softmax, gradients) over-predicted by ~1 GiB.
LOGITS_EXTRA_BYTES = 5.2
# Measured, not derived: one layer's recompute and backward hold this many times what autograd saves for
# it (`Activations.layer_saved`) on the trainer's fast paths (chunked loss, fused NF4 expert GEMMs, varlen
# attention). Fitted by benchmarks/fit_memory.py on the H200 slices of step_speed (no offload, 4 layers,
# 4,096 and 8,192 tokens) as the larger of the two, a bound rather than a mean: 4,096 tokens needs 1.06,
# 8,192 needs 1.65 (benchmarks/results/plan_memory_fit.md, with the rows out of sample). The unfused path
# keeps the derived 2 (recompute, and as much again in gradients), which its own measurements match
# (experts4bit_h200.md at 1,024 tokens; before-4096 of step_speed: +1%).
WORKING_LAYERS_FAST = 1.65
MEASURED_TOKENS = 8192  # the most tokens a micro-batch WORKING_LAYERS_FAST was measured at
WORKING_LAYERS = 2.0

# The offload modes the planner compares, (offload_param, offload_optimizer) -> name.
OFFLOAD_MODES = {
    ("none", "none"): "no offload",
    ("none", "cpu"): "optimizer offload",
    ("cpu", "cpu"): "param + optimizer offload",
    ("nvme", "nvme"): "NVMe offload",
}

GPU_TFLOPS = {
    "H200": 989.0,
    "H100": 989.0,
    "GH200": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "A6000": 155.0,
    "4090": 165.0,
}


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
    # Step time from costs measured on a GPU (cockpit.plan.speed): fixed and per-layer seconds and the
    # efficiency of the model FLOPs, fitted to benchmarks/results/step_speed_h200.json.
    speed: MeasuredSpeed = H200_STORY_SLICE
    target_fraction: float = 0.5  # share of tokens with a loss target (the head runs on those only)
    gpu_tflops: float = 0.0  # bf16 dense peak per GPU; 0 = from the GPU's name (default 300)
    process_rss_gib_gpu: float = (
        2.4  # RSS of a trainer rank before weights (torch, CUDA, NCCL): FACTS.md 12.4 GiB
    )
    process_rss_gib_cpu: float = 0.57  # the same on a CPU-only machine (measured with the CPU benchmark)
    gpu_usable_fraction: float = 0.92  # CUDA context, NCCL buffers, allocator fragmentation
    host_usable_fraction: float = 0.90  # the OS and everything else on the host

    def tflops(self, gpu_name: str) -> float:
        return self.gpu_tflops or datasheet_tflops(gpu_name) or 300.0


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
        return self.experts_4bit and t.kind == "experts" and len(t.shape) == 3

    def quantized(self, t: TensorSpec) -> bool:
        """bitsandbytes replaces nn.Linear (never lm_head); the trainer packs fused experts when asked."""
        if t.kind == "experts":
            return self.packs_experts(t)
        if not self.load_in_4bit:
            return False
        return t.linear and t.kind != "lm_head"

    def store(self, t: TensorSpec) -> Stored:
        if self.packs_experts(t):
            return packed_experts(*t.shape, self.experts_storage_dtype)
        if self.quantized(t):
            return four_bit(t.numel, self.double_quant, self.storage_dtype, self.quant_type)
        return plain(t.numel, self.compute_dtype)

    @property
    def act_bytes(self) -> int:
        return DTYPE_BYTES[self.compute_dtype]


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
    attention: str = ""  # training.attention: "varlen" is the fast path WORKING_LAYERS_FAST was fitted on

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
        return OFFLOAD_MODES.get(
            (self.offload_param, self.offload_optimizer),
            f"param {self.offload_param}, optimizer {self.offload_optimizer}",
        )

    def describe(self) -> str:
        mode = self.offload
        if self.stage != 3:
            mode = f"ZeRO-{self.stage}, {mode}"
        where = "layer-by-layer load" if self.loader == "layerwise" else "from_pretrained load"
        hw = f"{self.gpus} GPU" + ("s" if self.gpus != 1 else "") if self.gpus else "CPU"
        if self.nodes > 1:
            hw = f"{self.nodes} nodes x {hw}"
        rows = f" x {self.micro_batch}" if self.micro_batch > 1 else ""
        return f"{mode}, {where}, {hw}, seq {self.seq_len}{rows}"


@dataclass(frozen=True)
class Weights:
    """Every tensor with its storage, plus the sums the phases need."""

    geometry: ModelGeometry
    precision: Precision
    items: tuple[tuple[TensorSpec, Stored], ...]

    @classmethod
    def of(cls, geometry: ModelGeometry, precision: Precision) -> Weights:
        return cls(geometry, precision, tuple((t, precision.store(t)) for t in geometry.tensors()))

    @property
    def data_bytes(self) -> int:
        return sum(s.data_bytes for _, s in self.items)

    @property
    def state_bytes(self) -> int:
        return sum(s.state_bytes for _, s in self.items)

    @property
    def stored_bytes(self) -> int:
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

        Derived from `trainer/loader.py` and `trainer/experts4bit.py`, tensor by tensor in order: what is
        already loaded of the unit stays whole; a `Linear4bit` weight is copied to the GPU in the compute
        dtype and quantized there; a packed experts weight allocates its packed tensors whole, then
        streams `chunk` experts (`cockpit.contract.dequant_chunk_experts`): the per-expert copies and their
        stack coexist (2 chunks in the checkpoint dtype), beside the previous chunk's quantize outputs
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

    def largest_tensor(self) -> int:
        """The largest single parameter (one of a packed weight's three)."""
        return max(numel * size for _, s in self.items for numel, size in s.pieces())


def lora_params(geometry: ModelGeometry, targets: list[str] | tuple[str, ...], r: int) -> int:
    """LoRA adds r * (in + out) to every nn.Linear whose leaf name is a target (never the fused experts)."""
    total = 0
    for t in geometry.tensors():
        if t.linear and t.name.endswith(".weight") and t.module in targets:
            out_f, in_f = t.shape
            total += r * (in_f + out_f)
    return total


@dataclass(frozen=True)
class Activations:
    """Activation bytes per GPU for one micro-batch."""

    layer_saved: int  # what autograd saves for one decoder layer (the largest)
    checkpoints: int  # the layer inputs kept for recompute (gradient checkpointing)
    all_layers: int  # every layer's saved tensors (no checkpointing)
    logits: int  # logits and what the loss holds of them at the peak (LOGITS_EXTRA_BYTES, measured)
    working_layers: float = WORKING_LAYERS  # a layer's recompute + backward, in layer_saved

    def stack(self, grad_ckpt: bool) -> int:
        return self.checkpoints if grad_ckpt else self.all_layers

    def working(self, grad_ckpt: bool) -> int:
        """One layer's recompute plus its backward transients (or just the transients)."""
        return int(self.working_layers * self.layer_saved) if grad_ckpt else self.layer_saved

    def total(self, grad_ckpt: bool) -> int:
        return self.stack(grad_ckpt) + self.working(grad_ckpt) + self.logits


def chunked_loss_bytes(geometry: ModelGeometry, tokens: int, act_bytes: int) -> int:
    """What the chunked loss holds at once (trainer/loss.py): one chunk's fp32 logits, turned in place
    into probabilities, their 16-bit copy for the two GEMMs, and the hidden states' gradient it fills."""
    rows = loss_chunk_rows(geometry.vocab)
    return rows * geometry.vocab * (4 + act_bytes) + tokens * geometry.hidden * act_bytes


def activations(
    geometry: ModelGeometry,
    seq_len: int,
    micro_batch: int,
    act_bytes: int,
    lora_r: int = 0,
    chunked_loss: bool = False,
    fast_paths: bool = False,
) -> Activations:
    """Activation bytes of one micro-batch; `chunked_loss`: the loss a chunk of rows at a time;
    `fast_paths` (`Setup.fast_paths`): a layer's recompute and backward hold their measured
    WORKING_LAYERS_FAST, else the derived WORKING_LAYERS."""
    g, tokens = geometry, seq_len * micro_batch
    attention = act_bytes * (3 * g.hidden + 3 * g.q_dim + 4 * g.kv_dim + 4 * lora_r) + 8 * g.hidden
    dense = act_bytes * (g.hidden + 4 * g.intermediate)
    moe = g.top_k * act_bytes * (3 * g.hidden + 4 * g.moe_intermediate) + 8 * g.experts
    if g.shared_expert_intermediate:
        moe += act_bytes * (g.hidden + 4 * g.shared_expert_intermediate)
    per_layer = [tokens * (attention + (moe if i in g.sparse_layers else dense)) for i in range(g.layers)]
    return Activations(
        layer_saved=max(per_layer, default=0),
        checkpoints=g.layers * tokens * g.hidden * act_bytes,
        all_layers=sum(per_layer),
        logits=chunked_loss_bytes(g, tokens, act_bytes)
        if chunked_loss
        else int(tokens * g.vocab * (act_bytes + LOGITS_EXTRA_BYTES)),
        working_layers=WORKING_LAYERS_FAST if fast_paths else WORKING_LAYERS,
    )


@dataclass
class Phase:
    """Peaks of one phase: per GPU (allocated), per rank process (RSS), and the whole host."""

    gpu: dict[str, int] = field(default_factory=dict)
    rss: dict[str, int] = field(default_factory=dict)
    host: dict[str, int] = field(default_factory=dict)
    page_cache: int = 0  # shared and reclaimable: not counted against host RAM

    @property
    def gpu_peak(self) -> int:
        return sum(self.gpu.values())

    @property
    def rss_peak(self) -> int:
        return sum(self.rss.values())

    @property
    def host_peak(self) -> int:
        return sum(self.host.values())


@dataclass(frozen=True)
class Check:
    resource: str  # "GPU memory", "host RAM"
    phase: str  # "at load", "in training"
    need: int
    limit: int

    @property
    def name(self) -> str:
        return f"{self.resource} {self.phase}"

    @property
    def checked(self) -> bool:
        """False when the limit is unknown (no NVML, nothing in the profile or on the command line)."""
        return self.limit > 0

    @property
    def ok(self) -> bool:
        return not self.checked or self.need <= self.limit

    @property
    def ratio(self) -> float:
        return self.need / self.limit if self.checked else 0.0


@dataclass
class Estimate:
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
class Inputs:
    """What does not change between options: the model, its precision, LoRA and the assumptions."""

    geometry: ModelGeometry
    precision: Precision
    lora_targets: tuple[str, ...]
    lora_r: int
    assumptions: Assumptions = Assumptions()

    @cached_property
    def weights(self) -> Weights:
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
        )

    def with_experts_4bit(self, on: bool) -> Inputs:
        return replace(self, precision=replace(self.precision, experts_4bit=on))


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


def _partitions(w: Weights, setup: Setup) -> tuple[int, int, int]:
    """Per rank: partition bytes of non-persistent params, their pinned (power-of-two) bytes, and the
    persistent params' bytes (whole on every GPU)."""
    n = setup.ranks if setup.stage == 3 else 1
    kept = setup.keeps_embeddings
    part = pinned = persistent = 0
    for t, s in w.items:
        if kept and t.block in ("embed", "lm_head"):
            continue  # on the GPU: counted there
        for numel, size in s.pieces():
            if setup.stage == 3 and w.persistent(numel):
                persistent += numel * size
                continue
            nbytes = math.ceil(numel / n) * size
            part += nbytes
            pinned += pow2_ceil(nbytes)
    return part, pinned, persistent


def _layerwise_load(
    w: Weights, setup: Setup, load: Phase, baseline: int, host_params: int, host_opt: int
) -> None:
    """The load phase of `trainer/loader.py` on GPUs (see the module docstring)."""
    n = setup.ranks if setup.stage == 3 else 1
    partitioned = setup.stage == 3
    on_gpu = setup.offload_param == "none"
    state = w.state_bytes  # Linear4bit quantization state: not a parameter, whole on every GPU
    layers = [b for b in w.by_block if b.startswith("layer.")]
    kept = 0  # partitions (and persistent params) of the layers loaded so far, on this GPU
    worst_layer, kept_before = 0, 0
    shared = setup.ranks > 1  # each unit built by one rank and broadcast (contract.load_builder)
    for b in layers:
        copy = w.partition_copy(b, n) if partitioned and on_gpu else 0
        unit = max(w.layerwise_unit_peak(b), w.blocks[b] + copy)
        if shared:  # the unit this rank built, whole, beside the one it receives
            unit = max(unit, 2 * w.blocks[b] + copy)
        if kept + unit > kept_before + worst_layer:
            worst_layer, kept_before = unit, kept
        if partitioned:
            part, persistent = w.kept(b, n, on_gpu)
            kept += part + persistent
        else:
            kept += w.blocks[b]
    rest = [b for b in w.by_block if not b.startswith("layer.")]
    rest_whole = sum(w.blocks[b] for b in rest)
    rest_copy = max((w.partition_copy(b, n) for b in rest), default=0) if partitioned and on_gpu else 0
    if kept_before + worst_layer >= kept + rest_whole + rest_copy:
        load.gpu = {
            "layer partitions kept": kept_before,
            "one layer being loaded": worst_layer,
            "quantization state": state,
        }
    else:
        load.gpu = {
            "layer partitions kept": kept,
            "embeddings + lm_head whole": rest_whole,
            "partition copy": rest_copy,
            "quantization state": state,
        }
    # Host: each rank pins its partitions as each layer is partitioned, while the checkpoint pages it
    # read stay mapped; the optimizer's pinned buffers come at deepspeed.initialize, once they are unmapped.
    reads = w.checkpoint_reads(setup.ranks)
    ranks = setup.ranks_per_node  # host RAM is each host's: its own ranks
    load.page_cache = max(sum(reads[i : i + ranks]) for i in range(0, setup.ranks, ranks))
    load.rss = {"process": baseline, "offload buffers (pinned)": host_params}
    if max(reads) >= host_opt:
        load.rss["checkpoint pages"] = max(reads)
    else:
        load.rss["optimizer state (pinned)"] = host_opt
    load.host = {"ranks x process": ranks * baseline, "offload buffers": ranks * (host_params + host_opt)}


def estimate(inputs: Inputs, setup: Setup) -> Estimate:
    """Both phases of one configuration, its speed, and whether it fits."""
    w, a = inputs.weights, inputs.assumptions
    g, prec = inputs.geometry, inputs.precision
    n = setup.ranks
    acts = inputs.activations(setup)
    lora = lora_params(g, inputs.lora_targets, inputs.lora_r)
    part, pinned, persistent = _partitions(w, setup)
    zero_n = n if setup.stage >= 1 else 1
    opt_bytes = 16 * lora // zero_n  # fp32 master, two Adam moments, fp32 gradient
    baseline = int((a.process_rss_gib_gpu if setup.gpus else a.process_rss_gib_cpu) * GiB)
    ckpt_file = w.checkpoint_bytes
    notes: list[str] = []
    if setup.fast_paths and setup.seq_len * setup.micro_batch > MEASURED_TOKENS:
        notes.append(
            f"a layer's recompute and backward are measured up to {MEASURED_TOKENS:,} tokens a micro-batch "
            "(benchmarks/fit_memory.py); longer micro-batches are read off that bound, unmeasured"
        )

    load, train = Phase(page_cache=ckpt_file), Phase()
    host_opt = pow2_ceil(opt_bytes) if setup.offload_optimizer == "cpu" else 0
    if setup.offload_param == "cpu":
        host_params = pinned
    elif setup.offload_param == "nvme":
        size = max(s.itemsize for _, s in w.items)
        host_params = NVME_BUFFERS * size + min(NVME_MAX_IN_CPU * size, part)
    else:
        host_params = 0

    if setup.gpus == 0:
        # Everything lives in host RAM: the model once, activations, optimizer.
        model = w.stored_bytes
        load.rss = {
            "process": baseline,
            "checkpoint pages": ckpt_file,
            "model": model,
            "load transient": w.load_excess()
            if setup.loader == "transformers"
            else max((w.layerwise_unit_peak(b) - w.blocks[b] for b in w.by_block), default=0),
        }
        train.rss = {
            "process": baseline,
            "model": model,
            "activations": acts.total(setup.grad_ckpt),
            "LoRA + optimizer": lora * (2 * prec.act_bytes) + 16 * lora,
        }
        load.host, train.host = dict(load.rss), dict(train.rss)
        load.host.pop("checkpoint pages")
    else:
        gathering = setup.stage == 3 and (setup.offload_param != "none" or n > 1)
        # --- load ---
        if setup.loader == "layerwise":
            _layerwise_load(w, setup, load, baseline, host_params, host_opt)
        else:
            # from_pretrained holds the experts as the checkpoint has them; the trainer packs them after.
            whole = w if not prec.experts_4bit else Weights.of(g, replace(prec, experts_4bit=False))
            ds_init = (
                0
                if setup.offload_param != "none"
                else whole.largest_tensor() // (n if setup.stage == 3 else 1)
            )
            load.gpu = {
                "whole model on each GPU": whole.stored_bytes,
                "load transient": max(whole.load_excess(), ds_init),
            }
            load.rss = {"process": baseline, "checkpoint pages": ckpt_file}
            after_init = baseline + host_params + host_opt
            if after_init > sum(load.rss.values()):
                load.rss = {"process": baseline, "offload buffers": host_params + host_opt}
            here = setup.ranks_per_node  # host RAM is each host's: its own ranks
            load.host = {"ranks x process": here * baseline}
            if after_init > baseline:
                load.host = {
                    "ranks x process": here * baseline,
                    "offload buffers": here * (host_params + host_opt),
                }
        # --- training ---
        resident = 0
        if setup.offload_param == "none":
            resident = part if setup.stage == 3 else w.data_bytes
        gathered = kept_embeddings = 0
        if gathering and setup.keeps_embeddings:
            # each rank's partition on its GPU, and the whole once gathered (one and the same at one rank)
            whole = w.embeddings_bytes()
            kept_embeddings = whole + (math.ceil(whole / n) if n > 1 else 0)
        if gathering:
            if setup.grad_ckpt:  # this layer, the layers prefetched behind it, and the lm_head
                ahead = min(math.ceil(setup.prefetch_layers), g.layers - 1)  # none beyond the last layer
                gathered = (1 + ahead) * w.largest_layer()[1] + (0 if kept_embeddings else w.head_bytes())
            else:
                gathered = sum(v for k, v in w.blocks.items() if k != "embed")
                notes.append(
                    "without gradient checkpointing autograd keeps every gathered weight until backward"
                )
        train.gpu = {
            "weights (partition)": resident,
            "persistent small params": persistent if setup.stage == 3 else 0,
            "quantization state": w.state_bytes,
            "gathered layers + lm_head": gathered,
            "embeddings kept on the GPU": kept_embeddings,
            "checkpointed activations" if setup.grad_ckpt else "activations": acts.stack(setup.grad_ckpt),
            # NF4 experts dequantize a chunk at a time within the layer's recompute and backward; measured,
            # it never adds to the activation transients at seq 1024 (adding it over-predicts all four
            # NF4 slices by its 0.49 GiB), so the larger of the two counts.
            "layer recompute + backward": max(acts.working(setup.grad_ckpt), w.dequant_chunk_bytes()),
            "logits + loss": acts.logits,
            "LoRA + optimizer": 2 * lora * prec.act_bytes // zero_n
            + (opt_bytes if setup.offload_optimizer == "none" else 0),
            "reduce bucket": g.hidden * g.hidden * prec.act_bytes,
        }
        train.rss = {"process": baseline}
        if host_params:
            train.rss["offload buffers (pinned)" if setup.offload_param == "cpu" else "NVMe swap buffers"] = (
                host_params
            )
        if host_opt:
            train.rss["optimizer state (pinned)"] = host_opt
        train.host = {"ranks x process": setup.ranks_per_node * sum(train.rss.values())}

    # --- speed ---
    compute_s = transfer_s = step_s = tps = None
    if setup.gpus:
        tokens, flops = micro_batch_flops(inputs, setup)
        speed = a.speed
        # The measured rate, scaled to this GPU by the two datasheet rates (1.0 between H100 and H200).
        rate = (
            speed.measured_tflops * a.tflops(setup.gpu_name) / (datasheet_tflops(speed.gpu) or a.tflops(""))
        )
        compute_s = speed.compute_s(g.layers, flops, rate)
        moved = w.moved_bytes(setup)
        offload_s = gather_s = 0.0
        if setup.stage == 3 and setup.offload_param == "cpu":
            offload_s = speed.offload_exposed * moved / n / (a.h2d_gbps * GB)
        elif setup.stage == 3 and setup.offload_param == "nvme":
            offload_s = moved / (a.nvme_gbps * GB) + speed.offload_exposed * moved / n / (a.h2d_gbps * GB)
        if setup.stage == 3 and n > 1:
            gather_s = moved * (n - 1) / n / (a.nvlink_gbps * GB)
        if setup.stage == 3 and setup.nodes > 1:  # the other nodes' partitions come over the network
            gather_s += moved * (setup.nodes - 1) / setup.nodes / (a.internode_gbps * GB)
        transfer_s = offload_s + gather_s
        # Offloaded copies add the measured share not hidden under compute (speed.offload_exposed).
        # All-gathers over NVLink and the network are not measured here: assumed to overlap compute.
        step_s = max(compute_s, gather_s) + offload_s
        tps = n * tokens / step_s

    # --- checks ---
    checks: list[Check] = []
    gpu_limit = int(setup.gpu_mem_gib * GiB * a.gpu_usable_fraction)
    host_limit = int(setup.host_ram_gib * GiB * a.host_usable_fraction)
    if setup.gpus:
        checks.append(Check("GPU memory", "at load", load.gpu_peak, gpu_limit))
        checks.append(Check("GPU memory", "in training", train.gpu_peak, gpu_limit))
    checks.append(Check("host RAM", "at load", load.host_peak, host_limit))
    checks.append(Check("host RAM", "in training", train.host_peak, host_limit))
    return Estimate(
        setup=setup,
        load=load,
        train=train,
        compute_s=compute_s,
        transfer_s=transfer_s,
        step_s=step_s,
        tokens_per_s=tps,
        pinned_exact=part if setup.offload_param == "cpu" else 0,
        pinned_rounded=pinned if setup.offload_param == "cpu" else 0,
        checks=checks,
        notes=notes,
    )
