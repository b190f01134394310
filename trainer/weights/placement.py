"""Where evaluation puts a 4-bit model over several GPUs: accelerate's placement, with the project's bytes.

Evaluation is one process without DeepSpeed, so a model larger than one GPU is spread over all of them.
accelerate decides: `get_balanced_memory` sets each GPU's budget and `infer_auto_device_map` fills the
GPUs in order with the decoder layer as the unit it never splits. It sizes a model on the meta device
from its tensors (elements x bytes of their dtype), so it is given a *planning model*: the architecture
on the meta device, built as the loader will build it, in which every tensor holds the bytes the loaded
model will really hold:
- packed NF4 experts (`NF4Experts`): their parameters are the packed bytes in a float storage dtype,
  which accelerate counts right as they are;
- a bitsandbytes 4-bit `nn.Linear`: on the meta device it is still a 16-bit weight (4x too big), and
  once loaded its quantization state (absmax, code books) is not a tensor of the module at all. Its
  weight is replaced by one uint8 tensor of what `cockpit.plan.formats.four_bit` counts, state included;
- what accelerate cannot see, the evaluation's working memory, rides on the module it sits beside as a
  uint8 buffer: the scoring forward's logits on the head, each layer's KV cache while thinking.
Every module outside the decoder layers comes first in the planning model, so accelerate puts them on the
first GPU: the layer-by-layer loader keeps them on one device (the one it is given), and evaluation
reads the logits on the model's input device, so a head elsewhere would ship them back each forward.

The decision is a pure function of a planning model and GPU budgets (`place`), so it is tested without
GPUs; `plan_evaluation` measures the GPUs at hand. One GPU or none: nothing to place (None).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from cockpit.contract import EVAL_BATCH_SIZE, kv_cache_bytes, score_logit_bytes
from cockpit.profiles import Profile

# Share of each GPU's free memory the weights and working memory above may take: the rest is for what
# is not modelled (one layer's activations, the attention mask, the allocator's slack). The figure
# transformers leaves for a bitsandbytes model (`adjust_max_memory`).
USABLE_FRACTION = 0.9

KV_BUFFER = "cockpit_kv_cache_bytes"
LOGITS_BUFFER = "cockpit_scoring_logits_bytes"


class PlacementError(ValueError):
    """The model and its working memory do not fit the GPUs' budgets."""


@dataclass(frozen=True)
class WorkingMemory:
    """Evaluation's memory beyond the weights, derived from the code that uses it (not yet measured)."""

    logits_bytes: int  # the scoring forward's logits, on the head's device
    kv_bytes_per_layer: int  # the KV cache of one decoder layer at the end of a thinking batch

    @classmethod
    def of(cls, config: Any, profile: Profile) -> WorkingMemory:
        """For a scoring forward's kept logits (`score_logit_bytes`), and EVAL_BATCH_SIZE prompts of at most
        `training.seq_len` tokens (a bound, not a measure) thinking `eval.max_think_tokens` each."""
        from trainer.weights.quant import DTYPES

        text, kv_heads, head_dim = attention_shape(config)
        item = torch.empty(0, dtype=DTYPES[profile.quantization.compute_dtype]).element_size()
        tokens = EVAL_BATCH_SIZE * (profile.training.seq_len + profile.eval.max_think_tokens)
        return cls(
            logits_bytes=score_logit_bytes(text.vocab_size),
            kv_bytes_per_layer=kv_cache_bytes(1, kv_heads, head_dim, tokens, item),
        )


def attention_shape(config: Any) -> tuple[Any, int, int]:
    """A model config's text part, its key/value heads and its head size (the KV cache's shape)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return text, getattr(text, "num_key_value_heads", None) or text.num_attention_heads, head_dim


def model_config(profile: Profile, model_dir: str, random_layers: int | None = None) -> Any:
    """The transformers config the loader reads (sliced to `random_layers` for a rehearsal's slice)."""
    from transformers import AutoConfig

    from trainer.weights.random_weights import sliced_config

    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=profile.model.trust_remote_code)
    return sliced_config(config, random_layers) if random_layers is not None else config


