"""The built-in default: a locally trained tokenizer, a random-init tiny Qwen3-MoE and generated data.

Nothing is downloaded. Everything is built deterministically from a seed and cached under
`$COCKPIT_CACHE` (default `~/.cache/cockpit`), keyed by the settings that shape it, so a second run
(or a second rank) reuses the first one's build. Builds go to a temporary folder that is renamed into
place, so a crash never leaves half an asset behind.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from cockpit.cache import cache_root
from cockpit.contract import TINY_MODEL
from trainer.tenants import generate

ASSET_VERSION = 1
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|pad|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


EMBED_STD = 0.1
HEAD_STD = 0.3


def _key(**settings: object) -> str:
    blob = json.dumps({"v": ASSET_VERSION, **settings}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def _build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Run `build(tmpdir)` unless `target` exists, then move the result into place atomically."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first: theirs is as good as ours
            if not target.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _data_dir(seed: int, train_per_tenant: int, eval_per_tenant: int) -> Path:
    return (
        cache_root() / f"tenants-{_key(kind='data', seed=seed, train=train_per_tenant, eval=eval_per_tenant)}"
    )


def _model_dir(seed: int) -> Path:
    key = _key(kind="model", seed=seed, config=TINY_MODEL, embed_std=EMBED_STD, head_std=HEAD_STD)
    return cache_root() / f"tiny-qwen3-moe-{key}"


def built(seed: int, train_per_tenant: int, eval_per_tenant: int) -> bool:
    """Whether the tiny model (with `seed` 0, as the trainer uses it) and this data set are cached."""
    return _model_dir(0).is_dir() and _data_dir(seed, train_per_tenant, eval_per_tenant).is_dir()


def data_path(seed: int, train_per_tenant: int, eval_per_tenant: int) -> Path:
    """The generated tenants data set as JSONL, built if missing."""

    def build(tmp: Path) -> None:
        with open(tmp / "examples.jsonl", "w", encoding="utf-8") as f:
            for example in generate(seed, train_per_tenant, eval_per_tenant):
                f.write(json.dumps(example) + "\n")

    return _build_once(_data_dir(seed, train_per_tenant, eval_per_tenant), build) / "examples.jsonl"


def _tokenizer_corpus(seed: int) -> list[str]:
    from trainer.data import render_answer

    corpus = []
    for ex in generate(seed + 1, 200, 0):  # a separate draw, so eval text is never seen by the tokenizer
        corpus.append(
            f"<|im_start|>system\n{ex['system']}<|im_end|>\n<|im_start|>user\n{ex['user']}<|im_end|>\n"
            f"<|im_start|>assistant\n{render_answer(ex['reasoning'], ex['gold'])}<|im_end|>\n"
        )
    return corpus


def build_tokenizer(out_dir: Path, seed: int, vocab_size: int) -> None:
    """Train a byte-level BPE tokenizer on generated text and save it as a HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tokenizer_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        bos_token=None,
        unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)


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
    return _build_once(_model_dir(seed), lambda tmp: build_model(tmp, seed))
