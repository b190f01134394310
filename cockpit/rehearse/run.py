"""A rehearsal as a run: its settings, the check before anything loads, and its prediction on file.

`rehearsal_profile` is the profile as it runs here: the GPUs at hand, this machine's memory. `preflight`
plans the one-layer slice on this machine first and refuses a rehearsal that cannot fit even that,
naming the binding limit. `forecast_run` reads the record (measured depths, `plan.json` for the
profile's own machine) and predicts the whole run; `write_forecast` keeps it as `rehearsal.json`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cockpit.plan.model import GiB
from cockpit.profiles import Profile
from cockpit.record import RunPaths, load_manifest, read_events
from cockpit.record.atomic import write_json_atomic
from cockpit.rehearse.measure import depth_measures
from cockpit.rehearse.predict import Forecast, Scaling, _tflops, forecast

DEFAULT_LAYERS = (1, 2, 4)
DEFAULT_STEPS = 6
ASSUMED_H2D_GBPS = 55.0  # pinned host-to-device, measured on the H200 box (FACTS.md, step_speed_h200.md)
ASSUMED_GPU2GPU_GBPS = 150.0  # NVLink all-gather a GPU, the plan's assumption
ASSUMED_DISK_GBPS = 2.0  # reading the 16-bit checkpoint at load


class RehearsalError(ValueError):
    """A rehearsal that cannot run here; the message names the limit."""


def rehearsal_profile(profile: Profile, gpus: int) -> Profile:
    """The profile as the rehearsal runs it: `gpus` GPUs of this machine, its own memory sizes."""
    hardware = profile.hardware.model_copy(
        update={"gpus": gpus, "gpu_name": "", "gpu_mem_gib": 0.0, "host_ram_gib": 0.0}
    )
    return profile.model_copy(update={"hardware": hardware})


def preflight(profile_here: Profile, layers: int = 1) -> None:
    """Refuse (RehearsalError) a rehearsal whose shallowest slice does not fit this machine."""
    from cockpit.plan.hardware import resolve_hardware
    from cockpit.plan.model import estimate
    from cockpit.plan.planner import inputs_for, resolve_geometry, setup_for

    geometry = resolve_geometry(profile_here).with_layers(layers)
    hw = resolve_hardware(profile_here)
    est = estimate(inputs_for(profile_here, geometry), setup_for(profile_here, hw))
    if est.fits:
        return
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
    if _tflops(here) and _tflops(there):
        ratio = _tflops(here) / _tflops(there)
    return Scaling(
        measured_gpus=measured_ranks,
        measured_gpu=here,
        target_gpus=int(target.get("gpus") or measured_ranks),
        target_gpu=there,
        target_gpu_mem_gib=float(target.get("gpu_mem_gib") or 0.0),
        target_host_ram_gib=float(target.get("host_ram_gib") or 0.0),
        compute_ratio=ratio,
        h2d_gbps_measured=ASSUMED_H2D_GBPS,
        h2d_gbps_target=ASSUMED_H2D_GBPS,
        gpu2gpu_gbps=ASSUMED_GPU2GPU_GBPS,
        disk_gbps=ASSUMED_DISK_GBPS,
    )


def _eval_examples(profile: Profile) -> int:
    """Held-out examples in the data file when it is here (0 when it is not)."""
    path = Path(profile.data.source)
    if not path.is_file():
        return 0
    with open(path, encoding="utf-8") as f:
        return sum('"eval"' in line for line in f)


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
    result = forecast(measures, profile, plan, scaling_for(manifest, ranks), _eval_examples(profile))
    result.notes.insert(0, "measured depths: " + ", ".join(f"{m.layers} ({m.status})" for m in measures))
    result.depths = [m.to_dict() for m in measures]
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
