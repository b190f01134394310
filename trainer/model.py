"""Load the base model in 4 bit, attach LoRA, and audit what was really applied.

The model knows nothing of training or logging: this module builds it and describes it.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

import torch

from cockpit.plan.geometry import kind_of
from cockpit.profiles import Profile

DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "uint8": torch.uint8,
}


def bnb_config(profile: Profile) -> Any:
    """The bitsandbytes config the profile asks for."""
    from transformers import BitsAndBytesConfig

    q = profile.quantization
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=q.quant_type,
        bnb_4bit_use_double_quant=q.double_quant,
        bnb_4bit_compute_dtype=DTYPES[q.compute_dtype],
        bnb_4bit_quant_storage=DTYPES[q.storage_dtype],
    )


def load_base(profile: Profile, model_dir: str, spread: bool = False) -> Any:
    """The frozen base model, quantized as the profile says, on this rank's device.

    With `spread` (evaluation, one process) it is spread over every visible GPU instead.
    """
    from transformers import AutoModelForCausalLM

    q = profile.quantization
    kwargs: dict[str, Any] = {
        "dtype": DTYPES[q.compute_dtype],
        "trust_remote_code": profile.model.trust_remote_code,
    }
    if q.load_in_4bit:
        kwargs["quantization_config"] = bnb_config(profile)
    if torch.cuda.is_available() and spread:
        kwargs["device_map"] = "auto"
    elif torch.cuda.is_available():
        # Under ZeRO-3 Transformers refuses a device_map; bitsandbytes then quantizes on the current
        # device, which must be this rank's GPU.
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    model = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
    model.config.use_cache = False
    for param in model.parameters():
        param.requires_grad_(False)
    return model


def attach_lora(profile: Profile, model: Any) -> Any:
    """Wrap the model with PEFT LoRA on the profile's target modules."""
    from peft import LoraConfig, get_peft_model

    if profile.training.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    lora = profile.lora
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def logical_numel(param: torch.nn.Parameter) -> int:
    """Elements the parameter stands for: a packed 4-bit tensor or a ZeRO-3 partition counts whole."""
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
