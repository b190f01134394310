"""Where every byte of one configuration sits, at load and in training: per GPU, per rank process, per host.

Pure arithmetic over the model's tensors (`weights.py`) and its activations (`activations.py`). What it
assumes, and why (see `../shared/FACTS.md` for the measurements it leans on):

Load (from process start to the end of `deepspeed.initialize`), by `model.loader`:
- "layerwise" (the trainer's default, `trainer/weights/loader.py`): the model is built on the meta device and
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
  on one rank only (`cockpit.contract.load_builder`) and broadcasts it (`trainer/weights/load_share.py`): a
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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from cockpit.contract import dequant_path, gathered_beyond_prefetch
from cockpit.plan.activations import MEASURED_TOKENS, MEASURED_TOKENS_VARLEN, Activations
from cockpit.plan.configuration import Setup
from cockpit.plan.formats import pow2_ceil
from cockpit.plan.inputs import GiB, Inputs
from cockpit.plan.weights import Weights, lora_params

# DeepSpeed NVMe offload defaults: 5 swap buffers of 1e8 elements; up to 1e9 elements kept in host RAM.
NVME_BUFFERS = 5 * 100_000_000
NVME_MAX_IN_CPU = 1_000_000_000


@dataclass
class Phase:
    """Peaks of one phase: per GPU (allocated), per rank process (RSS), and the whole host."""

    gpu: dict[str, int] = field(default_factory=dict)
    rss: dict[str, int] = field(default_factory=dict)
    host: dict[str, int] = field(default_factory=dict)
    page_cache: int = 0  # shared and reclaimable: not counted against host RAM

    @property
    def gpu_peak(self) -> int:
        """Bytes allocated on one GPU at the phase's peak."""
        return sum(self.gpu.values())

    @property
    def rss_peak(self) -> int:
        """Resident bytes of one rank's process at the phase's peak."""
        return sum(self.rss.values())

    @property
    def host_peak(self) -> int:
        """Host RAM of one host's ranks together at the phase's peak."""
        return sum(self.host.values())


@dataclass(frozen=True)
class Shares:
    """One rank's bytes that both phases count: its partitions of the weights, LoRA and its optimizer, its
    process before any weight, and what it pins (or swaps) on the host."""

    lora: int  # LoRA parameters of the whole model
    zero_n: int  # ranks the optimizer state is partitioned over
    optimizer: int  # this rank's fp32 master, two Adam moments and fp32 gradient of LoRA
    partition: int  # partitions of non-persistent params (`_partitions`)
    pinned: int  # the same, each rounded up to a power of two as the pinned allocator does
    persistent: int  # persistent params, whole on every GPU
    baseline: int  # the process before any weight (torch, CUDA, NCCL)
    host_params: int  # offloaded parameters in host RAM: pinned partitions, or NVMe swap buffers
    host_opt: int  # offloaded optimizer state, pinned

    @classmethod
    def of(cls, inputs: Inputs, setup: Setup) -> Shares:
        """The shares of a rank of `setup`."""
        w, a = inputs.weights, inputs.assumptions
        lora = lora_params(inputs.geometry, inputs.lora_targets, inputs.lora_r)
        part, pinned, persistent = _partitions(w, setup)
        zero_n = setup.ranks if setup.stage >= 1 else 1
        opt_bytes = 16 * lora // zero_n  # fp32 master, two Adam moments, fp32 gradient
        if setup.offload_param == "cpu":
            host_params = pinned
        elif setup.offload_param == "nvme":
            size = max(s.itemsize for _, s in w.items)
            host_params = NVME_BUFFERS * size + min(NVME_MAX_IN_CPU * size, part)
        else:
            host_params = 0
        return cls(
            lora=lora,
            zero_n=zero_n,
            optimizer=opt_bytes,
            partition=part,
            pinned=pinned,
            persistent=persistent,
            baseline=int((a.process_rss_gib_gpu if setup.gpus else a.process_rss_gib_cpu) * GiB),
            host_params=host_params,
            host_opt=pow2_ceil(opt_bytes) if setup.offload_optimizer == "cpu" else 0,
        )


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


def _gathering(setup: Setup) -> bool:
    """ZeRO-3 gathers each layer for its compute: its parameters are offloaded or partitioned over ranks."""
    return setup.stage == 3 and (setup.offload_param != "none" or setup.ranks > 1)


