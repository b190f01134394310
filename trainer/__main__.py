"""The training process: profile in (from the run's `run.json`), run record out.

Launched once per rank by `python -m deepspeed.launcher.runner ... --module trainer --run-dir DIR`.
One recipe: `setup` (assets, data, model, Trainer), `train`, `save`, `cleanup`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cockpit.profiles import BUILTIN_PREFIX, Profile, parse_profile
from cockpit.record import EventWriter, RunPaths, load_manifest
from trainer.distributed import rank_identity


def setup_words(profile: Profile) -> str:
    """What the setup phase does, for the viewers: the built-in assets are built on a first run."""
    from trainer import tiny

    d = profile.data
    builtin = profile.model.path.startswith(BUILTIN_PREFIX) or d.source.startswith(BUILTIN_PREFIX)
    if builtin and not tiny.built(d.seed, d.train_examples_per_tenant, d.eval_examples_per_tenant):
        return "building the built-in model, tokenizer and data (first run; cached after)"
    return "reading and tokenizing the training data"


def resolve_assets(profile: Profile) -> tuple[str, Path]:
    """The model directory and data file of a profile, building the built-in ones if needed."""
    from cockpit.data import builtin
    from trainer import tiny

    model_dir = (
        str(tiny.model_path(seed=0)) if profile.model.path.startswith(BUILTIN_PREFIX) else profile.model.path
    )
    data = profile.data
    if data.source.startswith(BUILTIN_PREFIX):
        return model_dir, builtin.data_path(
            data.seed, data.train_examples_per_tenant, data.eval_examples_per_tenant
        )
    return model_dir, Path(data.source)


# COCKPIT_BARE_TRAINER=1: no step events, no stop checks, no per-step logging (the overhead benchmark's
# control run; a real run never sets it).
BARE = os.environ.get("COCKPIT_BARE_TRAINER") == "1"
# COCKPIT_OVERHEAD_AB=N: the callbacks and per-step logging on and off in alternating blocks of N steps
# (`trainer.callbacks.AlternatingCallbacks`; the overhead benchmark's in-process control).
AB_BLOCK = int(os.environ.get("COCKPIT_OVERHEAD_AB") or 0)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


@dataclass(frozen=True)
class Rehearsal:
    """A rehearsal depth: the profile's architecture sliced to `layers`, random weights, `steps` steps.

    Its step events are numbered after `step_offset` (the steps of the depths before it), so one record
    holds every depth on one axis.
    """

    layers: int
    steps: int
    step_offset: int = 0


class Recipe:
    """QLoRA fine-tuning under DeepSpeed ZeRO-3, writing every fact to the run record."""

    def __init__(self, run_dir: Path, resume: bool, rehearsal: Rehearsal | None = None) -> None:
        self.paths = RunPaths(run_dir)
        self.resume = resume
        self.rehearsal = rehearsal
        manifest = load_manifest(run_dir)
        self.profile: Profile = parse_profile(manifest["profile"], str(self.paths.manifest))
        self.rank = _rank()
        self.events = EventWriter(self.paths.events(f"trainer-rank{self.rank}"), rank=self.rank)
        self.events.write("rank_start", pid=os.getpid(), **rank_identity().fields())
        self._dump_stacks_on_request()
        self.trainer: Any = None
        self.validation: Any = None  # the validation callback, when the run has a validation sample
        self.prepared: Any = None  # the checked and tokenized data (`trainer.data.PreparedData`)
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

    # --- setup -------------------------------------------------------------------------------

    def training_args(self) -> Any:
        from transformers import TrainingArguments

        from trainer.distributed import cpu_ranks_accelerator_config
        from trainer.ds_config import deepspeed_config

        t = self.profile.training
        max_steps, save_steps = t.max_steps, t.save_steps
        if self.rehearsal is not None:  # a few steps, then one checkpoint (its save is timed)
            max_steps = save_steps = self.rehearsal.steps
        return TrainingArguments(
            output_dir=str(self.paths.checkpoints),
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
            deepspeed=deepspeed_config(self.profile),
            report_to=list(t.report_to),  # the user's trackers, beside the record (default: none)
            run_name=self.paths.run_id,
            disable_tqdm=True,
            include_num_input_tokens_seen="non_padding",
            remove_unused_columns=False,
            dataloader_num_workers=0,
            accelerator_config=cpu_ranks_accelerator_config(),
        )

    def model_dir(self) -> str:
        """Where the model's config (and, outside a rehearsal, its weights and tokenizer) are.

        A rehearsal needs only the config: `model.config` when `model.path` is not on this machine.
        """
        model_dir, _ = resolve_assets(self.profile)
        here = (Path(model_dir) / "config.json").is_file()
        if self.rehearsal is not None and not here and self.profile.model.config:
            return str(Path(self.profile.model.config).parent)
        return model_dir

    def train_rows(self, model_dir: str, args: Any) -> tuple[list[dict[str, list[int]]], Any]:
        """The training rows (packed when the profile says so) and the tokenizer, if there is one.

        Real data is read, checked and tokenized once, by the main process of each host (`Dataset.map`'s
        cache file), while the other ranks wait; they then read the same cache. A rehearsal uses the real
        examples when the data file and tokenizer are here, else random-token examples of
        `data.mean_tokens` (else `seq_len`) tokens: enough for its steps, and packed, as many as
        `data.examples` says the real data holds, so its rows are as full as the real run's. That path
        never imports `datasets`.
        """
        from transformers import AutoConfig, AutoTokenizer

        from trainer import data as data_mod
        from trainer.packing import pack_rows, packing_efficiency

        t, d = self.profile.training, self.profile.data
        _, data_file = resolve_assets(self.profile)
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
        except (OSError, ValueError):
            if self.rehearsal is None:
                raise
            tokenizer = None
        facts: dict[str, Any] = {}
        # A rehearsal where `datasets` is not installed (a GPU machine set up for benchmarks) rehearses on
        # random tokens rather than fail.
        readable = self.rehearsal is None or importlib.util.find_spec("datasets") is not None
        if tokenizer is not None and data_file.exists() and readable:
            prepared = self.prepare_data(tokenizer, data_file, args)
            rows = prepared.train.rows
            source = str(data_file)
            facts = self.data_facts(prepared)
        elif self.rehearsal is not None:
            vocab = AutoConfig.from_pretrained(model_dir).get_text_config().vocab_size
            mean = d.mean_tokens or t.seq_len
            per_row = max(1, t.seq_len // mean) if t.packing else 1
            count = (
                t.micro_batch_size * t.grad_accum * self.profile.world_size * self.rehearsal.steps * per_row
            )
            spread = 0.5 if d.mean_tokens else 0.0  # no mean given: every example fills a sequence
            if t.packing:  # pack as many examples as the data holds: its rows fill as the real run's do
                count = max(2 * count, d.examples)
            else:
                count *= 2
            rows = data_mod.synthetic_rows(vocab, count, mean, t.seq_len, seed=t.seed, spread=spread)
            source = f"random tokens, {mean} a mean example" + (" (±50%)" if spread else "")
        else:
            raise FileNotFoundError(f"{data_file}: no such data file")
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
        from trainer import data as data_mod

        t, v = self.profile.training, self.profile.validation
        val_per_tenant = v.examples_per_tenant if v.eval_steps and self.rehearsal is None else 0
        with args.main_process_first(local=True, desc="read and tokenize the data"):
            prepared = data_mod.prepare_data(
                tokenizer, data_file, self.profile.data, t.seq_len, val_per_tenant, cache_root() / "datasets"
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
                words = over_seq_len_words(train.over_seq_len, len(train.rows), lost, t.seq_len)
                print(f"[cockpit] DATA WARNING: {words}", flush=True)
        return prepared

    @staticmethod
    def data_facts(prepared: Any) -> dict[str, Any]:
        """The data event's fields about the user's data: format, splits, cuts, tokenization."""
        train, ds = prepared.train, prepared.dataset
        return {
            "format": ds.format,
            "split_from": ds.split_from,
            "eval_examples": len(ds.split("eval")),
            "val_examples": len(prepared.val_tenants),
            "val_split": prepared.val_source or None,
            "over_seq_len": train.over_seq_len,
            "answer_cut": sum(1 for a in train.answer_cut if a),
            "tokenize_s": round(train.seconds, 3),
            "tokenize_cache": "reused" if train.reused else "built",
            "data_sha256": ds.fingerprint(),
        }

    def collator(self, tokenizer: Any) -> Any:
        from transformers import DataCollatorForSeq2Seq

        from trainer.data import IGNORE
        from trainer.packing import PackedCollator

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
        layers = self.rehearsal.layers if self.rehearsal is not None else None

        def layer_loaded(done: int, total: int) -> None:
            self.events.write("load_progress", layer=done, layers=total)

        base = model_mod.load_base(self.profile, model_dir, random_layers=layers, progress=layer_loaded)
        partitioned_at_load = any(hasattr(p, "ds_id") for p in base.parameters())
        training_facts = model_mod.configure_training(self.profile, base)
        model = model_mod.attach_lora(self.profile, base)
        self._load_facts = {
            "load_s": round(time.time() - t0, 2),
            "partitioned_at_load": partitioned_at_load,
            **getattr(base, "cockpit_load_facts", {}),
            **training_facts,
        }
        self.events.write("loaded", **self._load_facts, **memory_fields())
        self.model = model

        self.stop_callback = StopRequestCallback(self.paths.stop_request, self.events)
        self.clock = StepClock()  # the same clock with and without the cockpit: the overhead benchmark's
        record = RecordCallback(
            self.events,
            self.audit,
            self.samples_per_step(args),
            step_offset=self.rehearsal.step_offset if self.rehearsal else 0,
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
        from trainer.best_adapter import AdapterKeeper
        from trainer.distributed import rank0_says
        from trainer.validation import EarlyStopping, ValidationCallback, validation_batches

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
        from trainer.packing import PackedCollator

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

    def save(self) -> None:
        """The run's adapter: the best one (lowest validation loss) when validation ran, else the last
        (`trainer.best_adapter`)."""
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


def over_seq_len_words(count: int, total: int, answer_cut: int, seq_len: int) -> str:
    """What happens to examples longer than `seq_len`, in one sentence."""
    lost = f"; {answer_cut:,} of them lose answer tokens, their label among them" if answer_cut else ""
    return (
        f"{count:,} of {total:,} training examples are longer than training.seq_len {seq_len}: the start "
        f"of their prompt is cut to fit{lost} (`cockpit data` shows the lengths)"
    )


def build_ops(profile: Profile, phase: Callable[..., None]) -> list[str]:
    """Load every DeepSpeed op `profile`'s run uses (`dsops.ensure_ops`), so that nothing compiles later
    inside another phase: each compile, a wait for another process's build or a stale lock removed is its
    own `build` phase, said before it happens. Returns the ops compiled. DeepSpeed then reuses the loaded
    ops."""
    from cockpit.ops import dsops

    def announce(state: dsops.OpState, words: str) -> None:
        phase("build", ops=[state.name], message=words, cache=state.where)

    def leave(signum: int, _frame: Any) -> None:  # a stop while building: unwind, so torch drops its lock
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, leave)
    except ValueError:  # not the main thread: DeepSpeed's own handling
        previous = None
    try:
        return [state.name for state in dsops.ensure_ops(profile, announce)]
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__)
    parser.add_argument("--run-dir", required=True, type=Path, help="the run directory (holds run.json)")
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    parser.add_argument(
        "--rehearse-layers", type=int, help="a rehearsal: the architecture sliced to N layers, random weights"
    )
    parser.add_argument("--rehearse-steps", type=int, default=6, help="steps of a rehearsal depth")
    parser.add_argument(
        "--step-offset", type=int, default=0, help="steps of the rehearsal depths before this one"
    )
    args, _unknown = parser.parse_known_args(argv)  # the launcher may append --local_rank
    rehearsal = None
    if args.rehearse_layers is not None:
        rehearsal = Rehearsal(args.rehearse_layers, args.rehearse_steps, args.step_offset)
    recipe = Recipe(args.run_dir, args.resume, rehearsal)
    try:
        recipe.setup()
        outcome = recipe.train()
        if outcome == "finished" and rehearsal is None:
            recipe.save()
    except Exception as exc:  # said in the record, by this rank, then raised as ever (traceback, exit 1)
        recipe.error(exc)
        raise
    recipe.cleanup(outcome)
    return 0


if __name__ == "__main__":
    sys.exit(main())
