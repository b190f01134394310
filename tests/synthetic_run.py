"""Synthetic run records for the app's tests, pictures and benchmarks: every event written through the
record's own writer (`cockpit.record.EventWriter`) on a clock of our own, so a record of any moment of
a run (loading, training, evaluating, stopped, reported) is made in a fraction of a second, the same
every time.

    run = SyntheticRun(tmp_path)          # a tiny-cpu run, status running, nothing written yet
    run.start().setup().load(layers=4, upto=2)              # the run screen during load
    run.begin_training().train(120)                          # ... in training
    run.finish_training().evaluate(done=96)                  # ... during evaluation
    run.report()                                             # evaluated, report.json, finished

`run.now` is the record's clock: give the app `now=lambda: run.now` so elapsed times are fixed too.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

from cockpit.predictions import own_predictions
from cockpit.profiles import load_profile, profile_to_dict
from cockpit.record import EventWriter, RunPaths, load_manifest, write_manifest
from cockpit.record.atomic import write_jsonl_atomic
from cockpit.record.manifest import update_manifest

T0 = 1_796_200_000.0  # 2026-12-02, the record's first event
RUN_ID = "20261202-101500-tiny-cpu-5a7e"
STEP_S = 0.74  # a step of the tiny run on the 2-core machine
TENANTS = {
    "helix": ["DRUG", "CONDITION", "PROCEDURE", "CLINICIAN", "ALLERGEN"],
    "ledger": ["ACCOUNT", "AMOUNT", "COUNTERPARTY", "DATE", "INSTRUMENT"],
    "lexis": ["PARTY", "COURT", "STATUTE", "CLAUSE", "JUDGE"],
    "northwind": ["PORT", "VESSEL", "CARGO", "CARRIER", "ROUTE"],
    "orbit": ["SATELLITE", "ORBIT", "OPERATOR", "BAND", "LAUNCHER"],
}
DS_WARNING = (
    "[2026-12-02 10:15:01,469] [WARNING] [real_accelerator.py:213:get_accelerator] Setting accelerator to "
    "CPU. If you have GPU or other accelerator, we were unable to detect it."
)
AUDIT = {
    "params_total": 7_340_032,
    "params_4bit": 6_488_064,
    "fraction_4bit": 0.8839,
    "params_trainable": 114_688,
    "lora_targets": {"q_proj": 4, "k_proj": 4, "v_proj": 4, "o_proj": 4},
    "requested": {"load_in_4bit": True, "quant_type": "nf4", "double_quant": True, "zero_stage": 3,
                  "offload_param": "cpu", "offload_optimizer": "cpu", "gradient_checkpointing": True},
    "applied": {"zero_stage": 3, "offload_param": "cpu", "offload_optimizer": "cpu",
                "params_partitioned": True, "partitioned_at_load": True, "gradient_checkpointing": True},
    "warnings": [],
}  # fmt: skip


class SyntheticRun:
    """A run record written event by event at times of our choosing (`now`), through `EventWriter`."""

    def __init__(
        self,
        parent: Path,
        run_id: str = RUN_ID,
        *,
        gpus: int = 0,
        gpu_total_mib: float = 143_771.0,
        max_steps: int = 324,
        seed: int = 0,
    ) -> None:
        self.root = Path(parent) / run_id
        self.paths = RunPaths(self.root)
        self.now = T0
        self.gpus = gpus
        self.gpu_total_mib = gpu_total_mib
        self.max_steps = max_steps
        self.rng = random.Random(seed)
        self.step = 0
        self.loss_ema = 0.0
        self._next_sample = T0
        profile, path = load_profile("tiny-cpu", [f"hardware.gpus={gpus}"] if gpus else None)
        for sub in (self.paths.events_dir, self.paths.control_dir):
            sub.mkdir(parents=True, exist_ok=True)
        write_manifest(
            self.root,
            {
                "run_id": run_id,
                "status": "running",
                "mode": "train",
                "profile_name": profile.name,
                "profile_path": str(path),
                "profile": profile_to_dict(profile),
                "created_at": T0 - 1,
                "started_at": T0,
                "ended_at": None,
                "exit_code": None,
                "diagnosis": None,
            },
        )
        self.supervisor = self._writer("supervisor")
        self.trainer = self._writer("trainer-rank0", rank=0)
        self.telemetry_writer = self._writer("telemetry")
        self.eval_writer: EventWriter | None = None
        self.log = open(self.paths.output_log, "a", encoding="utf-8")  # noqa: SIM115 - closed in `close`

    def _writer(self, name: str, rank: int | None = None) -> EventWriter:
        return EventWriter(self.paths.events(name), rank=rank, clock=lambda: self.now)

    def close(self) -> None:
        for w in (self.supervisor, self.trainer, self.telemetry_writer, self.eval_writer):
            if w is not None:
                w.close()
        self.log.close()

    def say(self, *lines: str) -> None:
        self.log.write("".join(line + "\n" for line in lines))
        self.log.flush()

    # --- time passing: telemetry once a second ---------------------------------------------------------
    def wait(self, seconds: float) -> SyntheticRun:
        """Let `seconds` pass, the sampler writing once a second."""
        end = self.now + seconds
        while self._next_sample <= end:
            self.now = self._next_sample
            self._sample()
            self._next_sample += 1.0
        self.now = end
        return self

    def _sample(self) -> None:
        busy = self.step > 0
        run_rss = 180.0 + (560.0 if busy else 420.0 * min(1.0, (self.now - T0) / 20)) + self.rng.random() * 20
        fields: dict[str, Any] = {}
        if self.gpus:
            used = [(900.0 + 350.0 * busy + self.rng.random() * 40) for _ in range(self.gpus)]
            fields.update(
                gpu_mem_used_mib=used,
                gpu_mem_total_mib=[self.gpu_total_mib] * self.gpus,
                gpu_util_pct=[60.0 * busy] * self.gpus,
                gpu_power_w=[120.0 + 200 * busy] * self.gpus,
                gpu_temp_c=[40.0] * self.gpus,
            )
        self.telemetry_writer.write(
            "telemetry",
            **fields,
            ram_used_mib=3100.0 + run_rss,
            ram_available_mib=24105.0 - 3100.0 - run_rss,
            ram_total_mib=24105.0,
            swap_used_mib=0.0,
            swap_total_mib=0.0,
            cpu_pct=100.0 if busy else 60.0,
            run_processes=3,
            run_rss_mib=run_rss,
            run_cpu_pct=190.0,
            output_log_bytes=self.paths.output_log.stat().st_size,
        )

    # --- the stages ---------------------------------------------------------------------------------------
    def start(self) -> SyntheticRun:
        """The supervisor starts, launches the trainer, starts the sampler."""
        self.supervisor.write("supervisor_start", pid=4100, resume=False, host_ram_limit_mib=21694.5)
        self.supervisor.write("launch", stage="train", argv=["python", "-m", "deepspeed.launcher.runner"],
                              pid=4101, world_size=max(1, self.gpus))  # fmt: skip
        nvml = "ok" if self.gpus else "not available: NVML Shared Library Not Found"
        self.telemetry_writer.write("telemetry_start", pid=4102, root_pid=4101, interval_s=1.0, nvml=nvml,
                                    gpus=[f"NVIDIA H200 {i}" for i in range(self.gpus)],
                                    output_log_bytes=self.paths.output_log.stat().st_size)  # fmt: skip
        self.say(DS_WARNING)
        return self.wait(6.5)

    def phase(self, name: str, message: str | None = None, **fields: Any) -> SyntheticRun:
        extra = {"message": message} if message else {}
        self.trainer.write("phase", phase=name, pid=4103, **fields, **extra)
        self.say(f"[cockpit] phase: {name}" + (f": {message}" if message else ""))
        return self

    def setup(self) -> SyntheticRun:
        self.phase("setup", "reading and tokenizing the training data").wait(1.2)
        self.trainer.write("data", source="builtin", examples=1600, tokens=164065, target_fraction=0.2444,
                           rows=1281, packing=True, fill=0.6671)  # fmt: skip
        return self

    def load(self, layers: int = 4, upto: int | None = None) -> SyntheticRun:
        """The load phase, up to layer `upto` of `layers` (all of them by default)."""
        self.phase("load", "loading the model", model="builtin", train_examples=1281)
        for k in range(1, (layers if upto is None else upto) + 1):
            self.wait(0.6)
            self.trainer.write("load_progress", layer=k, layers=layers)
        return self

    def begin_training(self) -> SyntheticRun:
        """The model loaded, the engine built, the audit written: training begins."""
        self.trainer.write("loaded", load_s=2.4, partitioned_at_load=True, rss_mib=601.8, rss_peak_mib=613.0)
        self.phase("train", "building the DeepSpeed engine").wait(3.9)
        self.trainer.write("load_peak", rss_mib=602.1, rss_peak_mib=613.2)
        self.trainer.write("audit", **AUDIT)
        self.trainer.write("train_begin", max_steps=self.max_steps, num_train_epochs=4.0,
                           start_step=self.step, world_size=1, micro_batch_size=16, grad_accum=1)  # fmt: skip
        return self.wait(0.4)

    def train(self, steps: int, save_steps: int = 100) -> SyntheticRun:
        """`steps` optimizer steps (a checkpoint every `save_steps`)."""
        for _ in range(steps):
            self.wait(STEP_S + self.rng.uniform(-0.08, 0.08))
            self.step += 1
            s = self.step
            loss = 0.18 + 11.0 * math.exp(-s / 9.0) + 0.9 * math.exp(-s / 80.0) + self.rng.uniform(0, 0.25)
            tps = 2700.0 + self.rng.gauss(0, 140) - (900 if s % 37 == 0 else 0)
            mem: dict[str, float] = {"rss_mib": 750.0 + self.rng.random() * 30, "rss_peak_mib": 785.0}
            if self.gpus:
                mem.update(cuda_alloc_mib=410.0, cuda_reserved_mib=520.0, cuda_peak_alloc_mib=480.0 + s % 7,
                           cuda_peak_reserved_mib=600.0)  # fmt: skip
            epoch, lr = round(4.0 * s / self.max_steps, 4), 5e-3 * (1 - s / self.max_steps)
            self.trainer.write("step", step=s, max_steps=self.max_steps, epoch=epoch,
                               loss=loss, learning_rate=lr, grad_norm=1.2,
                               step_time_s=round(1515 / tps, 4), tokens_per_s=round(tps, 2),
                               samples_per_s=21.1, tokens=1515, **mem)  # fmt: skip
            self.say(
                f"step {s}/{self.max_steps} loss {loss:.4f} lr 5.00e-03 {tps:,.0f} tok/s "
                f"({1515 / tps:.2f} s/step)"
            )
            if save_steps and s % save_steps == 0:
                self.checkpoint()
        return self

    def validate(self) -> SyntheticRun:
        """A validation at this step: each tenant's loss (orbit, the hardest, highest) and their mean."""
        s = self.step
        per_tenant = {t: round(0.4 + 0.15 * i + 4.0 * math.exp(-s / 40.0), 5) for i, t in enumerate(TENANTS)}
        loss = round(sum(per_tenant.values()) / len(per_tenant), 5)
        self.wait(0.5)
        self.trainer.write("val_loss", step=s, epoch=round(4.0 * s / self.max_steps, 4), loss=loss,
                           tenant_loss=per_tenant, eval_s=0.5, examples=60, split="eval")  # fmt: skip
        shown = " ".join(f"{t} {v:.3f}" for t, v in per_tenant.items())
        self.say(f"val step {s} loss {loss:.4f} ({shown}) in 0.5 s")
        return self

    def checkpoint(self) -> SyntheticRun:
        path = self.paths.checkpoints / f"checkpoint-{self.step}"
        path.mkdir(parents=True, exist_ok=True)
        (path / "trainer_state.json").write_text(f'{{"global_step": {self.step}}}')
        self.wait(0.3)
        self.trainer.write("checkpoint", step=self.step, path=str(path))
        return self

    def resume(self, after_s: float = 20.0) -> SyntheticRun:
        """`cockpit resume`, `after_s` seconds after the end (nothing is sampled meanwhile): a new
        supervisor, a new training attempt in the same record."""
        update_manifest(self.root, status="running", diagnosis=None, exit_code=None, ended_at=None)
        self.supervisor = self._writer("supervisor")
        self.trainer = self._writer("trainer-rank0", rank=0)
        self.telemetry_writer = self._writer("telemetry")
        self.log = open(self.paths.output_log, "a", encoding="utf-8")  # noqa: SIM115 - closed in `close`
        self.now += after_s
        self._next_sample = self.now
        self.supervisor.write("supervisor_start", pid=5100, resume=True, host_ram_limit_mib=21694.5)
        self.supervisor.write("launch", stage="train", argv=["python"], pid=5101, world_size=1)
        self.step_before_resume = self.step
        return self.wait(6.5)

    def request_stop(self) -> SyntheticRun:
        """Someone asked for a stop: the supervisor says so in the record."""
        (self.paths.control_dir / "stop").write_text("")
        self.supervisor.write("stop_request", phase="train", step=self.step)
        return self

    def stop(self) -> SyntheticRun:
        """The trainer checkpoints after its step and exits; the supervisor ends the run as stopped."""
        self.trainer.write("stop_ack", step=self.step)
        self.checkpoint()
        self.trainer.write("trainer_end", outcome="stopped", step=self.step)
        self.say(f"[cockpit] stop requested: checkpoint at step {self.step}, exiting")
        self.wait(1.5)
        return self.end("stopped", f"stopped by user at step {self.step}, checkpoint saved", exit_code=3)

    def finish_training(self) -> SyntheticRun:
        self.phase("save").wait(0.4)
        self.trainer.write("adapter", path=str(self.paths.adapter), step=self.step)
        self.trainer.write("trainer_end", outcome="finished", step=self.step)
        self.supervisor.write("note", message="evaluating on the held-out split")
        return self.wait(2.0)

    def evaluate(self, done: int | None = None, per_example_s: float = 0.09) -> SyntheticRun:
        """The evaluation stage: the base model, then the fine-tuned one, `done` examples of the second in
        (all of both by default), 8 a batch."""
        argv = ["python", "-m", "trainer.evaluation.evaluate"]
        self.supervisor.write("launch", stage="eval", argv=argv, pid=4200, world_size=1)
        self.eval_writer = self._writer("eval")
        total = sum(40 for _ in TENANTS)
        self.wait(5.0)
        self.eval_writer.write("eval_begin", systems=["base", "finetuned"], examples=total)
        for system in ("base", "finetuned"):
            self.wait(2.0)  # its model loads
            last = total if system == "base" or done is None else done
            for n in range(8, last + 1, 8):
                self.wait(8 * per_example_s)
                self.eval_writer.write("eval_progress", system=system, done=n, total=total)
                self.say(f"[cockpit] eval {system}: {n}/{total}")
            if last == total:
                self.eval_writer.write(
                    "eval_system", system=system, examples=total, seconds=total * per_example_s
                )
        return self

    def report(self) -> SyntheticRun:
        """The serving measurement, the predictions, report.json (by the cockpit's own producer), the end."""
        from cockpit.report import run_report, summary_line, write_report

        assert self.eval_writer is not None
        self.eval_writer.write("serving", system="finetuned", ttft_ms=375.4, per_token_ms=86.26,
                               stream_tokens_per_s=11.6, batch_size=8, batch_tokens_per_s=879.7,
                               new_tokens=32, prompt_tokens_mean=78.4, device="cpu", gpus=0)  # fmt: skip
        self.eval_writer.write("eval_end", systems=["base", "finetuned"])
        self.write_predictions()
        self.wait(3.0)
        report = run_report(self.root)
        write_report(self.root, report)
        self.supervisor.write("report", path=str(self.paths.report_json), summary=summary_line(report))
        return self.end("finished", f"finished at step {self.step}; {summary_line(report)}", exit_code=0)

    def write_predictions(self) -> None:
        """Each system's predictions on 40 held-out examples a tenant: the base model near chance, the
        fine-tuned one mostly right (orbit, the hardest tenant, less so)."""
        rng = random.Random(7)
        skill = {"base": 0.12, "finetuned": 0.86}
        for system, p in skill.items():
            meta = {"system": system, "model": "builtin"}
            if system == "finetuned":  # as the evaluation writes it (fixed: pictures of it must not move)
                meta["adapter"] = f"/runs/{self.root.name}/adapter"
            rows: list[dict[str, Any]] = [{"meta": meta}]
            for tenant, labels in TENANTS.items():
                right = p - (0.3 if tenant == "orbit" and system == "finetuned" else 0.0)
                for i in range(40):
                    gold = labels[i % len(labels)]
                    pred = gold if rng.random() < right else rng.choice(labels)
                    scores = {label: (-0.5 if label == pred else -2.0 - rng.random()) for label in labels}
                    rows.append({"tenant": tenant, "id": f"{tenant}-{i}", "gold": gold, "pred": pred,
                                 "scores": scores, "thinking": ""})  # fmt: skip
            self.paths.predictions.mkdir(exist_ok=True)
            write_jsonl_atomic(self.paths.prediction(system), rows)
        assert len(own_predictions(self.root)) == 2

    def end(self, status: str, diagnosis: str, exit_code: int) -> SyntheticRun:
        self.supervisor.write("end", status=status, diagnosis=diagnosis, exit_code=exit_code)
        self.telemetry_writer.write("telemetry_end", samples=int(self.now - T0))
        update_manifest(self.root, status=status, diagnosis=diagnosis, exit_code=exit_code, ended_at=self.now)
        self.close()
        return self

    @property
    def manifest(self) -> dict[str, Any]:
        return load_manifest(self.root)


