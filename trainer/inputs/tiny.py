"""The built-in default model: a random-init tiny Qwen3-MoE around the locally trained tokenizer.

Nothing is downloaded. The model is built deterministically from a seed and cached under
`$COCKPIT_CACHE` (default `~/.cache/cockpit`), keyed by the settings that shape it, so a second run
(or a second rank) reuses the first one's build; its tokenizer and the generated tenants data are the
data layer's (`cockpit.data.builtin`).
"""

from __future__ import annotations

from pathlib import Path

from cockpit.cache import cache_root
from cockpit.contract import TINY_MODEL
from cockpit.data.builtin import asset_key, build_once, build_tokenizer, data_dir

EMBED_STD = 0.1
HEAD_STD = 0.3


def model_dir(seed: int) -> Path:
    """Where the tiny model of `seed` is cached (built or not)."""
    key = asset_key(kind="model", seed=seed, config=TINY_MODEL, embed_std=EMBED_STD, head_std=HEAD_STD)
    return cache_root() / f"tiny-qwen3-moe-{key}"


def built(seed: int, train_per_tenant: int, eval_per_tenant: int) -> bool:
    """Whether the tiny model (with `seed` 0, as the trainer uses it) and this data set are cached."""
    return model_dir(0).is_dir() and data_dir(seed, train_per_tenant, eval_per_tenant).is_dir()


def build_model(out_dir: Path, seed: int) -> None:
    """A random-init tiny Qwen3-MoE saved with its tokenizer, like any local model directory."""
    import torch
    from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    build_tokenizer(out_dir, seed, TINY_MODEL["vocab_size"])
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    config = Qwen3MoeConfig(
        **{**TINY_MODEL, "vocab_size": len(tokenizer)},
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(config)
    # A trained model's logits span tens of nats; with the default init (std 0.02) a frozen head caps
    # them near 3 and no adapter could make the model confident. Widen the embedding and head scales.
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0.0, EMBED_STD)
        model.get_output_embeddings().weight.normal_(0.0, HEAD_STD)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir)


def model_path(seed: int = 0) -> Path:
    """The tiny model directory (config, weights, tokenizer), built if missing."""
    return build_once(model_dir(seed), lambda tmp: build_model(tmp, seed))
