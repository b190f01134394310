"""Label scoring on the held-out split, and predictions files.

Each example is classified by the model's own scores: it first writes its thinking section (greedy,
at most `max_think_tokens`), then every label of the example's tenant is scored by the
log-probability of `label<end of turn>` after that thinking (`trainer.evaluation.scoring`: the prompt and the
thinking go through the model once for all the labels); the best one is the prediction. The same
code scores a base model and a fine-tuned adapter, so their numbers are comparable.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cockpit.contract import prefill_rows
from cockpit.data.chat import THINK_CLOSE, THINK_OPEN, prompt_text
from trainer.evaluation import decode, eval_batch, scoring
from trainer.evaluation.scoring import score_many

THINK_END = "</think>"


@dataclass
class Prediction:
    """One classified example."""

    tenant: str
    id: str
    gold: str
    pred: str
    scores: dict[str, float]
    thinking: str

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "id": self.id,
            "gold": self.gold,
            "pred": self.pred,
            "scores": {k: round(v, 4) for k, v in self.scores.items()},
            "thinking": self.thinking,
        }


def _close_thinking(prompt: str, generated: str) -> str:
    """The answer prefix up to where the label goes: thinking cut at its end tag, or closed by force."""
    opened = "" if prompt.endswith(THINK_OPEN) else THINK_OPEN
    text = generated
    if text.startswith(THINK_OPEN):
        text = text[len(THINK_OPEN) :]
    elif text.startswith("<think>"):
        text = text[len("<think>") :]
    end = text.find(THINK_END)
    reasoning = (text[:end] if end >= 0 else text).strip()
    return f"{opened}{reasoning}{THINK_CLOSE}"


def load_finetuned(base: Any, adapter: Path) -> Any:
    """The base model with the run's adapter: PEFT LoRA, and LoRA on the NF4 experts where trained."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(base, str(adapter))
    expert_lora = adapter / "expert_lora.safetensors"
    if expert_lora.is_file():  # written beside the PEFT adapter when lora.target_experts is on
        from trainer.layers.experts_model import load_expert_lora

        load_expert_lora(model, str(expert_lora))
    return model


def cut_at_end(rows: list[list[int]], ends: set[int]) -> list[list[int]]:
    """Each generated row up to (not including) its first end token."""
    return [next((row[:i] for i, tok in enumerate(row) if tok in ends), row) for row in rows]


def _generated(model: Any, tokenizer: Any, enc: Any, max_new_tokens: int, stop: list[int]) -> list[list[int]]:
    """Transformers' own loop, for a model the fast path cannot drive: a chunk of rows at a time, as the
    fast path prefills (`prefill_rows`), so the batch chosen for the fast path fits here too."""
    width = enc["input_ids"].shape[1]
    per = prefill_rows(width + max_new_tokens)
    rows: list[list[int]] = []
    for start in range(0, enc["input_ids"].shape[0], per):
        out = model.generate(
            input_ids=enc["input_ids"][start : start + per],
            attention_mask=enc["attention_mask"][start : start + per],
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=stop,
            pad_token_id=tokenizer.pad_token_id,
        )
        rows += out[:, width:].tolist()
    return rows


@torch.no_grad()
def think(model: Any, tokenizer: Any, prompts: list[str], max_new_tokens: int) -> list[str]:
    """Greedy thinking sections for a batch of prompts (left-padded)."""
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    stop = [s for s in (tokenizer.convert_tokens_to_ids(THINK_END), tokenizer.eos_token_id) if s is not None]
    fast = decode.greedy(model, enc["input_ids"], enc["attention_mask"], max_new_tokens, set(stop))
    new = fast.tolist() if fast is not None else _generated(model, tokenizer, enc, max_new_tokens, stop)
    # Each row up to its own end (</think>, eos, or the padding a finished row gets while its batch
    # goes on): what follows depends on the other prompts of the batch, not on this one.
    ends = set(stop) | ({tokenizer.pad_token_id} - {None})
    return tokenizer.batch_decode(cut_at_end(new, ends), skip_special_tokens=False)


