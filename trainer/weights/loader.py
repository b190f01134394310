"""Load a causal LM layer by layer from its safetensors shards, quantizing and partitioning as it goes.

Transformers loads a bitsandbytes model whole onto each rank's GPU (bitsandbytes quantizes there) and
skips `deepspeed.zero.Init`, so ZeRO-3 partitions only after every rank held the whole model. Here the
model is built on the meta device, then filled one unit at a time (each decoder layer, then the rest):
its tensors are read from the shards (memory-mapped: the page cache holds the file once per host),
moved to this rank's GPU (or kept on the CPU without one), quantized there (attention and dense MLP
`nn.Linear` to bitsandbytes `Linear4bit`, fused MoE experts to `NF4Experts`, streamed a few experts at
a time), and under ZeRO-3 partitioned at once with `deepspeed.zero.Init(module=unit)`, which keeps this
rank's slice (in pinned host memory with parameter offload) and frees the rest. The load-phase GPU peak
is about one layer; host memory holds each rank's partition, not the model once per rank.

With several ranks each unit is read and quantized by one rank only and broadcast to the others,
quantized bytes, scales and bitsandbytes' quantization state included (`trainer.weights.load_share`), before
ZeRO-3 partitions it: the same partitioned model as when every rank builds every unit, for a share of
the reading and quantizing. One rank alone loads everything itself.

A real checkpoint's units are kept, once built and before ZeRO-3 partitions them, in the NF4 cache
(`trainer.weights.nf4_cache`); a later load of the same checkpoint and settings reads them from there instead.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.layers.experts4bit import NF4Experts, is_fused_experts
from trainer.weights.load_share import Share, job_share, receive_unit, send_unit
from trainer.weights.nf4_cache import NF4Cache, open_cache
from trainer.weights.quant import DTYPES, bnb_config, experts_storage_dtype
from trainer.weights.random_weights import RandomWeights, sliced_config


class Checkpoint:
    """Tensors of a model directory's safetensors files by name, opened lazily and memory-mapped."""

    def __init__(self, model_dir: str | Path) -> None:
        from safetensors import safe_open

        self.dir = Path(model_dir)
        index = self.dir / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            self.files = {key: self.dir / name for key, name in weight_map.items()}
        else:
            files = sorted(self.dir.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"{self.dir}: no safetensors weights")
            self.files = {}
            for path in files:
                with safe_open(str(path), framework="pt") as f:
                    self.files.update(dict.fromkeys(f.keys(), path))
        self._open: dict[Path, Any] = {}
        self.used: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self.files

    def _handle(self, key: str) -> Any:
        from safetensors import safe_open

        path = self.files[key]
        if path not in self._open:
            self._open[path] = safe_open(str(path), framework="pt", device="cpu")
        return self._open[path]

    def get(self, key: str) -> torch.Tensor:
        if key not in self.files:
            raise KeyError(f"{self.dir}: checkpoint has no tensor {key!r}")
        self.used.add(key)
        return self._handle(key).get_tensor(key)

    def get_row(self, key: str, index: int) -> torch.Tensor:
        """One slice along the first dimension, read without loading the rest."""
        self.used.add(key)
        return self._handle(key).get_slice(key)[index : index + 1][0]

    def unused(self) -> list[str]:
        return sorted(set(self.files) - self.used)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's list of decoder layers (the ModuleList of its `_no_split_modules` classes)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    lists = [
        m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) and type(m[0]).__name__ in names
    ]
    best = max(lists, key=len, default=None)
    if best is None:
        raise ValueError(f"{type(model).__name__}: no list of decoder layers found")
    return best


