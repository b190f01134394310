"""A plan calibrated by rehearsals: each record's whole-run forecast set on the plan row it measured.

A rehearsal calibrates a plan when it rehearsed the same model with the same quantization and LoRA, and
its target (the GPUs its forecast is for) is the plan's hardware. Its settings then pick the row: the
configuration as written, or the option with the same offload, rows a micro-batch and sequence length
(`cockpit.plan.measured.Measured`). A record that fits no row is named in one line (`CalibrationError`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cockpit.plan.measured import CONFIGURED, Measured
from cockpit.record import RunPaths, load_manifest

SAME = ("model", "quantization", "lora")  # profile sections a rehearsal must share with the plan's
ROW_FIELDS = ("offload_param", "offload_optimizer", "micro_batch", "seq_len", "gpus", "nodes", "loader")


class CalibrationError(ValueError):
    """A record that cannot calibrate the plan; the message says why."""


def _row_of(plan: Any, setup: Any) -> str | None:
    key = tuple(getattr(setup, f) for f in ROW_FIELDS)
    if key == tuple(getattr(plan.configured.setup, f) for f in ROW_FIELDS):
        return CONFIGURED
    for option in plan.options:
        if key == tuple(getattr(option.estimate.setup, f) for f in ROW_FIELDS):
            return option.label
    return None


def measured_row(plan: Any, profile: Any, run_dir: Path) -> tuple[str, Measured]:
    """The plan row `run_dir`'s rehearsal measured, and its figures on the plan's hardware."""
    from cockpit.plan import build_plan
    from cockpit.profiles import parse_profile
    from cockpit.rehearse.run import RehearsalError, forecast_run

    paths = RunPaths(Path(run_dir))
    name = paths.root.name
    manifest = load_manifest(paths.root)
    if manifest.get("mode") != "rehearse":
        raise CalibrationError(f"{name} is not a rehearsal (start one with `cockpit rehearse`)")
    rehearsed = parse_profile(manifest["rehearsal"]["target_profile"], str(paths.manifest))
    for section in SAME:
        if getattr(rehearsed, section) != getattr(profile, section):
            raise CalibrationError(
                f"{name}: rehearsed another {section} than this profile's ({section} differs): it cannot "
                "calibrate this plan"
            )
    theirs = build_plan(rehearsed, plan.hardware)
    row = _row_of(plan, theirs.configured.setup)
    if row is None:
        raise CalibrationError(
            f"{name}: its settings ({theirs.configured.setup.describe()}) are no row of this plan"
        )
    try:
        result = forecast_run(paths.root)
    except RehearsalError as exc:
        raise CalibrationError(str(exc)) from None
    target, ranges = result.target, result.ranges.get("target", {})
    setup = plan.configured.setup
    if result.scaling.target_gpus != max(1, setup.gpus) * max(1, setup.nodes):
        raise CalibrationError(
            f"{name}: its forecast is for {result.scaling.target_machine}, not this plan's hardware"
        )
    if not target.get("step_s") or not target.get("tokens_per_s"):
        raise CalibrationError(f"{name}: too few depths measured to predict the run")
    timed = result.evaluation is not None and result.evaluation.measured  # evaluation on its slices
    return row, Measured(
        source=f"rehearsal {name}",
        step_s=float(target["step_s"]),
        tokens_per_s=float(target["tokens_per_s"]),
        gpu_train_gib=target.get("gpu_train"),
        gpu_load_gib=target.get("gpu_load"),
        host_gib=target.get("host_gib"),
        step_measured=result.measured("step_s"),
        gpu_measured=result.measured("gpu_train"),
        step_range=tuple(ranges["step_s"]) if ranges.get("step_s") else None,
        eval_s=result.wall.get("eval_s") if timed else None,
        eval_range=result.evaluation.range_s if timed and result.evaluation else None,
        validation_s=result.wall.get("validation_s") if result.measured("validation_s") else None,
    )


def calibrate(plan: Any, profile: Any, run_dirs: list[Path]) -> dict[str, Measured]:
    """Every rehearsal's row; a later record of the same row replaces an earlier one."""
    out: dict[str, Measured] = {}
    for run_dir in run_dirs:
        row, measured = measured_row(plan, profile, run_dir)
        out[row] = measured
    return out
