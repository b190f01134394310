"""The planner's parameter inventory against real models built on the meta device (no memory, no weights)."""

from __future__ import annotations

import functools
import json

import pytest
import torch
import transformers

from cockpit.contract import TINY_MODEL, kind_of
from cockpit.plan.geometry import geometry_from_config
from cockpit.plan.weights import Precision
from cockpit.profiles import PROFILES_DIR

STORY_CONFIG = PROFILES_DIR / "models/qwen3-235b-a22b-thinking-2507/config.json"

SMALL = {"vocab_size": 96, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2}
CONFIGS = {
    "tiny-qwen3-moe": {"model_type": "qwen3_moe", **TINY_MODEL},
    "qwen3-moe-dense-layers": {
        "model_type": "qwen3_moe",
        **SMALL,
        "head_dim": 16,
        "intermediate_size": 80,
        "moe_intermediate_size": 24,
        "num_experts": 6,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 4,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
        "attention_bias": True,
    },
    "qwen2-moe-shared-expert": {
        "model_type": "qwen2_moe",
        **SMALL,
        "intermediate_size": 64,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 40,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 2,
    },
    "mixtral": {
        "model_type": "mixtral",
        **SMALL,
        "intermediate_size": 48,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 2,
    },
    "llama-dense-biases": {
        "model_type": "llama",
        **SMALL,
        "intermediate_size": 88,
        "num_hidden_layers": 3,
        "attention_bias": True,
        "mlp_bias": True,
    },
    "llama-tied": {
        "model_type": "llama",
        **SMALL,
        "intermediate_size": 88,
        "num_hidden_layers": 2,
        "tie_word_embeddings": True,
    },
    "qwen3-dense": {
        "model_type": "qwen3",
        **SMALL,
        "head_dim": 12,
        "intermediate_size": 72,
        "num_hidden_layers": 2,
    },
    "qwen2-dense": {"model_type": "qwen2", **SMALL, "intermediate_size": 72, "num_hidden_layers": 2},
}


def meta_model(cfg: dict) -> torch.nn.Module:
    config = transformers.AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config)


@functools.cache
def meta_named(name: str) -> torch.nn.Module:
    """Each small model is built once for all the tests that look at it."""
    return meta_model(CONFIGS[name])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_tensors_match_the_real_model(name: str) -> None:
    cfg = CONFIGS[name]
    real = {n: tuple(p.shape) for n, p in meta_named(name).named_parameters()}
    planned = {t.name: t.shape for t in geometry_from_config(cfg).tensors()}
    assert planned == real


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_counts_by_kind_match_the_audit_census(name: str) -> None:
    """The plan's kinds are the audit's groups: the real model's names grouped by the same `kind_of`."""
    cfg = CONFIGS[name]
    census: dict[str, int] = {}
    for n, p in meta_named(name).named_parameters():
        census[kind_of(n)] = census.get(kind_of(n), 0) + p.numel()
    counts = {k: v for k, v in geometry_from_config(cfg).counts().items() if v}
    assert counts == census


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_what_bitsandbytes_would_quantize(name: str) -> None:
    """4 bit goes to nn.Linear weights Transformers does not keep out (lm_head); never to fused experts."""
    from transformers.quantizers.base import get_keys_to_not_convert

    cfg = CONFIGS[name]
    model = meta_named(name)
    skip = set(get_keys_to_not_convert(model))
    expected = set()
    for module_name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not any(
            module_name == s or module_name.endswith("." + s) for s in skip
        ):
            expected.add(f"{module_name}.weight")
    precision = Precision(load_in_4bit=True, experts_4bit=False)
    planned = {t.name for t in geometry_from_config(cfg).tensors() if precision.quantized(t)}
    assert planned == expected


def test_story_model_count_from_the_real_235b_config() -> None:
    cfg = json.loads(STORY_CONFIG.read_text())
    model = meta_model(cfg)
    real = sum(p.numel() for p in model.parameters())
    geometry = geometry_from_config(cfg)
    assert geometry.total_params == real
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    assert geometry.counts()["experts"] == experts
    # "A22B": about 22 B parameters a token multiplies through (top-8 of 128 experts, plus everything else).
    assert 21e9 < geometry.active_matmul_params() < 23e9


def test_slices_keep_the_geometry() -> None:
    geometry = geometry_from_config(json.loads(STORY_CONFIG.read_text()))
    one, two = geometry.with_layers(1), geometry.with_layers(2)
    layer = two.total_params - one.total_params
    assert (
        layer
        == 128 * 3 * 4096 * 1536 + 4096 * (8192 + 512 + 512) + 8192 * 4096 + 128 * 4096 + 2 * 4096 + 2 * 128
    )
