"""A rehearsal as a run: its settings, the check before anything loads, and its prediction on file.

`rehearsal_profile` is the profile as it runs here: the GPUs at hand, this machine's memory. `preflight`
plans every depth's slice on this machine first and refuses a rehearsal with one that cannot fit,
naming the binding limit. `forecast_run` reads the record (measured depths, `plan.json` for the
profile's own machine) and predicts the whole run; `write_forecast` keeps it as `rehearsal.json`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cockpit.plan.geometry import ModelGeometry
from cockpit.plan.inputs import Assumptions, GiB, datasheet_tflops
from cockpit.profiles import LauncherSpec, Profile
from cockpit.record import RunPaths, load_manifest, read_events
from cockpit.record.atomic import write_json_atomic
from cockpit.rehearse.forecast import Forecast, Scaling, forecast
from cockpit.rehearse.measure import depth_measures


class RehearsalError(ValueError):
    """A rehearsal that cannot run here; the message names the limit."""


def rehearsal_profile(profile: Profile, gpus: int) -> Profile:
    """The profile as the rehearsal runs it: `gpus` GPUs of this machine (one node, launched here), its own
    memory sizes."""
    hardware = profile.hardware.model_copy(
        update={"gpus": gpus, "nodes": 1, "gpu_name": "", "gpu_mem_gib": 0.0, "host_ram_gib": 0.0}
    )
    return profile.model_copy(update={"hardware": hardware, "launcher": LauncherSpec()})


def preflight(profile_here: Profile, geometry: ModelGeometry, depths: list[int]) -> None:
    """Refuse (RehearsalError) a rehearsal with a slice, at any of its depths, that does not fit here."""
    from cockpit.plan.estimator import estimate
    from cockpit.plan.hardware import resolve_hardware
    from cockpit.plan.inputs import inputs_for, setup_for

    hw = resolve_hardware(profile_here)  # this machine, probed once
    setup = setup_for(profile_here, hw)
    for layers in depths:
        est = estimate(inputs_for(profile_here, geometry.with_layers(layers)), setup)
        if est.fits:
            continue
        check = est.binding
        assert check is not None
        raise RehearsalError(
            f"the {layers}-layer slice of {profile_here.model.name or profile_here.name} does not fit here: "
            f"{check.name} needs {check.need / GiB:.1f} GiB of {check.limit / GiB:.1f} GiB usable (plan, "
            f"{hw.gpus} GPU(s)); nothing was loaded"
        )


def scaling_for(manifest: dict[str, Any], measured_ranks: int) -> Scaling:
    """From the rehearsal's machine (its manifest's host facts) to the profile's (`rehearsal.target`)."""
    target = manifest.get("rehearsal", {}).get("target", {})
    gpus = manifest.get("host", {}).get("gpus") or []
    here = gpus[0].get("name", "") if gpus and isinstance(gpus[0], dict) else ""
    there = target.get("gpu_name", "") or here
    ratio = 1.0
    if datasheet_tflops(here) and datasheet_tflops(there):
        ratio = datasheet_tflops(here) / datasheet_tflops(there)
    plan = Assumptions()  # the plan's bandwidths: pinned copies measured on the H200 box, NVLink assumed
    nodes = int(target.get("nodes") or 1)
    return Scaling(
        measured_gpus=measured_ranks,
        measured_gpu=here,
        target_gpus=nodes * int(target.get("gpus") or measured_ranks),
        target_nodes=nodes,
        internode_gbps=plan.internode_gbps,
        target_gpu=there,
        target_gpu_mem_gib=float(target.get("gpu_mem_gib") or 0.0),
        target_host_ram_gib=float(target.get("host_ram_gib") or 0.0),
        compute_ratio=ratio,
        h2d_gbps_measured=plan.h2d_gbps,
        h2d_gbps_target=plan.h2d_gbps,
        gpu2gpu_gbps=plan.nvlink_gbps,
        disk_gbps=float(target.get("disk_gbps") or plan.disk_gbps),  # records before it: the default
    )


def forecast_run(run_dir: Path) -> Forecast:
    """The whole run predicted from a rehearsal's record."""
    from cockpit.profiles import parse_profile

    paths = RunPaths(Path(run_dir))
    manifest = load_manifest(paths.root)
    if manifest.get("mode") != "rehearse":
        raise RehearsalError(f"{paths.root.name} is not a rehearsal (start one with `cockpit rehearse`)")
    profile = parse_profile(manifest["rehearsal"]["target_profile"], str(paths.manifest))
    measures = depth_measures(read_events(paths.root))
    plan = json.loads(paths.plan.read_text(encoding="utf-8")) if paths.plan.is_file() else {}
    ranks = next((m.ranks for m in measures if m.complete), 1)
    result = forecast(measures, profile, plan, scaling_for(manifest, ranks))
    result.notes.insert(0, "measured depths: " + ", ".join(f"{m.layers} ({m.status})" for m in measures))
    return result


def write_forecast(run_dir: Path, result: Forecast) -> Path:
    return write_json_atomic(RunPaths(Path(run_dir)).rehearsal, result.to_dict())


def read_forecast(run_dir: Path) -> dict[str, Any] | None:
    """The rehearsal's prediction as written, or None when the run has none."""
    path = RunPaths(Path(run_dir)).rehearsal
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
