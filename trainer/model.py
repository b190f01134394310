"""Load the base model in 4 bit, attach LoRA, and audit what was really applied.

The model knows nothing of training or logging: this module builds it and describes it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from cockpit.contract import kind_of
from cockpit.profiles import Profile
from trainer.weights.quant import DTYPES, bnb_config, experts_storage_dtype, uses_layerwise_loader


def _zero3_init_config(profile: Profile, model_dir: str) -> dict[str, Any] | None:
    """The DeepSpeed config to partition with at load, or None when ZeRO-3 is not in use."""
    if profile.deepspeed.stage != 3:
        return None
    from transformers import AutoConfig

    from trainer.ds_config import zero_init_config

    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=profile.model.trust_remote_code)
    hidden = getattr(config, "hidden_size", None) or getattr(config.get_text_config(), "hidden_size", 4096)
    return zero_init_config(profile, int(hidden))


def load_base(
    profile: Profile,
    model_dir: str,
    spread: bool = False,
    random_layers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Any:
    """The frozen base model, quantized as the profile says, on this rank's device.

    With `spread` (evaluation: one process, no DeepSpeed) it is spread over the visible GPUs as
    accelerate places it (`trainer.weights.placement`: whole decoder layers, everything else on the first
    GPU); the layer-by-layer loader loads each layer onto its GPU, `"transformers"` takes the same map as
    `from_pretrained(device_map=...)`. One GPU or none: nothing to place.

    `model.loader = "layerwise"` (default) loads and quantizes one decoder layer at a time and, under
    ZeRO-3, partitions each as soon as it is built (`trainer.weights.loader`); `"transformers"` is
    `from_pretrained`, which puts the whole model on each rank's GPU before ZeRO-3 sees it. Either way,
    `quantization.quantize_experts` packs the fused MoE experts in NF4 (`trainer.layers.experts4bit`), and the
    MoE blocks become ZeRO-3 leaf modules. What the loader did is left in `model.cockpit_load_facts`.
    `random_layers` (a rehearsal; with `spread`, a placement measured on GPUs): the architecture sliced
    to that many decoder layers, random weights (the layer-by-layer loader only). `progress(done, total)`
    is called after each decoder layer the layer-by-layer loader has loaded.
    """
    from trainer.layers import experts_model
    from trainer.weights.loader import load_device, load_layerwise

    q = profile.quantization
    device = load_device()
    layerwise = uses_layerwise_loader(profile)
    if random_layers is not None and not layerwise:
        raise ValueError('random weights need the layer-by-layer loader (model.loader = "layerwise")')
    placement = None
    if spread and device.type == "cuda":
        from trainer.weights.placement import plan_evaluation

        placement = plan_evaluation(profile, model_dir, random_layers=random_layers)
    if layerwise and spread:
        # The loader keeps everything outside the layers on the device it is given and hooks each layer
        # to move its inputs (`follow_inputs`): it quantizes each layer on its GPU as it loads it, so the
        # weights are in place before accelerate's `dispatch_model` could move them.
        home = torch.device("cuda", placement.home) if placement else device
        layer_devices = placement.torch_layer_devices() if placement else None
        model, facts = load_layerwise(
            profile,
            model_dir,
            home,
            None,
            spread_over=layer_devices,
            random_layers=random_layers,
            progress=progress,
        )
    elif layerwise:
        zero_init = _zero3_init_config(profile, model_dir)
        model, facts = load_layerwise(
            profile, model_dir, device, zero_init, random_layers=random_layers, progress=progress
        )
    else:
        from transformers import AutoModelForCausalLM

        kwargs: dict[str, Any] = {
            "dtype": DTYPES[q.compute_dtype],
            "trust_remote_code": profile.model.trust_remote_code,
        }
        if q.load_in_4bit:
            kwargs["quantization_config"] = bnb_config(profile)
        if placement is not None:
            kwargs["device_map"] = placement.device_map
        # Otherwise no device_map: under ZeRO-3 Transformers refuses one, and bitsandbytes quantizes on
        # the current device, which load_device() set to this rank's GPU.
        model = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
        facts = {"loader": "transformers", "load_device": str(device)}
        if q.quantize_experts:
            facts["experts_nf4"] = experts_model.quantize_model_experts(model, experts_storage_dtype(profile))
    if placement is not None:
        facts["placement"] = placement.to_dict()
    model.config.use_cache = False
    for param in model.parameters():
        param.requires_grad_(False)
    if profile.deepspeed.zero3_leaf == "decoder_layer":
        from deepspeed.utils import set_z3_leaf_modules

        from trainer.weights.loader import decoder_layers

        layer_cls = type(decoder_layers(model)[0])
        set_z3_leaf_modules(model, [layer_cls])
        facts["zero3_leaf_modules"] = [layer_cls.__name__]
    else:
        facts["zero3_leaf_modules"] = experts_model.set_moe_leaf_modules(model)
    packed = [p for p in model.parameters() if hasattr(p, "cockpit_logical_numel")]
    if packed:
        # ZeRO-3 must own the packed experts and their scales like any parameter (no per-GPU copy).
        facts["nf4_expert_tensors"] = len(packed)
        facts["nf4_expert_tensors_partitioned"] = sum(hasattr(p, "ds_id") for p in packed)
    if spread:
        facts["inference_layers"] = configure_inference(model)
    model.cockpit_load_facts = facts
    return model


def configure_inference(model: Any) -> dict[str, int | bool]:
    """Evaluation's layers on a base model loaded with `spread`: the fused RMSNorm and rotary embedding
    that training runs with, and bitsandbytes' 4-bit projections on a decode step's few rows by the NF4
    decode kernel (`trainer/layers/linear4bit_rows.py`). Each falls back where it cannot run here."""
    from trainer.layers import linear4bit_rows, rope
    from trainer.layers.fused_norm import fuse_rms_norms

    return {
        "fused_rms_norms": fuse_rms_norms(model),
        "fused_rope": rope.install(model),
        "nf4_linear_rows": linear4bit_rows.install(model),
    }


def configure_training(profile: Profile, model: Any) -> dict[str, Any]:
    """The profile's training-time choices on a loaded base model: attention kernel, chunked loss, fused
    RMSNorm and rotary embedding, and ZeRO-3's fetch without host waits (`trainer/weights/zero3_fetch.py`)."""
    from trainer.ds_config import embeddings_kept
    from trainer.layers import rope
    from trainer.layers.fused_norm import fuse_rms_norms
    from trainer.layers.loss import use_chunked_loss
    from trainer.weights import zero3_fetch
    from trainer.weights.quant import keep_4bit_layout

    t = profile.training
    kernel = None
    if t.attention == "varlen":
        from trainer.layers.attention import prepare, register

        register()
        config = getattr(model.config, "text_config", model.config)
        kernel = prepare(config, DTYPES[profile.quantization.compute_dtype], profile.hardware.gpus > 0)
    if getattr(model.config, "_attn_implementation", None) != t.attention:
        model.set_attn_implementation(t.attention)
    chunked = use_chunked_loss(model) if t.chunked_loss else False
    return {
        "cpu_4bit_repack_off": keep_4bit_layout(model),
        "attention": model.config._attn_implementation,
        **({"attention_kernel": kernel} if kernel else {}),
        "chunked_loss": chunked,
        "fused_rms_norms": fuse_rms_norms(model),
        "fused_rope": rope.install(model),
        # One rank offloading to the CPU only: several ranks gather through collectives this ordering does
        # not cover, and NVMe swap buffers are reused as soon as released (trainer/weights/zero3_fetch.py).
        "async_fetch": profile.deepspeed.stage == 3
        and profile.world_size == 1
        and profile.deepspeed.offload_param != "nvme"
        and zero3_fetch.install(),
        "embeddings_on_gpu": zero3_fetch.keep_embeddings_on_gpu(model) if embeddings_kept(profile) else 0,
    }