def memory_notes(setup: Setup) -> list[str]:
    """What the memory terms of `setup` read beyond what they were measured or derived for."""
    notes = []
    measured = MEASURED_TOKENS if setup.flash4 else MEASURED_TOKENS_VARLEN
    if setup.fast_paths and setup.seq_len * setup.micro_batch > measured:
        notes.append(
            f"a layer's recompute and backward are measured up to {measured:,} tokens a micro-batch "
            "(benchmarks/fit_memory.py); longer micro-batches are read off that bound, unmeasured"
        )
    if setup.fast_paths and setup.flash4:
        notes.append(
            "attention planned as FlashAttention-4, as the trainer runs it on Hopper with the flash4 extra "
            "installed (`cockpit doctor` says); COCKPIT_VARLEN_KERNEL=torch plans torch's kernels"
        )
    if setup.gpus and _gathering(setup) and not setup.grad_ckpt:
        notes.append("without gradient checkpointing autograd keeps every gathered weight until backward")
    return notes


def phases(inputs: Inputs, setup: Setup, shares: Shares) -> tuple[Phase, Phase]:
    """The load and the training phase of `setup`, a rank's `shares` counted in both."""
    acts = inputs.activations(setup)
    if setup.gpus == 0:
        return _cpu_phases(inputs, setup, shares, acts)
    if setup.loader == "layerwise":
        load = _layerwise_load(inputs.weights, setup, shares)
    else:
        load = _pretrained_load(inputs, setup, shares)
    return load, _gpu_training(inputs, setup, shares, acts)


def _cpu_phases(inputs: Inputs, setup: Setup, shares: Shares, acts: Activations) -> tuple[Phase, Phase]:
    """Training on the CPU: everything lives in host RAM, the model once, activations, optimizer."""
    w, baseline, lora = inputs.weights, shares.baseline, shares.lora
    model = w.stored_bytes
    load, train = Phase(page_cache=w.checkpoint_bytes), Phase()
    load.rss = {
        "process": baseline,
        "checkpoint pages": w.checkpoint_bytes,
        "model": model,
        "load transient": w.load_excess()
        if setup.loader == "transformers"
        else max((w.layerwise_unit_peak(b) - w.blocks[b] for b in w.by_block), default=0),
    }
    train.rss = {
        "process": baseline,
        "model": model,
        "activations": acts.total(setup.grad_ckpt),
        "LoRA + optimizer": lora * (2 * inputs.precision.act_bytes) + 16 * lora,
    }
    load.host, train.host = dict(load.rss), dict(train.rss)
    load.host.pop("checkpoint pages")
    return load, train


def _layerwise_gpu(w: Weights, setup: Setup) -> dict[str, int]:
    """A GPU at the layer-by-layer load's peak (`trainer/weights/loader.py`, see the module docstring): the
    layers kept so far and the worst one being loaded, or every layer's partition and the rest whole."""
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
        return {
            "layer partitions kept": kept_before,
            "one layer being loaded": worst_layer,
            "quantization state": state,
        }
    return {
        "layer partitions kept": kept,
        "embeddings + lm_head whole": rest_whole,
        "partition copy": rest_copy,
        "quantization state": state,
    }


def _layerwise_load(w: Weights, setup: Setup, shares: Shares) -> Phase:
    """The load phase of `trainer/weights/loader.py` on GPUs (see the module docstring)."""
    load = Phase(gpu=_layerwise_gpu(w, setup))
    baseline, host_params, host_opt = shares.baseline, shares.host_params, shares.host_opt
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
    return load


def _pretrained_load(inputs: Inputs, setup: Setup, shares: Shares) -> Phase:
    """The load phase of `from_pretrained` on GPUs: the whole model on each GPU, partitioned at
    `deepspeed.initialize`."""
    w, prec, n = inputs.weights, inputs.precision, setup.ranks
    baseline, offloaded = shares.baseline, shares.host_params + shares.host_opt
    # from_pretrained holds the experts as the checkpoint has them; the trainer packs them after.
    whole = w if not prec.experts_4bit else Weights.of(inputs.geometry, replace(prec, experts_4bit=False))
    ds_init = 0 if setup.offload_param != "none" else whole.largest_tensor() // (n if setup.stage == 3 else 1)
    load = Phase(page_cache=w.checkpoint_bytes)
    load.gpu = {
        "whole model on each GPU": whole.stored_bytes,
        "load transient": max(whole.load_excess(), ds_init),
    }
    load.rss = {"process": baseline, "checkpoint pages": w.checkpoint_bytes}
    after_init = baseline + offloaded
    if after_init > sum(load.rss.values()):
        load.rss = {"process": baseline, "offload buffers": offloaded}
    here = setup.ranks_per_node  # host RAM is each host's: its own ranks
    load.host = {"ranks x process": here * baseline}
    if after_init > baseline:
        load.host = {"ranks x process": here * baseline, "offload buffers": here * offloaded}
    return load


