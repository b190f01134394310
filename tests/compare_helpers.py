"""Synthetic run records for the compare and export tests: written with the record's own writer.

`lr_run(parent, lr, ...)` writes a finished tiny-cpu-shaped run with that learning rate: a manifest with
the resolved profile, step events (loss falling faster with the higher rate, tokens/s, per-rank RSS),
validation losses, telemetry, and optionally the fixture's report.json. Deterministic: the same
arguments give the same record, so snapshots hold.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from cockpit.profiles import load_profile, profile_to_dict
from cockpit.record import EventWriter, RunPaths, write_manifest

T0 = 1_796_000_000.0  # 2026-11-30, a fixed start for every synthetic run
REPORT = Path(__file__).resolve().parent / "fixtures" / "reports" / "20261130-054410-tiny-cpu-903f.json"


def lr_run(
    parent: Path,
    lr: float,
    *,
    name: str,
    steps: int = 200,
    step_s: float = 0.5,
    seed: int = 0,
    report_scale: float | None = None,
) -> Path:
    """A finished synthetic run of `steps` steps at learning rate `lr` under `parent/name`.

    With `report_scale`, the fixture's report.json is copied in with the fine-tuned system's F1 figures
    multiplied by it (so two runs differ)."""
    rng = np.random.default_rng(seed)
    run_dir = parent / name
    paths = RunPaths(run_dir)
    paths.events_dir.mkdir(parents=True)
    profile, _ = load_profile("tiny-cpu", [f"training.learning_rate={lr}", f"training.max_steps={steps}"])
    rate = lr * 400  # how fast the loss falls
    with (
        EventWriter(paths.events("trainer-rank0"), rank=0) as w,
        EventWriter(paths.events("telemetry")) as tel,
    ):
        w.write("train_begin", at=T0, max_steps=steps, start_step=0)
        t = T0
        for step in range(1, steps + 1):
            t += step_s * (1 + 0.1 * rng.random())
            loss = 2.0 + 9.0 * math.exp(-rate * step / steps * 3) + 0.15 * rng.standard_normal()
            w.write(
                "step",
                at=t,
                step=step,
                max_steps=steps,
                epoch=round(step / steps * 4, 4),
                loss=loss,
                learning_rate=lr * (1 - step / steps),
                grad_norm=1.0 + rng.random(),
                step_time_s=step_s,
                tokens_per_s=3000 + 300 * rng.standard_normal() - (500 if lr > 0.002 else 0),
                tokens=1500,
                rss_mib=700 + step * (0.5 if lr > 0.002 else 0.3),
            )
            if step % 50 == 0:
                w.write("val_loss", at=t, step=step, loss=loss + 0.3)
            if step % 2 == 0:
                tel.write(
                    "telemetry", at=t, ram_used_mib=900 + step, ram_total_mib=24000, run_rss_mib=800 + step
                )
        w.write("trainer_end", at=t, outcome="finished")
    write_manifest(
        run_dir,
        {
            "run_id": name,
            "status": "finished",
            "mode": "train",
            "profile_name": profile.name,
            "profile": profile_to_dict(profile),
            "created_at": T0,
            "started_at": T0,
            "ended_at": t,
        },
    )
    if report_scale is not None:
        report = json.loads(REPORT.read_text())
        for row in [*report["tenants"], report["mean"]]:
            tuned = row["systems"]["finetuned"]
            for key in ("precision", "recall", "micro_f1", "macro_f1"):
                if key in tuned:
                    tuned[key] = round(min(1.0, tuned[key] * report_scale), 4)
        paths.report_json.write_text(json.dumps(report))
    return run_dir
