"""The HF Trainer's arguments for a profile: batch, schedule, precision, checkpoints, trackers and the
DeepSpeed config (registered as they are built, for `from_pretrained` to consult)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cockpit.profiles import Profile

# COCKPIT_BARE_TRAINER=1: no step events, no stop checks, no per-step logging (the overhead benchmark's
# control run; a real run never sets it).
BARE = os.environ.get("COCKPIT_BARE_TRAINER") == "1"


def training_arguments(
    profile: Profile,
    output_dir: Path,
    run_name: str,
    max_steps: int | None = None,
    save_steps: int | None = None,
) -> Any:
    """The HF TrainingArguments of a profile (registering its DeepSpeed config); `max_steps` and
    `save_steps` default to the profile's."""
    from transformers import TrainingArguments

    from trainer.distributed import cpu_ranks_accelerator_config
    from trainer.ds_config import deepspeed_config

    t = profile.training
    max_steps = t.max_steps if max_steps is None else max_steps
    save_steps = t.save_steps if save_steps is None else save_steps
    return TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=t.micro_batch_size,
        gradient_accumulation_steps=t.grad_accum,
        learning_rate=t.learning_rate,
        weight_decay=t.weight_decay,
        warmup_steps=t.warmup_ratio,
        lr_scheduler_type=t.lr_scheduler,
        num_train_epochs=t.epochs,
        max_steps=max_steps,
        max_grad_norm=t.max_grad_norm,
        logging_steps=10**9 if BARE else 1,
        logging_first_step=True,
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        save_total_limit=t.save_total_limit,
        bf16=t.bf16,
        seed=t.seed,
        deepspeed=deepspeed_config(profile),
        report_to=list(t.report_to),  # the user's trackers, beside the record (default: none)
        run_name=run_name,
        disable_tqdm=True,
        include_num_input_tokens_seen="non_padding",
        remove_unused_columns=False,
        dataloader_num_workers=0,
        accelerator_config=cpu_ranks_accelerator_config(),
    )