def classify(
    model: Any,
    tokenizer: Any,
    examples: list[dict[str, Any]],
    max_think_tokens: int,
    batch_size: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    keep_going: Callable[[], bool] | None = None,
) -> list[Prediction]:
    """Predictions for `examples` (the eval split, or a sample in its order) by thinking then label
    scoring, `batch_size` at a time (by default as many as the free memory holds:
    `trainer.evaluation.eval_batch`); `keep_going`, asked before each batch, stops it after a whole batch (a
    time budget)."""
    model.eval()
    predictions: list[Prediction] = []
    all_prompts = [prompt_text(tokenizer, ex) for ex in examples]
    if batch_size is None:

        def longest() -> int:
            lengths = (len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in all_prompts)
            return max(lengths, default=1)

        batch_size = eval_batch.choose(model, longest, max_think_tokens, len(examples))
        print(f"[cockpit] eval: {batch_size} prompts a batch", flush=True)
    for start in range(0, len(examples), batch_size):
        if keep_going is not None and not keep_going():
            break
        batch = examples[start : start + batch_size]
        prompts = all_prompts[start : start + batch_size]
        thoughts = think(model, tokenizer, prompts, max_think_tokens)
        prefixes = [_close_thinking(p, t) for p, t in zip(prompts, thoughts, strict=True)]
        all_scores = score_many(
            model,
            tokenizer,
            [p + a for p, a in zip(prompts, prefixes, strict=True)],
            [list(e["labels"]) for e in batch],
        )
        for ex, answer_prefix, scores in zip(batch, prefixes, all_scores, strict=True):
            pred = max(scores, key=scores.__getitem__)
            predictions.append(
                Prediction(ex["tenant"], ex["id"], ex["gold"], pred, scores, answer_prefix.strip())
            )
        if progress is not None:
            progress(len(predictions), len(examples))
    print(f"[cockpit] eval: labels scored by {scoring.path()}", flush=True)
    return predictions


def write_predictions(path: Path, predictions: list[Prediction], meta: dict[str, Any]) -> None:
    """One JSON line per example; a first line `{"meta": ...}` says which system made them."""
    from cockpit.record.atomic import write_jsonl_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl_atomic(path, [{"meta": meta}, *(p.to_json() for p in predictions)])


def _key(example: dict[str, Any]) -> tuple[str, str]:
    return example["tenant"], str(example["id"])


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0


# --- the evaluation process ----------------------------------------------------------------------
def parse_named(items: list[str]) -> list[tuple[str, str]]:
    """`NAME=PATH` pairs; a bare PATH is named after its folder."""
    pairs = []
    for item in items:
        name, sep, path = item.partition("=")
        pairs.append((name, path) if sep else (Path(item).name, item))
    return pairs


