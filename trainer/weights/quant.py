"""The profile's quantization settings as torch and bitsandbytes objects (no model code here).

Both the model builder (`trainer.model`) and the layer-by-layer loader (`trainer.weights.loader`) read these,
so neither imports the other for them.
"""

from __future__ import annotations

from typing import Any

import torch

from cockpit import contract
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


def experts_storage_dtype(profile: Profile) -> torch.dtype:
    """The float dtype packed NF4 experts are stored in (`cockpit.contract.experts_storage_dtype`)."""
    return DTYPES[contract.experts_storage_dtype(profile.training.bf16, profile.quantization.storage_dtype)]


def uses_layerwise_loader(profile: Profile) -> bool:
    """True when the trainer loads layer by layer (`cockpit.contract.loader_of`)."""
    return contract.loader_of(profile.model.loader, profile.model.trust_remote_code) == "layerwise"


def keep_4bit_layout(model: Any) -> int:
    """Turn off bitsandbytes' repacking of 4-bit weights for CPU inference on every layer; the layers it
    was on for.

    On a CPU with AVX512-BF16, `Linear4bit.forward` rewrites `weight.data` into another layout the first
    time it runs without gradients (validation does). Under ZeRO-3 the partition keeps the first layout:
    the next gather pairs the old bytes with the new layout's quant state, and saving the adapter fails
    (`assert packed_weight.dtype == torch.uint8`), after steps that computed with a mismatched layout.
    """
    turned_off = 0
    for module in model.modules():
        if getattr(module, "support_avx512bf16_for_cpu", False):
            module.support_avx512bf16_for_cpu = False
            turned_off += 1
    return turned_off