def _set(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    if name in module._parameters:
        module._parameters[name] = nn.Parameter(tensor, requires_grad=False)
    else:
        module._buffers[name] = tensor


def _expert_source(ckpt: Checkpoint, prefix: str, which: str) -> Callable[[int], torch.Tensor]:
    """expert(e) -> [out, in] from a fused tensor or from per-expert Linear weights (the original layout)."""
    fused = f"{prefix}.{which}"
    if fused in ckpt:
        return lambda e: ckpt.get_row(fused, e)
    if which == "gate_up_proj":
        return lambda e: torch.cat(
            [ckpt.get(f"{prefix}.{e}.gate_proj.weight"), ckpt.get(f"{prefix}.{e}.up_proj.weight")], dim=0
        )
    return lambda e: ckpt.get(f"{prefix}.{e}.down_proj.weight")


class LayerwiseLoader:
    """Fills a meta-device model unit by unit; see the module docstring."""

    def __init__(
        self,
        ckpt: Checkpoint | RandomWeights,
        device: torch.device,
        compute_dtype: torch.dtype,
        quantize_linear: Callable[[nn.Linear, torch.Tensor, torch.Tensor | None], nn.Module] | None,
        experts_storage_dtype: torch.dtype | None,
        zero_init: dict[str, Any] | None,
    ) -> None:
        self.ckpt = ckpt
        self.device = device
        self.compute_dtype = compute_dtype
        self.quantize_linear = quantize_linear
        self.experts_storage_dtype = experts_storage_dtype
        self.zero_init = zero_init
        self.counts = {"linear_4bit": 0, "experts_nf4": 0, "experts_16bit": 0}  # built by this rank
        self.received = dict.fromkeys(self.counts, 0)  # built by another rank (a shared load)

    def _tensor(self, key: str, like: torch.Tensor) -> torch.Tensor:
        t = self.ckpt.get(key)
        if tuple(t.shape) != tuple(like.shape):
            raise ValueError(f"{key}: checkpoint shape {tuple(t.shape)}, model expects {tuple(like.shape)}")
        dtype = self.compute_dtype if t.is_floating_point() else t.dtype
        return t.to(self.device, dtype)

    def _experts(self, prefix: str, module: nn.Module) -> nn.Module:
        sources = {w: _expert_source(self.ckpt, prefix, w) for w in NF4Experts.WEIGHTS}
        if self.experts_storage_dtype is None:
            for which, source in sources.items():
                like = getattr(module, which)
                fused = torch.empty(like.shape, dtype=self.compute_dtype, device=self.device)
                for e in range(like.shape[0]):
                    fused[e].copy_(source(e))
                _set(module, which, fused)
            self.counts["experts_16bit"] += 1
            return module
        e, two_i, h = module.gate_up_proj.shape
        new = NF4Experts(
            e, h, two_i // 2, module.act_fn, self.compute_dtype, self.experts_storage_dtype, "meta"
        )
        new.load_weights(sources, self.device)
        self.counts["experts_nf4"] += 1
        return new

    def fill(self, unit: nn.Module, prefix: str, skip: tuple[nn.Module, ...] = ()) -> None:
        """Load (and quantize) every tensor of `unit` whose name starts with `prefix`."""
        dot = f"{prefix}." if prefix else ""
        for name, module in list(unit.named_modules()):
            if any(module is s or _is_inside(module, s) for s in skip):
                continue
            full = f"{dot}{name}" if name else prefix
            parent, attr = _parent(unit, name)
            if is_fused_experts(module):
                setattr(parent, attr, self._experts(full, module))
                continue
            if _is_inside_fused(unit, name):
                continue
            if isinstance(module, nn.Linear) and self.quantize_linear is not None:
                key = f"{full}.weight"
                weight = self.ckpt.get(key)
                bias = self.ckpt.get(f"{full}.bias") if module.bias is not None else None
                setattr(parent, attr, self.quantize_linear(module, weight, bias))
                self.counts["linear_4bit"] += 1
                continue
            for pname, tensor in list(module.named_parameters(recurse=False)):
                _set(module, pname, self._tensor(f"{full + '.' if full else ''}{pname}", tensor))
            for bname, tensor in list(module.named_buffers(recurse=False)):
                key = f"{full + '.' if full else ''}{bname}"
                if bname not in module._non_persistent_buffers_set and key in self.ckpt:
                    _set(module, bname, self._tensor(key, tensor))

    def build(
        self, unit: nn.Module, prefix: str, index: int, cache: NF4Cache, skip: tuple[nn.Module, ...] = ()
    ) -> None:
        """Unit `index` on this rank: read from the NF4 cache where it holds it (no checkpoint read, no
        quantization), else filled from the checkpoint and written to the cache."""
        manifest = cache.load(index, unit, self.device, skip)
        if manifest is not None:
            for key, count in manifest.counts().items():
                self.counts[key] += count
            return
        self.fill(unit, prefix, skip)
        cache.store(index, unit, self.device, skip)

    def exchange(self, unit: nn.Module, share: Share, index: int, skip: tuple[nn.Module, ...] = ()) -> None:
        """Unit `index` of a shared load: broadcast it if this rank built it, else receive it."""
        if share.mine(index):
            send_unit(unit, self.device, skip)
            return
        manifest = receive_unit(unit, share.owner(index), self.device)
        for key, n in manifest.counts().items():
            self.received[key] += n

    def partition(self, unit: nn.Module) -> None:
        """Under ZeRO-3, keep this rank's slice of every loaded parameter of `unit` and free the rest."""
        if self.zero_init is None:
            return
        import deepspeed

        deepspeed.zero.Init(module=unit, config_dict_or_path=self.zero_init)


def _parent(root: nn.Module, name: str) -> tuple[nn.Module, str]:
    if not name:
        return root, ""
    path, _, attr = name.rpartition(".")
    return (root.get_submodule(path) if path else root), attr


def _is_inside(module: nn.Module, container: nn.Module) -> bool:
    return any(module is m for m in container.modules())


def _is_inside_fused(unit: nn.Module, name: str) -> bool:
    """True for submodules of an experts module (already handled with it)."""
    parts = name.split(".")
    for i in range(1, len(parts)):
        m = unit.get_submodule(".".join(parts[:i]))
        if is_fused_experts(m) or isinstance(m, NF4Experts):
            return True
    return False


def _materialize_buffers(model: nn.Module, config: Any, device: torch.device) -> None:
    """Rebuild modules whose non-persistent buffers are still on meta (rotary embeddings)."""
    for name, module in list(model.named_modules()):
        if not any(b.is_meta for b in module.buffers(recurse=False)):
            continue
        if "RotaryEmbedding" not in type(module).__name__:
            raise ValueError(
                f"{name}: buffers on the meta device and no way to rebuild {type(module).__name__}"
            )
        parent, attr = _parent(model, name)
        fresh = type(module)(config=getattr(module, "config", config))
        setattr(parent, attr, fresh.to(device))


def _bnb_linear_factory(
    q: Any, device: torch.device
) -> Callable[[nn.Linear, torch.Tensor, torch.Tensor | None], nn.Module]:
    import bitsandbytes as bnb

    compute, storage = DTYPES[q.compute_dtype], DTYPES[q.storage_dtype]

    def make(old: nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
        new = bnb.nn.Linear4bit(
            old.in_features,
            old.out_features,
            bias=bias is not None,
            compute_dtype=compute,
            compress_statistics=q.double_quant,
            quant_type=q.quant_type,
            quant_storage=storage,
            device="meta",
        )
        new.weight = bnb.nn.Params4bit(
            weight.to(compute),
            requires_grad=False,
            compress_statistics=q.double_quant,
            quant_type=q.quant_type,
            quant_storage=storage,
            module=new,
        ).to(device)  # quantizes on `device`
        if bias is not None:
            new.bias = nn.Parameter(bias.to(device, compute), requires_grad=False)
        return new

    return make


def spread_devices(n_layers: int, devices: list[torch.device]) -> list[torch.device]:
    """Decoder layer i's device: contiguous, nearly equal blocks of layers, one block a device.

    A list of one device a layer (a placement made elsewhere: evaluation's, `trainer.weights.placement`) comes
    back as it is.
    """
    return [devices[i * len(devices) // n_layers] for i in range(n_layers)]


def _move(obj: Any, device: torch.device) -> Any:
    """Tensors (also inside tuples, lists and dicts) moved to `device`; anything else as it is."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_move(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _move(v, device) for k, v in obj.items()}
    return obj


def follow_inputs(module: nn.Module, device: torch.device) -> None:
    """Move a module's tensor inputs to its own device before it runs (a model spread over GPUs).

    The KV cache is not a tensor and stays as it is: each layer's part of it is made on that layer's
    device.
    """

    def hook(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        return _move(args, device), _move(kwargs, device)

    module.register_forward_pre_hook(hook, with_kwargs=True)


def load_layerwise(
    profile: Any,
    model_dir: str,
    device: torch.device,
    zero_init: dict[str, Any] | None,
    spread_over: list[torch.device] | None = None,
    *,
    random_layers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """The frozen base model, quantized as the profile says, loaded one decoder layer at a time.

    `spread_over` (evaluation: one process, no ZeRO) places the decoder layers in blocks over those
    devices and everything else on `device`, each layer moving its inputs to its own device.
    `random_layers` (a rehearsal): the architecture of `model_dir/config.json` sliced to that many
    decoder layers, with random weights drawn on `device` instead of a checkpoint read.
    `progress(done, total)` is called after each decoder layer.
    """
    from transformers import AutoConfig, BitsAndBytesConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
    from transformers.utils.quantization_config import QuantizationMethod

    q = profile.quantization
    t0 = time.time()
    config = AutoConfig.from_pretrained(model_dir)
    if random_layers is not None:
        config = sliced_config(config, random_layers)
    compute = DTYPES[q.compute_dtype]
    config.dtype = compute
    model_cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    with torch.device("meta"):
        model = model_cls(config)
    ckpt: Checkpoint | RandomWeights = (
        Checkpoint(model_dir) if random_layers is None else RandomWeights(model, device, compute)
    )
    loader = LayerwiseLoader(
        ckpt,
        device,
        compute,
        _bnb_linear_factory(q, device) if q.load_in_4bit else None,
        experts_storage_dtype(profile) if q.quantize_experts else None,
        zero_init,
    )
    layers = decoder_layers(model)
    layers_prefix = next(name for name, m in model.named_modules() if m is layers)
    n = len(layers)
    placement = spread_devices(n, spread_over) if spread_over else [device] * n
    factories: dict[torch.device, Any] = {device: loader.quantize_linear}
    peaks = []
    # The NF4 cache of a real checkpoint (`trainer.weights.nf4_cache`): units it holds are read, not built.
    cache = open_cache(profile, model_dir, device, n, random=random_layers is not None)
    # Several ranks: unit u (a decoder layer, or the rest as unit n) is built by one rank, in rounds.
    share = job_share() if spread_over is None else None
    cache.stride = share.world if share is not None else 1
    built: list[int] = []
    for units in share.rounds(n) if share is not None else ([i] for i in range(n)):
        for i in units:
            if share is None or share.mine(i):
                here = placement[i]
                if here not in factories:
                    factories[here] = _bnb_linear_factory(q, here) if q.load_in_4bit else None
                loader.device, loader.quantize_linear = here, factories[here]
                loader.build(layers[i], f"{layers_prefix}.{i}", i, cache)
                built.append(i)
        for i in units:
            here = placement[i]
            if share is not None:
                loader.exchange(layers[i], share, i)
            loader.partition(layers[i])
            if here != device:
                follow_inputs(layers[i], here)
            if here.type == "cuda":
                peaks.append(torch.cuda.max_memory_allocated(here))
            if progress is not None:
                progress(i + 1, n)
    # The rest (embeddings, final norm, head) in full precision, as bitsandbytes leaves them.
    loader.device = device
    saved_quantizer, loader.quantize_linear = factories[device], None
    tied = bool(getattr(config, "tie_word_embeddings", False)) and model.get_output_embeddings() is not None
    rest_skip = (layers,) + ((model.get_output_embeddings(),) if tied else ())
    if share is None or share.mine(n):
        loader.build(model, "", n, cache, skip=rest_skip)
    if share is not None:
        loader.exchange(model, share, n, skip=rest_skip)
    cache.close()  # the last unit's write done
    if tied:
        model.get_output_embeddings().weight = model.get_input_embeddings().weight
    loader.quantize_linear = saved_quantizer
    _materialize_buffers(model, config, device)
    meta = [n for n, p in list(model.named_parameters()) + list(model.named_buffers()) if p.is_meta]
    if meta:
        raise ValueError(
            f"{model_dir}: not in the checkpoint: {', '.join(meta[:8])}{' ...' if len(meta) > 8 else ''}"
        )
    loader.partition(model)
    model.eval()
    if q.load_in_4bit:
        # What transformers' bitsandbytes quantizer marks, so PEFT wraps Linear4bit with its 4-bit LoRA
        # layer and the Trainer never tries to move the model.
        model.is_loaded_in_4bit = True
        model.quantization_method = QuantizationMethod.BITS_AND_BYTES
        bnb: BitsAndBytesConfig = bnb_config(profile)
        model.config.quantization_config = bnb.to_dict()
    unused = [
        k
        for k in ckpt.unused()
        if not _beyond_depth(k, n) and _unit_of(k, layers_prefix, n) not in cache.read
    ]
    if share is not None:  # each rank answers for the tensors of its own units
        unused = share.union([k for k in unused if share.mine(_unit_of(k, layers_prefix, n))])
    facts = {
        "loader": "layerwise",
        "weights": "checkpoint" if random_layers is None else "random",
        "load_device": str(device),
        "layers": n,
        **{key: count + loader.received[key] for key, count in loader.counts.items()},
        "checkpoint_tensors_read": len(ckpt.used),
        "unused_checkpoint_tensors": len(unused),
        "load_quantize_s": round(time.time() - t0, 2),
    }
    if random_layers is None:
        produced = len(built) + (share is None or share.mine(n))
        facts.update(cache.facts(produced))
    if share is not None:
        facts["load_share"] = {
            "ranks": share.world,
            "layers": built,
            "rest": share.mine(n),
            **loader.counts,
        }
    if unused:
        facts["unused_examples"] = unused[:5]
    if peaks:
        facts["cuda_peak_per_layer_mib"] = [round(p / 2**20) for p in peaks]
    if spread_over and len(set(placement)) > 1:
        # The layers after the last one on `device` hand back to it: norm and head live there.
        in_layers = {id(m) for m in layers.modules()}
        for module in model.modules():
            if id(module) not in in_layers and list(module.parameters(recurse=False)):
                follow_inputs(module, device)
        facts["layer_devices"] = [str(d) for d in placement]
    return model, facts


def _unit_of(key: str, layers_prefix: str, layers: int) -> int:
    """The unit a checkpoint tensor belongs to: its decoder layer's index, or `layers` for the rest."""
    head = f"{layers_prefix}."
    if key.startswith(head):
        index = key[len(head) :].split(".", 1)[0]
        if index.isdigit():
            return int(index)
    return layers


def _beyond_depth(key: str, depth: int) -> bool:
    """Tensors of layers past the model's depth (a sliced checkpoint) are expected to stay unread."""
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        if part == "layers" and parts[i + 1].isdigit():
            return int(parts[i + 1]) >= depth
    return False


def load_device() -> torch.device:
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")
