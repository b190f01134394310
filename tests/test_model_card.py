"""The adapter's model card: written by the trainer over PEFT's README, it says how to use the adapter
outside the cockpit (PEFT on the base, the quantization it was trained against, `vllm serve`'s flags)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cockpit.contract import TINY_MODEL
from cockpit.profiles import load_profile
from trainer.model_card import VLLM_LORA_RANKS, vllm_max_lora_rank, write_model_card

SHIPPED = ("tiny-cpu", "qwen3-235b-a22b-thinking-4xh100")


def _saved_adapter(profile_name: str, folder: Path) -> None:
    """The trainer's own LoRA (`trainer.model.attach_lora`, the profile's real values) on a one-layer
    Qwen3-MoE, saved by PEFT as the trainer saves it: adapter_config.json, weights and PEFT's README."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from trainer.model import attach_lora

    profile, _ = load_profile(profile_name)
    config = Qwen3MoeConfig(**{**TINY_MODEL, "num_hidden_layers": 1, "vocab_size": 256})
    model = Qwen3MoeForCausalLM(config)
    attach_lora(profile, model).save_pretrained(str(folder))


@pytest.mark.parametrize("profile_name", SHIPPED)
def test_the_card_names_r_the_quantization_and_the_vllm_flags(profile_name: str, tmp_path: Path) -> None:
    profile, _ = load_profile(profile_name)
    adapter = tmp_path / "adapter"
    _saved_adapter(profile_name, adapter)
    assert "library_name: peft" in (adapter / "README.md").read_text(), "PEFT wrote its card first"

    card = write_model_card(adapter, profile, "/models/the-base", "20261202-101500-run").read_text()
    assert card.startswith("---\n") and "library_name: peft" in card.split("\n---\n")[0], "PEFT's header kept"
    assert "Model Card for Model ID" not in card, "PEFT's empty template replaced"
    r = profile.lora.r
    assert f"LoRA r={r}," in card
    assert "PeftModel.from_pretrained(base" in card and '"/models/the-base"' in card
    q = profile.quantization
    assert f"4-bit {q.quant_type.upper()} with double quantization" in card and q.double_quant
    assert f"compute dtype {q.compute_dtype}" in card
    assert ("experts were quantized by the cockpit" in card) == q.quantize_experts
    (serve,) = [line for line in card.splitlines() if line.startswith("vllm serve ")]
    assert serve.startswith("vllm serve /models/the-base --enable-lora ")
    assert f"--lora-modules 20261202-101500-run={adapter.resolve()}" in serve
    rank = int(re.search(r"--max-lora-rank (\d+)", serve).group(1))
    assert rank >= r and rank in VLLM_LORA_RANKS


def test_max_lora_rank_is_the_smallest_vllm_accepts_at_or_above_r() -> None:
    assert [vllm_max_lora_rank(r) for r in (1, 8, 9, 16, 20, 32, 300, 512)] == [
        1,
        8,
        16,
        16,
        32,
        32,
        320,
        512,
    ]
    assert vllm_max_lora_rank(1024) == 1024  # past vLLM's list: r itself, which vLLM will refuse by name