def attach_lora(profile: Profile, model: Any) -> Any:
    """Wrap the model with PEFT LoRA on the profile's target modules (and the experts if asked), each
    adapter's forward the lean one (`trainer.layers.lora_forward`)."""
    from peft import LoraConfig, get_peft_model
    from transformers import set_seed

    from trainer.layers import frozen_experts, lora_forward
    from trainer.layers.experts_model import add_expert_lora

    if profile.training.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
        if profile.training.keep_dequantized_experts:
            # Non-reentrant: the first forward's saved tensors are dropped, so the recompute's dequantized
            # experts can serve the backward (trainer/layers/frozen_experts.py).
            frozen_experts.keep_for_backward(model)
    lora = profile.lora
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    # PEFT draws each adapter's A from torch's global generator: seeded here, a run's adapters start the
    # same way every time (and its gradients with them; B starts at zero, so the first loss never showed it)
    set_seed(profile.training.seed)
    peft_model = get_peft_model(model, config)
    if lora.target_experts:
        add_expert_lora(peft_model, lora.r, lora.alpha, lora.dropout)
    if profile.training.bf16 and any(hasattr(p, "ds_id") for p in peft_model.parameters()):
        # DeepSpeed casts a model's parameters to bf16 unless ZeRO-3 partitioned them at load; then the
        # adapters added since would stay fp32. Cast them as the engine would have.
        for param in peft_model.parameters():
            if param.requires_grad and not hasattr(param, "ds_id") and param.dtype != torch.bfloat16:
                param.data = param.data.to(torch.bfloat16)
    memoize_parameter_count(peft_model.get_base_model())
    peft_model.cockpit_lean_lora = lora_forward.install(peft_model)  # the `loaded` event's `lean_lora`
    return peft_model


