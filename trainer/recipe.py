"""The training recipe: QLoRA fine-tuning under DeepSpeed ZeRO-3, profile in (the run's `run.json`), run
record out.

One recipe, in torchtune's shape: `setup` (the ops, the data, the model, the HF Trainer), `train`,
`save_checkpoint` (the run's adapter), `cleanup`; `run` goes through them and records an error in the
phase it came. A rehearsal is this recipe with a few steps over a sliced model
(`trainer.rehearsal.Rehearsal`): it overrides the hooks below, never branches in here.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from cockpit.profiles import Profile, parse_profile
from cockpit.record import EventWriter, RunPaths, load_manifest
from trainer.arguments import BARE, training_arguments
from trainer.distributed import rank_identity
from trainer.inputs.assets import resolve_assets, setup_words
from trainer.ops import build_ops

# COCKPIT_OVERHEAD_AB=N: the callbacks and per-step logging on and off in alternating blocks of N steps
# (`trainer.callbacks.AlternatingCallbacks`; the overhead benchmark's in-process control).
AB_BLOCK = int(os.environ.get("COCKPIT_OVERHEAD_AB") or 0)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


class Recipe:
    """QLoRA fine-tuning under DeepSpeed ZeRO-3, writing every fact to the run record."""

    random_layers: int | None = None  # the model's own weights, every layer (a rehearsal slices them)
    step_offset = 0  # step events numbered from 1 (a rehearsal's depths share one axis)

    def __init__(self, run_dir: Path, resume: bool) -> None:
        self.paths = RunPaths(run_dir)
        self.resume = resume
        manifest = load_manifest(run_dir)
        self.profile: Profile = parse_profile(manifest["profile"], str(self.paths.manifest))
        self.rank = _rank()
        self.events = EventWriter(self.paths.events(f"trainer-rank{self.rank}"), rank=self.rank)
        self.events.write("rank_start", pid=os.getpid(), **rank_identity().fields())
        self._dump_stacks_on_request()
        self.trainer: Any = None
        self.validation: Any = None  # the validation callback, when the run has a validation sample
        self.prepared: Any = None  # the checked and tokenized data (`trainer.inputs.data.PreparedData`)
        self._load_facts: dict[str, Any] = {}

    def _dump_stacks_on_request(self) -> None:
        """SIGUSR1 writes this rank's Python stacks to `stacks/rank<N>.txt` (faulthandler: even while the
        rank waits in C, in a collective); the supervisor asks when it judges a stall."""
        import faulthandler
        import signal

        path = self.paths.stack(self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._stacks = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the process's life
        faulthandler.register(signal.SIGUSR1, file=self._stacks, all_threads=True)

    def phase(self, name: str, **fields: Any) -> None:
        self.events.write("phase", phase=name, pid=os.getpid(), **fields)
        if self.rank == 0:
            words = f": {fields['message']}" if fields.get("message") else ""
            print(f"[cockpit] phase: {name}{words}", flush=True)

    def run(self) -> int:
        """Set up, train, save the adapter of a finished run, clean up; an exception is said in the record
        by this rank, then raised as ever (traceback, exit 1)."""
        try:
            self.setup()
            outcome = self.train()
            if outcome == "finished":
                self.save_checkpoint()
        except Exception as exc:
            self.error(exc)
            raise
        self.cleanup(outcome)
        return 0

    # --- what a rehearsal changes (`trainer.rehearsal`) ----------------------------------------------

    def steps(self) -> tuple[int, int]:
        """The optimizer steps to run and the checkpoint interval: the profile's."""
        return self.profile.training.max_steps, self.profile.training.save_steps

    def model_dir(self) -> str:
        """Where the model's config, weights and tokenizer are."""
        return resolve_assets(self.profile)[0]

    def load_tokenizer(self, model_dir: str) -> Any:
        """The model's tokenizer (a model without one cannot be trained on its data)."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model_dir)

    def reads_data(self) -> bool:
        """Whether the data file is read (it always is: the run trains on it)."""
        return True

    def rows_without_data(self, model_dir: str, data_file: Path) -> tuple[list[dict[str, list[int]]], str]:
        """Training rows where the data file or the tokenizer is not at hand: none, for a real run."""
        raise FileNotFoundError(f"{data_file}: no such data file")

    def validation_examples(self) -> int:
        """Validation examples a tenant to tokenize beside the training split (0: no validation)."""
        v = self.profile.validation
        return v.examples_per_tenant if v.eval_steps else 0

    # --- setup -------------------------------------------------------------------------------

    def training_args(self) -> Any:
        max_steps, save_steps = self.steps()
        return training_arguments(
            self.profile, self.paths.checkpoints, self.paths.run_id, max_steps, save_steps
        )

    def train_rows(self, model_dir: str, args: Any) -> tuple[list[dict[str, list[int]]], Any]:
        """The training rows (packed when the profile says so) and the tokenizer, if there is one.

        Real data is read, checked and tokenized once, by the main process of each host (`Dataset.map`'s
        cache file), while the other ranks wait; they then read the same cache.
        """
        from trainer.inputs import data as data_mod
        from trainer.inputs.packing import pack_rows, packing_efficiency

        t = self.profile.training
        _, data_file = resolve_assets(self.profile)
        tokenizer = self.load_tokenizer(model_dir)
        facts: dict[str, Any] = {}
        if tokenizer is not None and data_file.exists() and self.reads_data():
            prepared = self.prepare_data(tokenizer, data_file, args)
            rows = prepared.train.rows
            source = str(data_file)
            facts = data_mod.data_facts(prepared)
        else:
            rows, source = self.rows_without_data(model_dir, data_file)
        examples = len(rows)
        tokens = sum(len(r["input_ids"]) for r in rows)
        targets = sum(sum(1 for x in r["labels"][1:] if x != data_mod.IGNORE) for r in rows)
        if t.packing:
            rows = pack_rows(rows, t.seq_len, seed=t.seed)
        self.events.write(
            "data",
            source=source,
            examples=examples,
            tokens=tokens,
            target_fraction=round(targets / max(1, tokens), 4),
            rows=len(rows),
            packing=t.packing,
            fill=round(packing_efficiency(rows, t.seq_len), 4) if t.packing else None,
            rows_sha256=data_mod.rows_fingerprint(rows) if facts else None,
            **facts,
        )
        return rows, tokenizer

    def prepare_data(self, tokenizer: Any, data_file: Path, args: Any) -> Any:
        """Read, check and tokenize the data on each host's main process first; say what it found."""
        from cockpit.cache import cache_root
        from trainer.inputs import data as data_mod

        t = self.profile.training
        with args.main_process_first(local=True, desc="read and tokenize the data"):
            prepared = data_mod.prepare_data(
                tokenizer,
                data_file,
                self.profile.data,
                t.seq_len,
                self.validation_examples(),
                cache_root() / "datasets",
            )
        self.prepared = prepared
        train = prepared.train
        if self.rank == 0:
            how = "read from the cache" if train.reused else "tokenized"
            print(
                f"[cockpit] data: {len(train.rows):,} training examples of {data_file} "
                f"({prepared.dataset.format}), {how} in {train.seconds:.1f} s",
                flush=True,
            )
            if train.over_seq_len:
                lost = sum(1 for a in train.answer_cut if a)
                words = data_mod.over_seq_len_words(train.over_seq_len, len(train.rows), lost, t.seq_len)
                print(f"[cockpit] DATA WARNING: {words}", flush=True)
        return prepared

    def collator(self, tokenizer: Any) -> Any:
        from transformers import DataCollatorForSeq2Seq

        from trainer.inputs.data import IGNORE
        from trainer.inputs.packing import PackedCollator

        pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
        t = self.profile.training
        if t.packing:
            return PackedCollator(pad if pad is not None else 0, doc_lens=t.attention == "varlen")
        return DataCollatorForSeq2Seq(
            tokenizer, padding=True, label_pad_token_id=IGNORE, pad_to_multiple_of=8
        )

    def setup(self) -> None:
        from transformers import Trainer
        from transformers.trainer_callback import PrinterCallback

        from trainer import model as model_mod
        from trainer.callbacks import (
            AlternatingCallbacks,
            FaultInjectionCallback,
            ProfilerCallback,
            RecordCallback,
            StepClock,
            StopRequestCallback,
            memory_fields,
        )

        self.build_ops()  # before the TrainingArguments start DeepSpeed's communication (its shm op)
        self.phase("setup", message=setup_words(self.profile))
        model_dir = self.model_dir()
        # TrainingArguments first: it registers the DeepSpeed config that from_pretrained consults, and
        # sets up the ranks, so that the main process can tokenize the data before the others read it.
        args = self.training_args()
        train_set, tokenizer = self.train_rows(model_dir, args)

        self.phase(
            "load",
            model=model_dir,
            train_examples=len(train_set),
            message="loading the model",
            **memory_fields(),  # where the load starts from (`loaded` has them where it ends)
        )
        t0 = time.time()

        def layer_loaded(done: int, total: int) -> None:
            self.events.write("load_progress", layer=done, layers=total)

        base = model_mod.load_base(
            self.profile, model_dir, random_layers=self.random_layers, progress=layer_loaded
        )
        partitioned_at_load = any(hasattr(p, "ds_id") for p in base.parameters())
        training_facts = model_mod.configure_training(self.profile, base)
        model = model_mod.attach_lora(self.profile, base)
        self._load_facts = {
            "load_s": round(time.time() - t0, 2),
            "partitioned_at_load": partitioned_at_load,
            **getattr(base, "cockpit_load_facts", {}),
            **training_facts,
            "lean_lora": getattr(model, "cockpit_lean_lora", 0),
        }
        self.events.write("loaded", **self._load_facts, **memory_fields())
        self.model = model

        self.stop_callback = StopRequestCallback(self.paths.stop_request, self.events)
        self.clock = StepClock()  # the same clock with and without the cockpit: the overhead benchmark's
        record = RecordCallback(
            self.events, self.audit, self.samples_per_step(args), step_offset=self.step_offset
        )
        callbacks: list[Any] = [self.clock, record, self.stop_callback]
        if BARE:  # the speed benchmark's control: what the trainer costs without the cockpit's callbacks
            callbacks = [self.clock]
        elif AB_BLOCK:  # its in-process control: the callbacks on and off in alternating blocks of steps
            callbacks = [self.clock, AlternatingCallbacks(callbacks[1:], AB_BLOCK)]
        self.validation = self.validation_callback(tokenizer, record)
        if self.validation is not None:  # never in BARE runs (no data there: random tokens)
            callbacks.append(self.validation)
        fault = FaultInjectionCallback.from_env()
        if fault is not None:
            callbacks.append(fault)
        profiler = ProfilerCallback.from_env(self.events, self.paths.root / "profile")
        if profiler is not None:
            callbacks.append(profiler)
        self.trainer = Trainer(
            model=model,
            args=args,
            train_dataset=train_set,
            data_collator=self.collator(tokenizer),
            processing_class=tokenizer,
            callbacks=callbacks,
        )
        # Our step line says the same in one readable line; HF's printed dict would double the log.
        self.trainer.remove_callback(PrinterCallback)

    def validation_callback(self, tokenizer: Any, record: Any) -> Any:
        """Validation loss on the held-out sample every `validation.eval_steps`, if there is a sample."""
        from trainer.distributed import rank0_says
        from trainer.evaluation.best_adapter import AdapterKeeper
        from trainer.evaluation.validation import EarlyStopping, ValidationCallback, validation_batches

        prepared = self.prepared
        v, t = self.profile.validation, self.profile.training
        if prepared is None or prepared.val is None or not v.eval_steps or BARE:
            return None
        tenants = list(dict.fromkeys(prepared.val_tenants))
        groups = [tenants.index(name) for name in prepared.val_tenants]
        batches = validation_batches(
            prepared.val.rows, groups, t.seq_len, t.micro_batch_size, self.validation_collator(tokenizer)
        )
        facts = {
            "examples": len(groups),
            "target_tokens": sum(sum(1 for x in r["labels"][1:] if x >= 0) for r in prepared.val.rows),
            "split": prepared.val_source,
        }
        return ValidationCallback(
            self.events,
            batches,
            tenants,
            v.eval_steps,
            model=lambda: self.trainer.model_wrapped,
            chunked=bool(self._load_facts.get("chunked_loss")),
            early=EarlyStopping(v.early_stopping_patience, v.early_stopping_min_delta),
            facts=facts,
            pause_clock=record.exclude,
            keeper=AdapterKeeper(
                self.paths.best_adapter, self.save_adapter, self.events, self.rank, agree=rank0_says
            ),
            log=lambda logs: self.trainer.log(logs),  # to the trackers of training.report_to too
        )

    def validation_collator(self, tokenizer: Any) -> Any:
        """Validation rows are always packed (the loss of each example is the same either way)."""
        from trainer.inputs.packing import PackedCollator

        pad = getattr(tokenizer, "pad_token_id", None)
        return PackedCollator(
            pad if pad is not None else 0, doc_lens=self.profile.training.attention == "varlen"
        )

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
    def build_ops(self) -> None:
        """Load the DeepSpeed ops the run uses, each compile its own `build` phase said first: a compile
        takes minutes on a fresh environment."""
        build_ops(self.profile, self.phase)

    def train(self) -> str:
        """Train to the end or to a stop request; returns `finished` or `stopped`."""
        from cockpit.record.checkpoints import last_complete_checkpoint

        checkpoint = None
        if self.resume:
            checkpoint, incomplete = last_complete_checkpoint(self.paths.checkpoints)
            for path in incomplete:
                print(f"[cockpit] skipping incomplete checkpoint {path} (no trainer_state.json)", flush=True)
            self.events.write(
                "resume", checkpoint=checkpoint, skipped_incomplete=[str(p) for p in incomplete]
            )
        # Until `train_begin` the Trainer builds the DeepSpeed engine (partitioning, the optimizer).
        self.phase("train", message="building the DeepSpeed engine")
        result = self.trainer.train(resume_from_checkpoint=checkpoint)
        self.events.write(
            "train_end",
            train_runtime_s=result.metrics.get("train_runtime"),
            steps=self.trainer.state.global_step,
            tokens=self.trainer.state.num_input_tokens_seen,
            bare=BARE,
            step_times_s=self.clock.step_times(),
        )
        return "stopped" if self.stop_callback.stopped_at is not None else "finished"

    def save_checkpoint(self) -> None:
        """The run's adapter: the best one (lowest validation loss) when validation ran, else the last
        (`trainer.evaluation.best_adapter`)."""
        self.phase("save")
        keeper = getattr(self.validation, "keeper", None)
        last = self.trainer.state.global_step
        if keeper is None:
            self.save_adapter(self.paths.adapter)
            fields: dict[str, Any] = {"step": last}
        else:
            fields = keeper.finish(last, self.paths.adapter, self.paths.last_adapter)
        if self.rank == 0:  # how to use it outside the cockpit, over PEFT's template
            from trainer.model_card import write_model_card

            for folder in (self.paths.adapter, self.paths.last_adapter):
                if folder.is_dir():
                    write_model_card(folder, self.profile, self.model_dir(), self.paths.run_id)
        self.events.write("adapter", path=str(self.paths.adapter), **fields)

    def save_adapter(self, folder: Path) -> None:
        """Save the adapter into `folder`: every rank calls it (ZeRO-3 gathers the LoRA weights), rank 0
        writes. The experts' LoRA goes beside PEFT's."""
        self.trainer.save_model(str(folder))
        if self.profile.lora.target_experts:
            self.save_expert_lora(folder)

    def save_expert_lora(self, folder: Path) -> None:
        """PEFT saves only its own layers: the expert LoRA goes beside them, gathered from ZeRO-3."""
        from safetensors.torch import save_file

        from trainer.layers.experts_model import expert_lora_state_dict

        params = [p for n, p in self.model.named_parameters() if ".experts.lora_" in n]
        gather: Any = contextlib.nullcontext()
        if any(hasattr(p, "ds_id") for p in params):
            import deepspeed

            gather = deepspeed.zero.GatheredParameters(params, modifier_rank=None)
        with gather:
            state = expert_lora_state_dict(self.model) if self.rank == 0 else {}
        if self.rank == 0:
            path = Path(folder) / "expert_lora.safetensors"
            lora = self.profile.lora
            save_file(state, str(path), metadata={"r": str(lora.r), "alpha": str(lora.alpha)})
            self.events.write("expert_adapter", path=str(path), tensors=len(state))

    def error(self, exc: BaseException) -> None:
        """An `error` event: this rank's exception, type and message, in the phase it came."""
        message = str(exc).strip().splitlines()
        with contextlib.suppress(OSError):
            self.events.write(
                "error",
                type=type(exc).__name__,
                message=(message[0] if message else "")[:300],
                step=self.trainer.state.global_step if self.trainer is not None else None,
            )
            self.events.sync()

    def cleanup(self, outcome: str) -> None:
        self.events.write(
            "trainer_end", outcome=outcome, step=self.trainer.state.global_step if self.trainer else 0
        )
        self.events.sync()
        self.events.close()
