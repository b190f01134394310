"""The adapter's model card: how to use the adapter outside the cockpit.

PEFT's `save_pretrained` writes a README.md into the adapter folder: a metadata header (`base_model`,
`library_name: peft`, tags) over an empty template. The trainer replaces the template with this card,
keeping the header: the LoRA it holds, the quantization of the base it was trained against (bitsandbytes
NF4 and double quantization for the linear layers, the MoE experts packed by the cockpit), and how to load
it with PEFT and serve it with `vllm serve`. docs/adapter.md says the same at length.
"""

from __future__ import annotations

import json
from pathlib import Path

from cockpit.profiles import Profile
from cockpit.report.production import VLLM_LORA_RANKS, vllm_max_lora_rank

__all__ = ["CARD", "VLLM_LORA_RANKS", "model_card", "vllm_max_lora_rank", "write_model_card"]

CARD = "README.md"


def quantization_words(profile: Profile) -> str:
    """What the frozen base was while the adapter trained, in a sentence or two."""
    q = profile.quantization
    if not q.load_in_4bit:
        base = f"The base was not quantized: its weights were {q.compute_dtype}."
    else:
        double = " with double quantization" if q.double_quant else ""
        base = (
            "The base's linear layers were quantized by bitsandbytes to 4-bit "
            f"{q.quant_type.upper()}{double}, compute dtype {q.compute_dtype}."
        )
    if q.load_in_4bit and q.quantize_experts:
        experts = (
            " The fused MoE experts were quantized by the cockpit itself (NF4, their block scales double "
            "quantized; `trainer/layers/experts4bit.py`): bitsandbytes quantizes `nn.Linear` only, so loaded "
            "elsewhere the experts stay in 16 bit unless the engine quantizes them."
        )
    else:
        experts = (
            " The fused MoE experts (if the model has them) stayed in 16 bit, as bitsandbytes leaves them."
        )
    return base + experts


def _bnb_line(profile: Profile) -> str:
    q = profile.quantization
    if not q.load_in_4bit:
        return ""
    return (
        "    quantization_config=BitsAndBytesConfig(  # as trained; leave out for a 16-bit base\n"
        f'        load_in_4bit=True, bnb_4bit_quant_type="{q.quant_type}",\n'
        f"        bnb_4bit_use_double_quant={q.double_quant},\n"
        f"        bnb_4bit_compute_dtype=torch.{q.compute_dtype},\n"
        "    ),\n"
    )


def model_card(profile: Profile, base: str, adapter: str, name: str) -> str:
    """The card's body (Markdown): `base` the base model's path or hub id, `adapter` this folder, `name` the
    name the adapter is served under."""
    lora = profile.lora
    rank = vllm_max_lora_rank(lora.r)
    targets = ", ".join(lora.target_modules)
    expert_lora = (
        "\n\nThe experts' LoRA (`expert_lora.safetensors`, `lora.target_experts`) is the cockpit's own "
        "format: PEFT and vLLM read only the adapter on the modules above, so outside the cockpit the "
        "experts are the base's."
        if lora.target_experts
        else ""
    )
    return f"""# LoRA adapter: {profile.model.name or base}

Trained by the cockpit (profile `{profile.name}`, run `{name}`): LoRA r={lora.r}, alpha={lora.alpha:g}, \
dropout {lora.dropout:g}, on {targets}. Base model: `{base}`.

## The base it was trained against

{quantization_words(profile)} The adapter's weights are the same whatever the base is loaded as: a 16-bit \
base gives slightly different outputs from the 4-bit one the cockpit trained and evaluated on.{expert_lora}

## With PEFT

```python
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

base = AutoModelForCausalLM.from_pretrained(
    "{base}",
{_bnb_line(profile)}    dtype=torch.bfloat16, device_map="auto",
)
model = PeftModel.from_pretrained(base, "{adapter}")
tokenizer = AutoTokenizer.from_pretrained("{base}")
```

On a 16-bit base, `model.merge_and_unload()` folds the adapter in and gives a plain model.

## With vLLM

```bash
vllm serve {base} --enable-lora --lora-modules {name}={adapter} --max-lora-rank {rank}
```

`--max-lora-rank` must be at least the adapter's r ({lora.r}); vLLM accepts \
{", ".join(map(str, VLLM_LORA_RANKS))}. A request names the adapter as its model (`"model": "{name}"`); \
the base alone is served under its own name. Add `--tensor-parallel-size N` to spread the base over N GPUs.
"""


def _header(readme: Path, base: str) -> str:
    """PEFT's metadata header from the README it wrote, or one of our own."""
    if readme.is_file():
        text = readme.read_text(encoding="utf-8", errors="replace")
        if text.startswith("---\n") and "\n---\n" in text[4:]:
            return text[: text.index("\n---\n", 4) + 5]
    return f"---\nbase_model: {json.dumps(base)}\nlibrary_name: peft\ntags:\n- lora\n- cockpit\n---\n"


def write_model_card(folder: Path, profile: Profile, base: str, name: str) -> Path:
    """Write the card into the adapter `folder` (after PEFT saved it), under PEFT's header: `base` the
    model directory the run loaded, `name` the run's id. Returns the card's path."""
    readme = Path(folder) / CARD
    card = model_card(profile, base, str(Path(folder).resolve()), name)
    readme.write_text(_header(readme, base) + "\n" + card, encoding="utf-8")
    return readme
