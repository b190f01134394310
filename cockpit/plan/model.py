"""The memory and time model of one configuration: where every byte sits at load and in training.

Pure arithmetic over the model's tensors (`geometry.py`) and how each is stored (`formats.py`). What
the model assumes, and why (see `../shared/FACTS.md` for the measurements it leans on):

Load (from process start to the end of `deepspeed.initialize`):
- A quantized model skips `zero.Init`: every rank builds the *whole* model. With `load_on="gpu"` (what
  the trainer does: `device_map={"": local_rank}`, bitsandbytes quantizes on the GPU) each rank's whole
  model lands on its GPU; the fused experts are stacked from per-expert checkpoint tensors there, which
  holds a second copy of the largest fused tensor for a moment. With `load_on="host"` each rank holds
  the whole model in host RAM instead (needs a loader that quantizes on the host).
- Every rank maps the safetensors files: its RSS counts every page it reads (physically one shared,
  reclaimable page cache).
- With parameter offload, DeepSpeed copies each rank's partitions into pinned host memory, and PyTorch's
  pinned allocator rounds every block up to a power of two.
Training (peak after the engine is built):
- Offloaded or partitioned over several GPUs, ZeRO-3 gathers one decoder layer at a time (with gradient
  checkpointing); autograd keeps the lm_head weight gathered from its forward to its backward, beside
  the fp32 logits and loss buffers. Both are counted at once: this is what the 8.5 GiB measured on the
  1-layer 235B slice (FACTS.md) shows.
- Without gradient checkpointing autograd keeps a view of every gathered weight until backward, so the
  whole model ends up gathered: offload then saves no GPU memory.
- The bitsandbytes quantization state is not a parameter: whole, on every GPU.
- An offloaded step moves each layer's weights host-to-device twice (forward, then recompute and
  backward share one gather) and the embeddings and lm_head once; copies overlap compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property

from cockpit.plan.formats import DTYPE_BYTES, Stored, four_bit, plain, pow2_ceil
from cockpit.plan.geometry import ModelGeometry, TensorSpec

GiB = 1024**3
GB = 1e9

# Transformers' "auto" values for the DeepSpeed config (integrations/deepspeed.py).
PERSISTENCE_PER_HIDDEN = 10  # stage3_param_persistence_threshold = 10 * hidden_size
# DeepSpeed NVMe offload defaults: 5 swap buffers of 1e8 elements; up to 1e9 elements kept in host RAM.
NVME_BUFFERS = 5 * 100_000_000
NVME_MAX_IN_CPU = 1_000_000_000

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


@dataclass(frozen=True)
class Assumptions:
    """Constants the model does not read from the profile; each with where it comes from."""

    h2d_gbps: float = 55.0  # pinned host-to-device copies measured on the H200 box (FACTS.md)
    nvlink_gbps: float = 150.0  # effective all-gather bandwidth per GPU over NVLink
    nvme_gbps: float = 6.0  # aggregate read bandwidth of the NVMe offload drive(s)
    mfu: float = 0.1  # achieved fraction of bf16 peak; 0.076 measured on the 1-layer slice (FACTS.md)
    gpu_tflops: float = 0.0  # bf16 dense peak per GPU; 0 = from the GPU's name (default 300)
    process_rss_gib_gpu: float = (
        2.4  # RSS of a trainer rank before weights (torch, CUDA, NCCL): FACTS.md 12.4 GiB
    )
    process_rss_gib_cpu: float = 0.57  # the same on a CPU-only machine (measured with the CPU benchmark)
    gpu_usable_fraction: float = 0.92  # CUDA context, NCCL buffers, allocator fragmentation
    host_usable_fraction: float = 0.90  # the OS and everything else on the host

    def tflops(self, gpu_name: str) -> float:
        if self.gpu_tflops:
            return self.gpu_tflops
        upper = gpu_name.upper()
        return next((v for k, v in GPU_TFLOPS.items() if k in upper), 300.0)


@dataclass(frozen=True)
class Precision:
    """How the frozen base weights are stored after load."""

    load_in_4bit: bool = True
    quant_type: str = "nf4"
    double_quant: bool = True
    storage_dtype: str = "bfloat16"
    compute_dtype: str = "bfloat16"
    experts_4bit: bool = False

    def quantized(self, t: TensorSpec) -> bool:
        """bitsandbytes replaces nn.Linear (never lm_head); fused experts only when we quantize them."""
        if not self.load_in_4bit:
            return False
        if t.kind == "experts":
            return self.experts_4bit
        return t.linear and t.kind != "lm_head"

    def store(self, t: TensorSpec) -> Stored:
        if self.quantized(t):
            return four_bit(t.numel, self.double_quant, self.storage_dtype, self.quant_type)
        return plain(t.numel, self.compute_dtype)

    @property
    def act_bytes(self) -> int:
        return DTYPE_BYTES[self.compute_dtype]


@dataclass(frozen=True)
class Setup:
    """One configuration to evaluate."""

    gpus: int  # 0: train on the CPU
    stage: int = 3
    offload_param: str = "cpu"
    offload_optimizer: str = "cpu"
    load_on: str = "gpu"  # "gpu": each rank's whole model lands on its GPU; "host": in host RAM
    seq_len: int = 1024
    micro_batch: int = 1
    grad_ckpt: bool = True
    gpu_mem_gib: float = 0.0
    host_ram_gib: float = 0.0
    gpu_name: str = ""

    @property
    def ranks(self) -> int:
        return max(1, self.gpus)

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
        where = "load onto GPU" if self.load_on == "gpu" else "load into host RAM"
        hw = f"{self.gpus} GPU" + ("s" if self.gpus != 1 else "") if self.gpus else "CPU"
        return f"{mode}, {where}, {hw}, seq {self.seq_len}"


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

    def largest_layer(self) -> tuple[str, int]:
        layers = {k: v for k, v in self.blocks.items() if k.startswith("layer.")}
        if not layers:
            return "none", 0
        name = max(layers, key=lambda k: layers[k])
        return name, layers[name]

    def head_bytes(self) -> int:
        """The weight the loss multiplies by: lm_head, or the embedding when they are tied."""
        return self.blocks.get("lm_head", self.blocks.get("embed", 0))

    def persistent(self, t: TensorSpec, s: Stored) -> bool:
        return s.data_numel <= PERSISTENCE_PER_HIDDEN * self.geometry.hidden

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

    def largest_tensor(self) -> int:
        return max(s.data_bytes for _, s in self.items)


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
    logits: int  # logits, their fp32 copy, log-softmax and their gradients

    def stack(self, grad_ckpt: bool) -> int:
        return self.checkpoints if grad_ckpt else self.all_layers

    def working(self, grad_ckpt: bool) -> int:
        """One layer's recompute plus its backward transients (or just the transients)."""
        return 2 * self.layer_saved if grad_ckpt else self.layer_saved

    def total(self, grad_ckpt: bool) -> int:
        return self.stack(grad_ckpt) + self.working(grad_ckpt) + self.logits