MOMENTS = ("load", "training", "validated", "eval", "stopping", "stopped", "report")


def make_run(parent: Path, moment: str, *, gpus: int = 0) -> SyntheticRun:
    """A run record as it stands at one `moment` of MOMENTS:

    - `load`: the model half loaded (layer 2 of 4), no step yet;
    - `training`: step 120 of 324;
    - `validated`: step 120 of 324, a validation every 40 steps (each tenant's loss);
    - `eval`: trained, the fine-tuned model's evaluation 96 of 200 examples in;
    - `stopping`: a stop requested at step 120, the trainer not yet out;
    - `stopped`: stopped at step 121 with a checkpoint, the run ended;
    - `report`: trained, evaluated, report.json written, finished.
    """
    run = SyntheticRun(parent, gpus=gpus)
    run.start().setup()
    if moment == "load":
        return run.load(4, upto=2)
    run.load(4).begin_training()
    if moment == "validated":
        for _ in range(3):
            run.train(40).validate()
        return run
    if moment in ("training", "stopping", "stopped"):
        run.train(120)
        if moment == "stopping":
            run.request_stop()
        elif moment == "stopped":
            run.request_stop().train(1).stop()
        return run
    run.train(324).finish_training()
    if moment == "eval":
        return run.evaluate(done=96)
    return run.evaluate().report()