def _gathered(w: Weights, setup: Setup, layers: int) -> tuple[int, int]:
    """Bytes ZeRO-3 holds gathered at the training peak, and the embeddings kept on the GPU."""
    if not _gathering(setup):
        return 0, 0
    n = setup.ranks
    kept_embeddings = 0
    if setup.keeps_embeddings:
        # each rank's partition on its GPU, and the whole once gathered (one and the same at one rank)
        whole = w.embeddings_bytes()
        kept_embeddings = whole + (math.ceil(whole / n) if n > 1 else 0)
    if setup.grad_ckpt:  # this layer, those prefetched behind it, those lagging (measured), the lm_head
        lagging = gathered_beyond_prefetch(setup.ranks, setup.offload_param, setup.grad_accum)
        ahead = math.ceil(setup.prefetch_layers) + (lagging if setup.prefetch_layers else 0)
        held = 1 + min(ahead, layers - 1)  # none beyond the last layer
        gathered = held * w.largest_layer()[1] + (0 if kept_embeddings else w.head_bytes())
    else:  # autograd keeps every gathered weight until backward (`memory_notes`)
        gathered = sum(v for k, v in w.blocks.items() if k != "embed")
    return gathered, kept_embeddings


def keeps_dequantized(inputs: Inputs, setup: Setup) -> bool:
    """Whether the experts keep their dequantized weights from recompute to backward (frozen_experts)."""
    g = inputs.geometry
    tokens = setup.seq_len * setup.micro_batch
    return setup.keep_dequant and setup.grad_ckpt and dequant_path(tokens, g.top_k, g.experts)


def _gpu_training(inputs: Inputs, setup: Setup, shares: Shares, acts: Activations) -> Phase:
    """The training peak on GPUs, after the engine is built (see the module docstring)."""
    w, g, act_bytes = inputs.weights, inputs.geometry, inputs.precision.act_bytes
    resident = 0
    if setup.offload_param == "none":
        resident = shares.partition if setup.stage == 3 else w.data_bytes
    gathered, kept_embeddings = _gathered(w, setup, g.layers)
    train = Phase()
    train.gpu = {
        "weights (partition)": resident,
        "persistent small params": shares.persistent if setup.stage == 3 else 0,
        "quantization state": w.state_bytes,
        "gathered layers + lm_head": gathered,
        "embeddings kept on the GPU": kept_embeddings,
        "checkpointed activations" if setup.grad_ckpt else "activations": acts.stack(setup.grad_ckpt),
        # NF4 experts dequantize a chunk at a time within the layer's recompute and backward; measured,
        # it never adds to the activation transients at seq 1024 (adding it over-predicts all four
        # NF4 slices by its 0.49 GiB), so the larger of the two counts. On the dequant path under
        # checkpointing, the recompute's weights are kept for the backward: both, on top.
        "layer recompute + backward": max(acts.working(setup.grad_ckpt), w.dequant_chunk_bytes())
        + (w.kept_dequant_bytes() if keeps_dequantized(inputs, setup) else 0),
        "logits + loss": acts.logits,
        "LoRA + optimizer": 2 * shares.lora * act_bytes // shares.zero_n
        + (shares.optimizer if setup.offload_optimizer == "none" else 0),
        "reduce bucket": g.hidden * g.hidden * act_bytes,
    }
    train.rss = {"process": shares.baseline}
    if shares.host_params:
        train.rss["offload buffers (pinned)" if setup.offload_param == "cpu" else "NVMe swap buffers"] = (
            shares.host_params
        )
    if shares.host_opt:
        train.rss["optimizer state (pinned)"] = shares.host_opt
    train.host = {"ranks x process": setup.ranks_per_node * sum(train.rss.values())}
    return train