def activations(
    geometry: ModelGeometry, seq_len: int, micro_batch: int, act_bytes: int, lora_r: int = 0
) -> Activations:
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
        logits=tokens * g.vocab * (12 + act_bytes),
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
    name: str
    need: int
    limit: int

    @property
    def ok(self) -> bool:
        return self.limit <= 0 or self.need <= self.limit

    @property
    def ratio(self) -> float:
        return self.need / self.limit if self.limit > 0 else 0.0


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
        return all(c.ok for c in self.checks)

    @property
    def binding(self) -> Check | None:
        """The failed check furthest over its limit, or (when it fits) the tightest one."""
        known = [c for c in self.checks if c.limit > 0]
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

    def with_experts_4bit(self, on: bool) -> Inputs:
        return replace(self, precision=replace(self.precision, experts_4bit=on))


def _partitions(w: Weights, setup: Setup) -> tuple[int, int, int]:
    """Per rank: partition bytes of non-persistent params, their pinned (power-of-two) bytes, and the
    persistent params' bytes (whole on every GPU)."""
    n = setup.ranks if setup.stage == 3 else 1
    part = pinned = persistent = 0
    for t, s in w.items:
        if setup.stage == 3 and w.persistent(t, s):
            persistent += s.data_bytes
            continue
        numel = math.ceil(s.data_numel / n)
        part += numel * s.itemsize
        pinned += pow2_ceil(numel * s.itemsize)
    return part, pinned, persistent


