"""A rehearsal depth: the training recipe over the profile's architecture sliced to a few layers of random
weights, for a few steps and one timed checkpoint, so that `cockpit rehearse` measures what a step, a load
and a save cost before the real run (`cockpit.rehearse`).

It is `trainer.recipe.Recipe` with the hooks that differ overridden: the steps, where the model's config
comes from, a tokenizer and data that may be missing (random tokens then), no validation during the steps
and no adapter. After the steps, a validation pass's forwards are timed on the trained slice
(`trainer.evaluation.validation.time_forwards`: a `rehearse_validation` event), and where its depth asks
(`Depth.eval_tokens`), the evaluation on the same slice (`trainer.evaluation.eval_timing`: a `rehearse_eval`
event); a depth of no steps times only the evaluation.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.recipe import Recipe

VALIDATION_ROUNDS = 3  # forwards a rank timed after its first (which warms the path up, timed apart)


@dataclass(frozen=True)
class Depth:
    """A rehearsal depth: the profile's architecture sliced to `layers`, random weights, `steps` steps.

    Its step events are numbered after `step_offset` (the steps of the depths before it), so one record
    holds every depth on one axis. `eval_tokens`: new tokens of each timed thinking batch after the steps
    (0: evaluation not timed); with no `steps`, only the evaluation is timed.
    """

    layers: int
    steps: int
    step_offset: int = 0
    eval_tokens: int = 0


class Rehearsal(Recipe):
    """The recipe for one rehearsal depth."""

    def __init__(self, run_dir: Path, resume: bool, depth: Depth) -> None:
        super().__init__(run_dir, resume)
        self.depth = depth
        self.random_layers = depth.layers
        self.step_offset = depth.step_offset
        self.prompt_tokens: float | None = None  # the training rows' mean prompt (evaluation's prompts)
        self.examples: list[dict[str, list[int]]] = []  # the training examples, unpacked (validation's)

    def setup(self) -> None:
        """The recipe's setup, unless the depth only times the evaluation."""
        if self.depth.steps:
            super().setup()

    def train(self) -> str:
        """The recipe's steps (none where the depth only times the evaluation)."""
        return super().train() if self.depth.steps else "finished"

    def steps(self) -> tuple[int, int]:
        """A few steps, then one checkpoint (its save is timed)."""
        return self.depth.steps, self.depth.steps

    def model_dir(self) -> str:
        """A rehearsal needs only the model's config: `model.config`'s folder when `model.path` is not on
        this machine."""
        model_dir = super().model_dir()
        if not (Path(model_dir) / "config.json").is_file() and self.profile.model.config:
            return str(Path(self.profile.model.config).parent)
        return model_dir

    def load_tokenizer(self, model_dir: str) -> Any:
        """The model's tokenizer, or None where it is not here (random tokens need none)."""
        try:
            return super().load_tokenizer(model_dir)
        except (OSError, ValueError):
            return None

    def reads_data(self) -> bool:
        """Where `datasets` is not installed (a GPU machine set up for benchmarks) a rehearsal rehearses on
        random tokens rather than fail; that path never imports `datasets`."""
        return importlib.util.find_spec("datasets") is not None

    def rows_without_data(self, model_dir: str, data_file: Path) -> tuple[list[dict[str, list[int]]], str]:
        """Random-token examples of `data.mean_tokens` (else `seq_len`) tokens: enough for the steps, and
        packed, as many as `data.examples` says the real data holds, so its rows are as full as the real
        run's."""
        from transformers import AutoConfig

        from trainer.evaluation.eval_timing import prompt_tokens
        from trainer.inputs.data import synthetic_rows

        t, d = self.profile.training, self.profile.data
        vocab = AutoConfig.from_pretrained(model_dir).get_text_config().vocab_size
        mean = d.mean_tokens or t.seq_len
        per_row = max(1, t.seq_len // mean) if t.packing else 1
        count = t.micro_batch_size * t.grad_accum * self.profile.world_size * self.depth.steps * per_row
        spread = 0.5 if d.mean_tokens else 0.0  # no mean given: every example fills a sequence
        if t.packing:  # pack as many examples as the data holds: its rows fill as the real run's do
            count = max(2 * count, d.examples)
        else:
            count *= 2
        rows = synthetic_rows(vocab, count, mean, t.seq_len, seed=t.seed, spread=spread)
        self.prompt_tokens = prompt_tokens(rows)
        self.examples = rows
        return rows, f"random tokens, {mean} a mean example" + (" (±50%)" if spread else "")

    def prepare_data(self, tokenizer: Any, data_file: Path, args: Any) -> Any:
        """The recipe's data; its rows' mean prompt is what evaluation's prompts are timed at."""
        from trainer.evaluation.eval_timing import prompt_tokens

        prepared = super().prepare_data(tokenizer, data_file, args)
        self.prompt_tokens = prompt_tokens(prepared.train.rows)
        self.examples = prepared.train.rows
        return prepared

    def validation_examples(self) -> int:
        """None: a rehearsal measures training steps (a validation pass's forwards are timed after them)."""
        return 0

    def save_checkpoint(self) -> None:
        """No adapter: random weights teach nothing (the checkpoint at the last step was timed). Instead,
        a validation pass's forwards are timed (after steps: a depth that only times the evaluation trained
        no model), then, where the depth asks, the evaluation on the slice."""
        if self.depth.steps:
            self.time_validation()
        if self.depth.eval_tokens:
            self.time_evaluation()

    def time_validation(self) -> None:
        """A validation pass's forwards on the slice as it trained (ZeRO-3, offload and the chunked head as
        the run's validation has them), over micro-batches packed from the training examples as the real
        validation packs its sample, whole micro-batches only (`trainer.evaluation.validation.time_forwards`):
        a `rehearse_validation` event, where the examples fill two rounds of them or more."""
        from trainer.evaluation.validation import time_forwards, validation_batches

        t = self.profile.training
        world = max(1, self.trainer.args.world_size)
        wanted = world * (1 + VALIDATION_ROUNDS) * t.micro_batch_size * t.seq_len  # tokens to fill them
        rows, tokens = [], 0
        for row in self.examples:
            if tokens >= wanted:
                break
            rows.append(row)
            tokens += len(row["input_ids"])
        if not rows:
            return
        collator = self.validation_collator(self.trainer.processing_class)
        batches = validation_batches(rows, [0] * len(rows), t.seq_len, t.micro_batch_size, collator)
        whole = [b for b in batches if b["input_ids"].shape[0] == t.micro_batch_size]
        timed = time_forwards(
            self.trainer.model_wrapped,
            whole[: world * (1 + VALIDATION_ROUNDS)],
            self.trainer.args.device,
            bool(self._load_facts.get("chunked_loss")),
            self.trainer.args.process_index,
            world,
        )
        if self.rank == 0 and timed is not None:
            self.events.write("rehearse_validation", layers=self.depth.layers, **timed)

    def time_evaluation(self) -> None:
        """Training's memory freed on every rank, then rank 0 loads the slice as evaluation loads it (over
        the GPUs here) and times it (`trainer.evaluation.eval_timing`): a `rehearse_eval` event."""
        from cockpit.contract import PROMPT_FRACTION
        from trainer.evaluation.eval_timing import release_training, time_evaluation

        release_training(self)
        if self.rank != 0:
            return
        layers = self.depth.layers
        self.phase("eval", message=f"timing evaluation on the {layers}-layer slice (random weights)")
        t = self.profile.training
        prompt = self.prompt_tokens
        if prompt is None:  # no steps ran: the prompts random tokens would have
            mean = min(t.seq_len, self.profile.data.mean_tokens or t.seq_len)
            prompt = mean * PROMPT_FRACTION
        fields = time_evaluation(
            self.profile, self.model_dir(), layers, round(prompt), self.depth.eval_tokens
        )
        self.events.write("rehearse_eval", **fields)
