"""The chat the trainer trains on, and the one token count of it.

An example becomes a chat: its system turn (none when empty) and its user turn, through the tokenizer's
own chat template up to where the assistant starts (the prompt); then the assistant's answer, a thinking
section holding the reasoning trace and the label, ended by the end-of-turn token. The trainer tokenizes
exactly these texts (`trainer.inputs.data`), `cockpit data` counts them (`cockpit.data.inspection`) and so
does the plan's run length (`cockpit.plan.run_length`), all through `token_count`: the model's tokenizer with
its chat template where they are on this machine, else about four characters a token.

Tokenizers come in as arguments (any Hugging Face tokenizer) or as the folder that holds one
(`load_tokenizer`); a profile's `model.path` names that folder through `cockpit.data.builtin`, which
builds the built-in model's. Nothing here imports `transformers` until a tokenizer is loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

THINK_OPEN = "<think>\n"
THINK_CLOSE = "\n</think>\n\n"
CHARS_PER_TOKEN = 4.0  # a rough English rate, used only where no tokenizer is at hand
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")  # a folder with either has a tokenizer

Lengths = tuple[int, int, int]  # (prompt, reasoning, answer) tokens of one example


def render_answer(reasoning: str, label: str) -> str:
    """The assistant's answer: a thinking section, then the label."""
    return f"{THINK_OPEN}{reasoning}{THINK_CLOSE}{label}"


def messages(example: dict[str, Any]) -> list[dict[str, str]]:
    """The prompt's turns: the system turn (none at all rather than an empty one), then the user's."""
    turns = [{"role": "user", "content": example["user"]}]
    if example.get("system"):
        turns.insert(0, {"role": "system", "content": example["system"]})
    return turns


def prompt_text(tokenizer: Any, example: dict[str, Any]) -> str:
    """The chat prompt up to where the assistant starts (thinking opened if the template does so)."""
    return tokenizer.apply_chat_template(messages(example), tokenize=False, add_generation_prompt=True)


def answer_text(tokenizer: Any, prompt: str, example: dict[str, Any]) -> str:
    """The answer that follows `prompt`, ended by the end-of-turn token."""
    answer = render_answer(example["reasoning"], example["gold"]) + tokenizer.eos_token
    if prompt.endswith(THINK_OPEN):  # templates like Qwen3-Thinking open the thinking section themselves
        answer = answer[len(THINK_OPEN) :]
    return answer


def chat_texts(tokenizer: Any, examples: Sequence[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The prompts and the answers of `examples`, as the trainer tokenizes them."""
    prompts = [prompt_text(tokenizer, e) for e in examples]
    answers = [answer_text(tokenizer, p, e) for p, e in zip(prompts, examples, strict=True)]
    return prompts, answers


def token_lengths(tokenizer: Any, examples: Sequence[dict[str, Any]]) -> list[Lengths]:
    """(prompt, reasoning, answer) tokens of each example as the trainer tokenizes it, before any cut.

    The prompt is the chat template up to the assistant; the answer is the label and the end of the turn;
    the reasoning is the thinking section between them (prompt + reasoning + answer is the whole example).
    """
    examples = list(examples)
    prompts, answers = chat_texts(tokenizer, examples)
    labels = [e["gold"] + tokenizer.eos_token for e in examples]
    p = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    a = tokenizer(answers, add_special_tokens=False)["input_ids"]
    lab = tokenizer(labels, add_special_tokens=False)["input_ids"]
    return [
        (len(pi), max(0, len(ai) - len(li)), min(len(li), len(ai)))
        for pi, ai, li in zip(p, a, lab, strict=True)
    ]


def estimate_lengths(examples: Sequence[dict[str, Any]]) -> list[Lengths]:
    """(prompt, reasoning, answer) tokens at about four characters a token, the end of the turn one more:
    where no tokenizer is at hand (the chat template's own tokens are not known then)."""

    def tokens(text: str) -> int:
        return max(1, round(len(text) / CHARS_PER_TOKEN)) if text else 0

    return [
        (tokens(e["system"]) + tokens(e["user"]), tokens(e["reasoning"]), tokens(e["gold"]) + 1)
        for e in examples
    ]


def load_tokenizer(folder: Path) -> Any:
    """The tokenizer in `folder`, as the trainer loads it (`AutoTokenizer`)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


@dataclass(frozen=True)
class TokenCount:
    """How examples are counted: by a tokenizer and its chat template, or (None) by the estimate."""

    tokenizer: Any | None
    how: str

    def lengths(self, examples: Sequence[dict[str, Any]]) -> list[Lengths]:
        """(prompt, reasoning, answer) tokens of each example."""
        if self.tokenizer is None:
            return estimate_lengths(examples)
        return token_lengths(self.tokenizer, examples)

    def total(self, examples: Sequence[dict[str, Any]]) -> int:
        """Tokens of all `examples`, whole (the chat template and the end of each turn included): the sum
        of their `lengths`, without splitting the answers."""
        if self.tokenizer is None:
            return sum(sum(lengths) for lengths in estimate_lengths(examples))
        prompts, answers = chat_texts(self.tokenizer, list(examples))
        ids = self.tokenizer(prompts + answers, add_special_tokens=False)["input_ids"]
        return sum(len(i) for i in ids)


def estimate(why: str) -> TokenCount:
    """The count without a tokenizer; `why` says why there is none."""
    return TokenCount(None, f"about {CHARS_PER_TOKEN:g} characters a token ({why})")


def token_count(folder: Path, name: str = "") -> TokenCount:
    """The count with the tokenizer in `folder` (`name` says whose; default: the folder) and its chat
    template when they are on this machine, else the estimate, saying why. A profile's `model.path` names
    its folder through `cockpit.data.builtin.tokenizer_folder`."""
    name = name or str(folder)
    if not any((folder / file).is_file() for file in TOKENIZER_FILES):
        return estimate(f"no tokenizer in {folder}")
    try:
        tokenizer = load_tokenizer(folder)
    except (ImportError, OSError, ValueError) as exc:  # nor could the trainer: it says so when it starts
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return estimate(f"the tokenizer in {folder} cannot be loaded: {first}")
    if not getattr(tokenizer, "chat_template", None):
        return estimate(f"the tokenizer in {folder} has no chat template")
    return TokenCount(tokenizer, f"the tokenizer and chat template of {name}")
