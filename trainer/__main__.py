"""The training process: profile in (from the run's `run.json`), run record out.

Launched once per rank by `python -m deepspeed.launcher.runner ... --module trainer --run-dir DIR`.
One recipe: `setup` (assets, data, model, Trainer), `train`, `save`, `cleanup`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from cockpit.profiles import BUILTIN_PREFIX, Profile, parse_profile
from cockpit.record import EventWriter, RunPaths, load_manifest


def resolve_assets(profile: Profile) -> tuple[str, Path]:
    """The model directory and data file of a profile, building the built-in ones if needed."""
    from trainer import tiny

    model_dir = (
        str(tiny.model_path(seed=0)) if profile.model.path.startswith(BUILTIN_PREFIX) else profile.model.path
    )
    data = profile.data
    if data.source.startswith(BUILTIN_PREFIX):
        return model_dir, tiny.data_path(
            data.seed, data.train_examples_per_tenant, data.eval_examples_per_tenant
        )
    return model_dir, Path(data.source)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


class Recipe:
    """QLoRA fine-tuning under DeepSpeed ZeRO-3, writing every fact to the run record."""

    def __init__(self, run_dir: Path, resume: bool) -> None:
        self.paths = RunPaths(run_dir)
        self.resume = resume
        manifest = load_manifest(run_dir)
        self.profile: Profile = parse_profile(manifest["profile"], str(self.paths.manifest))
        self.rank = _rank()
        self.events = EventWriter(self.paths.events(f"trainer-rank{self.rank}"), rank=self.rank)
        self.trainer: Any = None
        self._load_facts: dict[str, Any] = {}

    def phase(self, name: str, **fields: Any) -> None:
        self.events.write("phase", phase=name, pid=os.getpid(), **fields)
        if self.rank == 0:
            print(f"[cockpit] phase: {name}", flush=True)

    # --- setup -------------------------------------------------------------------------------

    def training_args(self) -> Any:
        from transformers import TrainingArguments

        from trainer.ds_config import deepspeed_config

        t = self.profile.training
        return TrainingArguments(
            output_dir=str(self.paths.checkpoints),
            per_device_train_batch_size=t.micro_batch_size,
            gradient_accumulation_steps=t.grad_accum,
            learning_rate=t.learning_rate,
            weight_decay=t.weight_decay,
            warmup_steps=t.warmup_ratio,
            lr_scheduler_type=t.lr_scheduler,
            num_train_epochs=t.epochs,
            max_steps=t.max_steps,
            max_grad_norm=t.max_grad_norm,
            logging_steps=1,
            logging_first_step=True,
            save_strategy="steps" if t.save_steps else "no",
            save_steps=t.save_steps or 500,
            save_total_limit=t.save_total_limit,
            bf16=t.bf16,
            seed=t.seed,
            deepspeed=deepspeed_config(self.profile),
            report_to=[],
            disable_tqdm=True,
            include_num_input_tokens_seen="non_padding",
            remove_unused_columns=False,
            dataloader_num_workers=0,
        )

    def setup(self) -> None:
        from transformers import AutoTokenizer, DataCollatorForSeq2Seq, Trainer
        from transformers.trainer_callback import PrinterCallback

        from trainer import data as data_mod
        from trainer import model as model_mod
        from trainer.callbacks import (
            FaultInjectionCallback,
            RecordCallback,
            StopRequestCallback,
            memory_fields,
        )

        self.phase("setup")
        model_dir, data_file = resolve_assets(self.profile)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        examples = data_mod.load_examples(data_file)
        train_set = data_mod.train_dataset(tokenizer, examples, self.profile.training.seq_len)
        # TrainingArguments first: it registers the DeepSpeed config that from_pretrained consults.
        args = self.training_args()

        self.phase("load", model=model_dir, train_examples=len(train_set))
        t0 = time.time()
        base = model_mod.load_base(self.profile, model_dir)
        partitioned_at_load = any(hasattr(p, "ds_id") for p in base.parameters())
        model = model_mod.attach_lora(self.profile, base)
        self._load_facts = {
            "load_s": round(time.time() - t0, 2),
            "partitioned_at_load": partitioned_at_load,
            **getattr(base, "cockpit_load_facts", {}),
        }
        self.events.write("loaded", **self._load_facts, **memory_fields())
        self.model = model

        callbacks: list[Any] = [
            RecordCallback(self.events, self.audit, self.samples_per_step(args)),
            StopRequestCallback(self.paths.stop_request, self.events),
        ]
        fault = FaultInjectionCallback.from_env()
        if fault is not None:
            callbacks.append(fault)
        self.stop_callback = callbacks[1]
        self.trainer = Trainer(
            model=model,
            args=args,
            train_dataset=train_set,
            data_collator=DataCollatorForSeq2Seq(
                tokenizer, padding=True, label_pad_token_id=-100, pad_to_multiple_of=8
            ),
            callbacks=callbacks,
        )
        # Our step line says the same in one readable line; HF's printed dict would double the log.
        self.trainer.remove_callback(PrinterCallback)

    def samples_per_step(self, args: Any) -> int:
        return args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size

    def audit(self) -> dict[str, Any]:
        """Called by the callback once the DeepSpeed engine exists."""
        from trainer import model as model_mod
        from trainer.audit import EngineFacts, build_audit

        engine = getattr(self.trainer, "model_wrapped", None)
        facts = EngineFacts(None, None, None, False)
        if engine is not None and hasattr(engine, "zero_optimization_stage"):

            def device(section: Any) -> str:
                return "none" if section is None else str(getattr(section.device, "value", section.device))

            facts = EngineFacts(
                zero_stage=int(engine.zero_optimization_stage()),
                offload_param=device(engine.zero_offload_param()),
                offload_optimizer=device(engine.zero_offload_optimizer()),
                params_partitioned=any(hasattr(p, "ds_tensor") for p in engine.module.parameters()),
            )
        return build_audit(
            self.profile,
            model_mod.parameter_census(self.model),
            model_mod.lora_matches(self.model, list(self.profile.lora.target_modules)),
            facts,
            self._load_facts.get("partitioned_at_load", False),
            bool(getattr(self.model, "is_gradient_checkpointing", False)),
        )

    # --- train and save ------------------------------------------------------------------------
    def train(self) -> str:
        """Train to the end or to a stop request; returns `finished` or `stopped`."""
        from trainer.checkpoints import last_complete_checkpoint

        checkpoint = None
        if self.resume:
            checkpoint, incomplete = last_complete_checkpoint(self.paths.checkpoints)
            for path in incomplete:
                print(f"[cockpit] skipping incomplete checkpoint {path} (no trainer_state.json)", flush=True)
            self.events.write(
                "resume", checkpoint=checkpoint, skipped_incomplete=[str(p) for p in incomplete]
            )
        self.phase("train")
        self.trainer.train(resume_from_checkpoint=checkpoint)
        return "stopped" if self.stop_callback.stopped_at is not None else "finished"

    def save(self) -> None:
        self.phase("save")
        self.trainer.save_model(str(self.paths.adapter))
        if self.profile.lora.target_experts:
            self.save_expert_lora()
        self.events.write("adapter", path=str(self.paths.adapter), step=self.trainer.state.global_step)

    def save_expert_lora(self) -> None:
        """PEFT saves only its own layers: the expert LoRA goes beside them, gathered from ZeRO-3."""
        import contextlib

        from safetensors.torch import save_file

        from trainer.experts4bit import expert_lora_state_dict

        params = [p for n, p in self.model.named_parameters() if ".experts.lora_" in n]
        gather: Any = contextlib.nullcontext()
        if any(hasattr(p, "ds_id") for p in params):
            import deepspeed

            gather = deepspeed.zero.GatheredParameters(params, modifier_rank=None)
        with gather:
            state = expert_lora_state_dict(self.model) if self.rank == 0 else {}
        if self.rank == 0:
            path = self.paths.adapter / "expert_lora.safetensors"
            lora = self.profile.lora
            save_file(state, str(path), metadata={"r": str(lora.r), "alpha": str(lora.alpha)})
            self.events.write("expert_adapter", path=str(path), tensors=len(state))

    def cleanup(self, outcome: str) -> None:
        self.events.write(
            "trainer_end", outcome=outcome, step=self.trainer.state.global_step if self.trainer else 0
        )
        self.events.sync()
        self.events.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__)
    parser.add_argument("--run-dir", required=True, type=Path, help="the run directory (holds run.json)")
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    args, _unknown = parser.parse_known_args(argv)  # the launcher may append --local_rank
    recipe = Recipe(args.run_dir, args.resume)
    recipe.setup()
    outcome = recipe.train()
    if outcome == "finished":
        recipe.save()
    recipe.cleanup(outcome)
    return 0


if __name__ == "__main__":
    sys.exit(main())
