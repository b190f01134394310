"""The built-in data and the built-in model's tokenizer, made here: nothing is downloaded.

`builtin:tiny-tenants` is generated (`cockpit.data.tenants`) into a JSONL file, and the tiny model's
tokenizer is a byte-level BPE trained on generated chats. Both are built deterministically from a seed and
cached under `$COCKPIT_CACHE` (default `~/.cache/cockpit`), keyed by the settings that shape them, so a
second run (or a second rank) reuses the first one's build. Builds go to a temporary folder that is renamed
into place, so a crash never leaves half an asset behind. The trainer builds the tiny model itself
(`trainer.inputs.tiny`) around the same tokenizer; `cockpit data` and the plan count tokens with it without
building the model.
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
from cockpit.data.chat import messages, render_answer
from cockpit.data.tenants import generate

ASSET_VERSION = 1
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|pad|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def asset_key(**settings: object) -> str:
    """A short key of the settings that shape a built asset (and of `ASSET_VERSION`)."""
    blob = json.dumps({"v": ASSET_VERSION, **settings}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
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


def data_dir(seed: int, train_per_tenant: int, eval_per_tenant: int) -> Path:
    """Where the generated tenants of these settings are cached (built or not)."""
    key = asset_key(kind="data", seed=seed, train=train_per_tenant, eval=eval_per_tenant)
    return cache_root() / f"tenants-{key}"


def data_path(seed: int, train_per_tenant: int, eval_per_tenant: int) -> Path:
    """The generated tenants data set as JSONL, built if missing."""

    def build(tmp: Path) -> None:
        with open(tmp / "examples.jsonl", "w", encoding="utf-8") as f:
            for example in generate(seed, train_per_tenant, eval_per_tenant):
                f.write(json.dumps(example) + "\n")

    return build_once(data_dir(seed, train_per_tenant, eval_per_tenant), build) / "examples.jsonl"


def chatml(turns: list[dict[str, str]]) -> str:
    """`turns` as `CHAT_TEMPLATE` writes them, for training the tokenizer before it exists."""
    return "".join(f"<|im_start|>{t['role']}\n{t['content']}<|im_end|>\n" for t in turns)


def _tokenizer_corpus(seed: int) -> list[str]:
    corpus = []
    for ex in generate(seed + 1, 200, 0):  # a separate draw, so eval text is never seen by the tokenizer
        answer = {"role": "assistant", "content": render_answer(ex["reasoning"], ex["gold"])}
        corpus.append(chatml([*messages(ex), answer]))
    return corpus


def build_tokenizer(out_dir: Path, seed: int, vocab_size: int) -> None:
    """Train a byte-level BPE tokenizer on generated chats and save it as a HF fast tokenizer."""
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


def tokenizer_path(seed: int = 0) -> Path:
    """The tiny model's tokenizer (the one `trainer.inputs.tiny` builds into the model's folder), alone in a
    folder of its own, built if missing."""
    vocab = TINY_MODEL["vocab_size"]
    key = asset_key(kind="tokenizer", seed=seed, vocab_size=vocab, template=CHAT_TEMPLATE)
    return build_once(cache_root() / f"tiny-tokenizer-{key}", lambda tmp: build_tokenizer(tmp, seed, vocab))


def tokenizer_folder(model_path: str) -> Path:
    """Where a profile's `model.path` keeps its tokenizer: that folder, or for the built-in model its
    tokenizer's (`tokenizer_path`, built if missing)."""
    from cockpit.profiles import BUILTIN_PREFIX

    return tokenizer_path() if model_path.startswith(BUILTIN_PREFIX) else Path(model_path).expanduser()