def planning_model(profile: Profile, config: Any, working: WorkingMemory | None = None) -> nn.Module:
    """The model on the meta device with the bytes it will hold loaded for evaluation (module docstring).

    Fused experts are packed to NF4 where the layer-by-layer loader packs them; the `"transformers"`
    loader holds them in 16 bit until the trainer packs them after `from_pretrained`, so they count so.
    """
    from transformers import AutoModelForCausalLM

    from cockpit.plan.formats import four_bit
    from trainer.layers.experts4bit import NF4Experts
    from trainer.layers.experts_model import fused_experts_modules
    from trainer.weights.loader import decoder_layers
    from trainer.weights.quant import DTYPES, experts_storage_dtype, uses_layerwise_loader

    q = profile.quantization
    compute = DTYPES[q.compute_dtype]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=profile.model.trust_remote_code)
    model.to(compute)
    layers = decoder_layers(model)
    if q.quantize_experts and uses_layerwise_loader(profile):
        storage = experts_storage_dtype(profile)
        for _name, parent, attr, experts in list(fused_experts_modules(layers)):
            e, two_i, h = experts.gate_up_proj.shape
            packed = NF4Experts(e, h, two_i // 2, experts.act_fn, compute, storage, "meta")
            setattr(parent, attr, packed)
    if q.load_in_4bit:
        for module in layers.modules():
            if isinstance(module, nn.Linear):
                stored = four_bit(module.weight.numel(), q.double_quant, q.storage_dtype, q.quant_type)
                module.weight = nn.Parameter(
                    torch.empty(stored.total, dtype=torch.uint8, device="meta"), requires_grad=False
                )
    if working is not None:
        head = model.get_output_embeddings()
        if head is None:  # no head of its own: the tied embeddings compute the logits
            head = model.get_input_embeddings()
        head.register_buffer(LOGITS_BUFFER, _meta_bytes(working.logits_bytes), persistent=False)
        for layer in layers:
            layer.register_buffer(KV_BUFFER, _meta_bytes(working.kv_bytes_per_layer), persistent=False)
    _layers_last(model, layers)
    return model


def _meta_bytes(n: int) -> torch.Tensor:
    return torch.empty(n, dtype=torch.uint8, device="meta")


def _layers_last(model: nn.Module, layers: nn.ModuleList) -> None:
    """Reorder children so that, on the way down to the decoder layers, they come after everything else:
    accelerate places modules in that order, so the rest goes on the first GPU, as the loader puts it."""
    path = module_name(model, layers).split(".")
    module = model
    for part in path:
        module._modules[part] = module._modules.pop(part)  # a dict: put back, it comes last
        module = module._modules[part]


def module_name(model: nn.Module, module: nn.Module) -> str:
    """The name of `module` inside `model`."""
    return next(name for name, m in model.named_modules() if m is module)


@dataclass
class Placement:
    """Where each part goes: `device_map` (module name -> GPU index, accelerate's form), the decoder
    layers' GPUs, the GPU of everything else (`home`), and the bytes it puts on each GPU."""

    how: str  # "accelerate" or "hand-written"
    device_map: dict[str, int]
    layer_devices: list[int]
    home: int
    bytes_per_device: dict[int, int]
    budgets: dict[int, int]
    weights_per_device: dict[int, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def layers_per_device(self) -> dict[int, int]:
        return {d: self.layer_devices.count(d) for d in self.budgets}

    def torch_layer_devices(self) -> list[torch.device]:
        return [torch.device("cuda", d) for d in self.layer_devices]

    def summary(self) -> str:
        """One line: layers and GiB on each GPU."""
        parts = []
        for d, n in self.layers_per_device().items():
            home = " + embeddings, norm, head" if d == self.home else ""
            parts.append(f"cuda:{d} {n} layers{home} {self.bytes_per_device.get(d, 0) / 2**30:.1f} GiB")
        return f"{self.how}: " + ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "how": self.how,
            "home": self.home,
            "layer_devices": self.layer_devices,
            "layers_per_device": {str(d): n for d, n in self.layers_per_device().items()},
            "bytes_per_device": {str(d): b for d, b in self.bytes_per_device.items()},
            "weights_per_device": {str(d): b for d, b in self.weights_per_device.items()},
            "budgets": {str(d): b for d, b in self.budgets.items()},
            "notes": self.notes,
            "summary": self.summary(),
        }


@contextmanager
def _quiet_accelerate() -> Iterator[None]:
    """accelerate warns for every GPU index torch does not see (planning for GPUs elsewhere), and about
    offloading what does not fit (which `place` refuses instead)."""
    log = logging.getLogger("accelerate.utils.modeling")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        log.setLevel(level)


def _layer_class(model: nn.Module) -> str:
    from trainer.weights.loader import decoder_layers

    return type(decoder_layers(model)[0]).__name__


def module_sizes(model: nn.Module) -> dict[str, int]:
    """Bytes of every module and tensor of the planning model, as accelerate counts them."""
    from accelerate.utils import compute_module_sizes

    return dict(compute_module_sizes(model))


def _owner(name: str, device_map: dict[str, Any]) -> Any:
    """The device of module `name` in a device map (its own entry or its closest ancestor's)."""
    parts = name.split(".")
    for i in range(len(parts), -1, -1):
        key = ".".join(parts[:i])
        if key in device_map:
            return device_map[key]
    raise KeyError(name)


def _bytes_on(device_map: dict[str, Any], sizes: dict[str, int], buffers: tuple[str, ...] = ()) -> dict:
    """Bytes each device holds under a map whose entries do not overlap; only the named buffers with
    `buffers` (the working memory), else everything."""
    totals: dict[Any, int] = {}
    for name, device in device_map.items():
        if buffers:
            prefix = f"{name}." if name else ""
            size = sum(
                v
                for k, v in sizes.items()
                if (k == name or k.startswith(prefix)) and k.rsplit(".", 1)[-1] in buffers
            )
        else:
            size = sizes[name]
        totals[device] = totals.get(device, 0) + size
    return totals


def _finish(
    how: str, model: nn.Module, device_map: dict[str, Any], budgets: dict[int, int], notes: list[str]
) -> Placement:
    from trainer.weights.loader import decoder_layers

    layers = decoder_layers(model)
    prefix = module_name(model, layers)
    sizes = module_sizes(model)
    layer_devices = [_owner(f"{prefix}.{i}", device_map) for i in range(len(layers))]
    home = _owner(module_name(model, model.get_input_embeddings()), device_map)
    total = _bytes_on(device_map, sizes)
    working = _bytes_on(device_map, sizes, (KV_BUFFER, LOGITS_BUFFER))
    return Placement(
        how=how,
        device_map=device_map,
        layer_devices=layer_devices,
        home=home,
        bytes_per_device={d: total.get(d, 0) for d in budgets},
        budgets=dict(budgets),
        weights_per_device={d: total.get(d, 0) - working.get(d, 0) for d in budgets},
        notes=notes,
    )


def place(model: nn.Module, budgets: dict[int, int]) -> Placement:
    """accelerate's placement of a planning model on GPUs with these byte budgets (index -> bytes).

    Raises PlacementError when some of it fits no GPU, or when what lies outside the decoder layers does
    not fit the first GPU together.
    """
    from accelerate import infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    from trainer.weights.loader import decoder_layers

    gpus = sorted(budgets)
    no_split = [_layer_class(model)]
    layers = decoder_layers(model)
    prefix = module_name(model, layers)
    sizes = module_sizes(model)
    with _quiet_accelerate():
        balanced = get_balanced_memory(model, max_memory=dict(budgets), no_split_module_classes=no_split)
        # A GPU's balanced share may be smaller than what lies outside the layers (the head with its
        # logits, on a small model); those go on the first GPU together, beside the room accelerate keeps
        # there for the largest layer, else accelerate skips that GPU and then every GPU before the last.
        rest = sizes[""] - sizes[prefix]
        floor = rest + max(sizes[f"{prefix}.{i}"] for i in range(len(layers)))
        balanced[gpus[0]] = min(budgets[gpus[0]], max(balanced[gpus[0]], floor))
        device_map = dict(
            infer_auto_device_map(
                model, max_memory=balanced, no_split_module_classes=no_split, clean_result=False
            )
        )
    elsewhere = {name: d for name, d in device_map.items() if d not in budgets}
    if elsewhere:
        needed = sum(sizes[n] for n in elsewhere)
        raise PlacementError(
            f"{sizes[''] / 2**30:.1f} GiB of weights and working memory, {needed / 2**30:.1f} GiB of it "
            f"beyond the budgets of {len(gpus)} GPUs ({', '.join(f'{budgets[g] / 2**30:.1f}' for g in gpus)}"
            " GiB)"
        )
    placement = _finish("accelerate", model, device_map, budgets, [])
    outside = {d for name, d in device_map.items() if not (name == prefix or name.startswith(f"{prefix}."))}
    if len(outside) > 1:
        raise PlacementError(
            "the embeddings, norm and head (with the scoring logits) do not fit one GPU together "
            f"({', '.join(f'{budgets[g] / 2**30:.1f}' for g in gpus)} GiB budgets)"
        )
    if len(set(placement.layer_devices)) == 1 and placement.layer_devices[0] != placement.home:
        # The loader hooks the modules outside the layers to their device only when the layers span two
        # devices or more (load_layerwise, not changed here): the first layer joins them.
        moved = [placement.home, *placement.layer_devices[1:]]
        device_map = {k: v for k, v in device_map.items() if k != prefix}
        device_map.update({f"{prefix}.{i}": d for i, d in enumerate(moved)})
        placement = _finish("accelerate", model, device_map, budgets, ["first layer moved to the head's GPU"])
        if placement.bytes_per_device[placement.home] > budgets[placement.home]:
            raise PlacementError("the head's GPU cannot take a decoder layer beside the embeddings and head")
    return placement


def place_by_hand(model: nn.Module, budgets: dict[int, int]) -> Placement:
    """The hand-written placement evaluation used before (`trainer.weights.loader.spread_devices`: equal
    blocks of layers, everything else on the first GPU), for comparison."""
    from trainer.weights.loader import decoder_layers, spread_devices

    layers = decoder_layers(model)
    prefix = module_name(model, layers)
    gpus = sorted(budgets)
    blocks = spread_devices(len(layers), [torch.device("cuda", g) for g in gpus])
    device_map: dict[str, int] = {}
    for name, _unit in _units(model, prefix):
        device_map[name] = gpus[0]
    for i, device in enumerate(blocks):
        device_map[f"{prefix}.{i}"] = int(device.index)
    return _finish("hand-written", model, device_map, budgets, [])


def _units(model: nn.Module, prefix: str) -> Iterator[tuple[str, nn.Module]]:
    """The modules and direct tensors outside the decoder layers, as disjoint units."""
    todo: list[tuple[str, Any]] = [("", model)]
    while todo:
        name, module = todo.pop()
        if name == prefix:
            continue
        if prefix.startswith(f"{name}.") or name == "":
            dot = f"{name}." if name else ""
            todo.extend((f"{dot}{n}", c) for n, c in module.named_children())
            yield from ((f"{dot}{n}", t) for n, t in module.named_parameters(recurse=False))
            yield from ((f"{dot}{n}", t) for n, t in module.named_buffers(recurse=False))
        else:
            yield name, module


def gpu_budgets(fraction: float = USABLE_FRACTION) -> dict[int, int]:
    """Each visible GPU's budget: a fraction of its free memory (accelerate's `get_max_memory`), after
    PyTorch's cache is emptied (a model evaluated before may have left it full)."""
    if not torch.cuda.is_available():
        return {}
    from accelerate.utils import get_max_memory

    torch.cuda.empty_cache()
    return {k: int(v * fraction) for k, v in get_max_memory().items() if isinstance(k, int)}


def plan_evaluation(
    profile: Profile,
    model_dir: str,
    budgets: dict[int, int] | None = None,
    random_layers: int | None = None,
) -> Placement | None:
    """The evaluation's placement over the GPUs at hand (or `budgets`); None with fewer than two."""
    budgets = gpu_budgets() if budgets is None else budgets
    if len(budgets) < 2:
        return None
    config = model_config(profile, model_dir, random_layers)
    return place(planning_model(profile, config, WorkingMemory.of(config, profile)), budgets)