class Evaluation:
    """Scores systems on a run's held-out split, or a sample of it (`cockpit.data.sampling`: every system
    on the same examples), and writes `predictions/<system>.jsonl`."""

    def __init__(
        self, run_dir: Path, examples: int | None = None, time_budget_s: float | None = None
    ) -> None:
        from cockpit.profiles import parse_profile
        from cockpit.record import EventWriter, RunPaths, load_manifest

        self.paths = RunPaths(run_dir)
        manifest = load_manifest(run_dir)
        self.profile = parse_profile(manifest["profile"], str(self.paths.manifest))
        self.events = EventWriter(self.paths.events("eval"))
        # The sample: this command's flags, else what `cockpit eval` asked for, else the profile's.
        asked = manifest.get("eval_request") or {}
        spec = self.profile.eval
        self.wanted: int | None = examples or asked.get("examples") or spec.examples or None
        self.budget_s: float | None = (
            time_budget_s or asked.get("time_budget_s") or spec.time_budget_s or None
        )

    def examples(self) -> tuple[str, list[dict[str, Any]]]:
        from cockpit.cache import cache_root
        from trainer.inputs.assets import resolve_assets
        from trainer.inputs.data import load_examples

        model_dir, data_file = resolve_assets(self.profile)
        data = load_examples(data_file, self.profile.data, cache_dir=cache_root() / "datasets")
        return model_dir, data.split("eval")

    def draw(self, population: list[dict[str, Any]], systems: int) -> list[dict[str, Any]]:
        """The examples to score, in the sample's order; every system gets them through `self.shared`."""
        from cockpit.data.sampling import Shared, draw

        self.keys = [_key(e) for e in population]
        self.sample = draw(self.keys, self.wanted, self.profile.data.seed)
        examples = [population[i] for i in self.sample.order]
        self.shared = Shared(examples, _key, self.budget_s, systems)
        return examples

    def score(self, name: str, model: Any, tokenizer: Any, meta: dict) -> None:
        """Score the next system on the shared sample; its predictions say how many of how many, and why."""
        from cockpit.data.sampling import sample_meta

        examples, deadline = self.shared.next()

        def progress(done: int, total: int) -> None:
            self.events.write("eval_progress", system=name, done=done, total=total)
            print(f"[cockpit] eval {name}: {done}/{total}", flush=True)

        predictions, seconds = timed(
            lambda: classify(
                model,
                tokenizer,
                examples,
                self.profile.eval.max_think_tokens,
                progress=progress,
                keep_going=deadline,
            )
        )
        scored = [(p.tenant, str(p.id)) for p in predictions]
        self.shared.scored(scored)
        if len(predictions) < len(examples):  # the budget cut it: the sample is what was scored
            print(f"[cockpit] eval {name}: its share of the time budget is spent", flush=True)
            progress(len(predictions), len(predictions))
        sample = sample_meta(self.keys, scored, self.sample, self.budget_s, self.shared.cut)
        path = self.paths.prediction(name)
        write_predictions(path, predictions, {"system": name, **meta, "sample": sample})
        accuracy = sum(p.pred == p.gold for p in predictions) / max(1, len(predictions))
        self.events.write("eval_system", system=name, path=str(path), examples=len(predictions),
                          population=len(self.keys), by=sample["by"], accuracy=round(accuracy, 4),
                          seconds=round(seconds, 2))  # fmt: skip

    def load(self, model_dir: str) -> Any:
        """A base model spread over the GPUs here (`trainer.weights.placement`), saying where its layers
        went."""
        from trainer.model import load_base

        model = load_base(self.profile, model_dir, spread=True)
        placement = model.cockpit_load_facts.get("placement")
        if placement:
            print(f"[cockpit] eval placement of {model_dir}: {placement['summary']}", flush=True)
        from trainer.layers.linear4bit_rows import MIN_ROWS, ROWS

        layers = model.cockpit_load_facts.get("inference_layers") or {}
        print(f"[cockpit] eval layers: {layers.get('fused_rms_norms', 0)} fused RMSNorms, fused RoPE "
              f"{'on' if layers.get('fused_rope') else 'off'}, {layers.get('nf4_linear_rows', 0)} 4-bit "
              f"projections by the NF4 decode kernel on {MIN_ROWS}-{ROWS} rows", flush=True)  # fmt: skip
        return model

    def run(self, base: bool, adapter: Path | None, others: list[tuple[str, str]], serving: bool) -> None:
        from transformers import AutoTokenizer

        model_dir, population = self.examples()
        systems = (["base"] if base else []) + [n for n, _ in others] + (["finetuned"] if adapter else [])
        examples = self.draw(population, len(systems))
        self.events.write("eval_begin", systems=systems, examples=len(examples), population=len(population),
                          time_budget_s=self.budget_s, seed=self.sample.seed)  # fmt: skip
        for name, path in others:
            other = self.load(path)
            self.score(name, other, AutoTokenizer.from_pretrained(path), {"model": path})
            del other
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = self.load(model_dir)
        if base:
            self.score("base", model, tokenizer, {"model": model_dir})
        if adapter is not None:
            model = load_finetuned(model, Path(adapter))
            self.score("finetuned", model, tokenizer, {"model": model_dir, "adapter": str(adapter)})
            if serving:
                from trainer.evaluation.serving import measure

                stats = measure(model, tokenizer, [prompt_text(tokenizer, e) for e in examples])
                self.events.write("serving", system="finetuned", **stats)
        self.events.write("eval_end", systems=systems)
        self.events.close()


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m trainer.evaluation.evaluate", description=__doc__)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument(
        "--adapter", type=Path, help="LoRA adapter to score as 'finetuned' (default: the run's)"
    )
    parser.add_argument("--no-base", action="store_true", help="don't score the profile's base model")
    parser.add_argument("--no-adapter", action="store_true", help="don't score a fine-tuned adapter")
    parser.add_argument(
        "--model", action="append", default=[], metavar="NAME=PATH", help="another base model"
    )
    parser.add_argument("--no-serving", action="store_true", help="skip the serving-speed measurement")
    parser.add_argument("--examples", type=int, help="a stratified sample of this many (eval.examples)")
    parser.add_argument("--time-budget-s", type=float, help="seconds of scoring (eval.time_budget_s)")
    args = parser.parse_args(argv)
    evaluation = Evaluation(args.run_dir, args.examples, args.time_budget_s)
    adapter = None if args.no_adapter else (args.adapter or evaluation.paths.adapter)
    if adapter is not None and not (adapter / "adapter_config.json").is_file():
        adapter = None
    others = parse_named(args.model) + parse_named(list(evaluation.profile.eval.base_models))
    evaluation.run(not args.no_base, adapter, others, serving=not args.no_serving)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