def memoize_parameter_count(model: Any) -> None:
    """Count the model's parameters once. HF's Trainer adds `6 x tokens x num_parameters()` to its FLOP
    total on every micro-batch, and `num_parameters` walks every module and parameter each time: 3.6 ms a
    micro-batch on the 4-layer slice (profiled), growing with depth, while the GPU waits. The counts
    cannot change once the adapters are attached; the first call's answer is kept per argument set."""
    original = model.num_parameters
    memo: dict[tuple[bool, bool], int] = {}

    def num_parameters(only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        key = (only_trainable, exclude_embeddings)
        if key not in memo:
            memo[key] = original(only_trainable=only_trainable, exclude_embeddings=exclude_embeddings)
        return memo[key]

    model.num_parameters = num_parameters


def logical_numel(param: torch.nn.Parameter) -> int:
    """Elements the parameter stands for: a packed 4-bit tensor or a ZeRO-3 partition counts whole.

    Packed NF4 experts say it themselves (`cockpit_logical_numel`: the weight's size for the codes, 0 for
    their scales, which are part of the same weight).
    """
    logical = getattr(param, "cockpit_logical_numel", None)
    if logical is not None:
        return int(logical)
    state = getattr(param, "quant_state", None)
    if state is not None and getattr(state, "shape", None) is not None:
        return int(torch.Size(state.shape).numel())
    ds_numel = getattr(param, "ds_numel", None)
    return int(ds_numel) if ds_numel is not None else param.numel()


def is_4bit(param: torch.nn.Parameter) -> bool:
    """True for parameters stored packed in 4 bit (bitsandbytes Params4bit or our packed experts)."""
    return type(param).__name__ == "Params4bit" or getattr(param, "cockpit_4bit", False)


def parameter_census(model: torch.nn.Module) -> dict[str, dict[str, int]]:
    """Per group: logical parameters, how many are stored in 4 bit, and how many train."""
    groups: dict[str, dict[str, int]] = defaultdict(lambda: {"params": 0, "params_4bit": 0, "trainable": 0})
    for name, param in model.named_parameters():
        g = groups[kind_of(name)]
        n = logical_numel(param)
        g["params"] += n
        if is_4bit(param):
            g["params_4bit"] += n
        if param.requires_grad:
            g["trainable"] += n
    return dict(groups)


def lora_matches(model: torch.nn.Module, targets: list[str]) -> dict[str, int]:
    """How many modules each LoRA target name matched."""
    counts = dict.fromkeys(targets, 0)
    for name, module in model.named_modules():
        if hasattr(module, "lora_A"):
            leaf = name.rsplit(".", 1)[-1]
            if leaf in counts:
                counts[leaf] += 1
    return counts
