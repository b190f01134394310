"""A few steps of plain `transformers.Trainer`, outside the cockpit: the foreign run the import tests read.

    python tests/plain_hf_run.py OUTPUT_DIR [--lr 1e-3] [--steps 8] > console.log 2>&1

A random-init Qwen3-MoE shaped like the cockpit's tiny model (`cockpit.contract.TINY_MODEL`, built in
memory: nothing is downloaded) trains on random token rows on the CPU, with the Trainer's own
console output (tqdm bar and log dicts), an evaluation every few steps, and checkpoints whose
`trainer_state.json` hold the log history. It takes a few seconds.
"""

from __future__ import annotations

import argparse

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM, Trainer, TrainingArguments

from cockpit.contract import TINY_MODEL


class Rows(torch.utils.data.Dataset):
    """Random token rows (a fixed seed): causal LM inputs that are their own labels."""

    def __init__(self, n: int, length: int, vocab: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = Qwen3MoeConfig(**{**TINY_MODEL, "num_hidden_layers": 1, "vocab_size": 256})
    model = Qwen3MoeForCausalLM(config)
    training = TrainingArguments(
        output_dir=args.output_dir,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        learning_rate=args.lr,
        max_steps=args.steps,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=4,
        save_strategy="steps",
        save_steps=4,
        report_to=[],
        include_num_input_tokens_seen="all",
        use_cpu=True,
        dataloader_num_workers=0,
        seed=0,
    )
    vocab = config.vocab_size
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=Rows(64, 32, vocab, seed=1),
        eval_dataset=Rows(8, 32, vocab, seed=2),
    )
    trainer.train()


if __name__ == "__main__":
    main()