def estimate(inputs: Inputs, setup: Setup) -> Estimate:
    """Both phases of one configuration, its speed, and whether it fits."""
    w, a = inputs.weights, inputs.assumptions
    g, prec = inputs.geometry, inputs.precision
    n = setup.ranks
    acts = activations(g, setup.seq_len, setup.micro_batch, prec.act_bytes, inputs.lora_r)
    lora = lora_params(g, inputs.lora_targets, inputs.lora_r)
    part, pinned, persistent = _partitions(w, setup)
    zero_n = n if setup.stage >= 1 else 1
    opt_bytes = 16 * lora // zero_n  # fp32 master, two Adam moments, fp32 gradient
    baseline = int((a.process_rss_gib_gpu if setup.gpus else a.process_rss_gib_cpu) * GiB)
    ckpt_file = w.checkpoint_bytes
    notes: list[str] = []

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
            "load transient": w.load_excess(),
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
        ds_init = 0 if setup.offload_param != "none" else w.largest_tensor() // (n if setup.stage == 3 else 1)
        if setup.load_on == "gpu":
            load.gpu = {
                "whole model on each GPU": w.stored_bytes,
                "load transient": max(w.load_excess(), ds_init),
            }
            load.rss = {"process": baseline, "checkpoint pages": ckpt_file}
            after_init = baseline + host_params + host_opt
            if after_init > sum(load.rss.values()):
                load.rss = {"process": baseline, "offload buffers": host_params + host_opt}
            load.host = {"ranks x process": n * baseline}
            if after_init > baseline:
                load.host = {"ranks x process": n * baseline, "offload buffers": n * (host_params + host_opt)}
        else:
            resident = 0 if setup.offload_param != "none" else (part if setup.stage == 3 else w.data_bytes)
            load.gpu = {
                "partitions": resident,
                "quantization state": w.state_bytes,
                "param being partitioned": w.largest_tensor(),
            }
            whole = w.stored_bytes + w.load_excess()
            load.rss = {"process": baseline, "checkpoint pages": ckpt_file, "whole model in host RAM": whole}
            load.host = {"ranks x process": n * baseline, "ranks x whole model": n * whole}
            notes.append(
                "loading into host RAM needs a loader that quantizes on the host "
                "(the trainer loads onto the GPU)"
            )
        # --- training ---
        resident = 0
        if setup.offload_param == "none":
            resident = part if setup.stage == 3 else w.data_bytes
        gathered = 0
        if gathering:
            if setup.grad_ckpt:
                gathered = w.largest_layer()[1] + w.head_bytes()
            else:
                gathered = sum(v for k, v in w.blocks.items() if k != "embed")
                notes.append(
                    "without gradient checkpointing autograd keeps every gathered weight until backward"
                )
        train.gpu = {
            "weights (partition)": resident,
            "persistent small params": persistent if setup.stage == 3 else 0,
            "quantization state": w.state_bytes,
            "gathered layer + lm_head": gathered,
            "checkpointed activations" if setup.grad_ckpt else "activations": acts.stack(setup.grad_ckpt),
            "layer recompute + backward": acts.working(setup.grad_ckpt),
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
        train.host = {"ranks x process": n * sum(train.rss.values())}

    # --- speed ---
    compute_s = transfer_s = step_s = tps = None
    if setup.gpus:
        tokens = setup.seq_len * setup.micro_batch
        passes = (
            3 if setup.grad_ckpt else 2
        )  # forward, recompute, backward (input gradients only: frozen weights)
        attn = 2 * setup.seq_len * g.q_dim * g.layers
        flops = tokens * passes * (2 * g.active_matmul_params() + attn)
        compute_s = flops / (a.tflops(setup.gpu_name) * 1e12 * a.mfu)
        blocks = w.blocks
        layers = sum(v for k, v in blocks.items() if k.startswith("layer."))
        moved = 2 * layers + blocks.get("embed", 0) + blocks.get("lm_head", 0) + blocks.get("norm", 0)
        transfer_s = 0.0
        if setup.stage == 3 and setup.offload_param == "cpu":
            transfer_s += moved / n / (a.h2d_gbps * GB)
        elif setup.stage == 3 and setup.offload_param == "nvme":
            transfer_s += moved / (a.nvme_gbps * GB) + moved / n / (a.h2d_gbps * GB)
        if setup.stage == 3 and n > 1:
            transfer_s += moved * (n - 1) / n / (a.nvlink_gbps * GB)
        step_s = max(compute_s, transfer_s)
        tps = n * tokens / step_s

    # --- checks ---
    checks: list[Check] = []
    gpu_limit = int(setup.gpu_mem_gib * GiB * a.gpu_usable_fraction)
    host_limit = int(setup.host_ram_gib * GiB * a.host_usable_fraction)
    if setup.gpus:
        checks.append(Check("GPU memory at load", load.gpu_peak, gpu_limit))
        checks.append(Check("GPU memory in training", train.gpu_peak, gpu_limit))
    checks.append(Check("host RAM at load", load.host_peak, host_limit))
    checks.append(Check("host RAM in training", train.host_peak, host_limit))
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
