"""`cockpit doctor`: is this environment ready for a profile's run? Each check is ok, warn or fail with a
one-line reason: library versions and known-bad combinations, the C++ toolchain and DeepSpeed's CPU Adam
op, NVML and GPUs, host RAM and disk against the profile's plan. The CLI only prints these results.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from cockpit import hostinfo, model_cache
from cockpit.hostinfo import library_versions
from cockpit.ops import dsops
from cockpit.profiles import Profile
from cockpit.service.ninja_plan import rebuild_reason
from cockpit.units import memory, size

Status = Literal["ok", "warn", "fail"]
GiB = 2**30


@dataclass(frozen=True)
class Check:
    """One line of the doctor's answer."""

    name: str
    status: Status
    reason: str
    facts: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _major(version: str | None) -> int | None:
    try:
        return int((version or "").split(".")[0])
    except ValueError:
        return None


# --- libraries ---------------------------------------------------------------------------------------
def check_libraries(versions: dict[str, str | None]) -> Check:
    """Every dependency installed, within the ranges the package declares."""
    from packaging.requirements import Requirement

    try:
        requires = metadata.requires("cockpit") or []
    except metadata.PackageNotFoundError:
        requires = []
    wanted = ("torch", "transformers", "peft", "bitsandbytes", "deepspeed", "accelerate")
    problems = []
    for line in requires:
        req = Requirement(line)
        if req.marker is not None or req.name not in wanted:
            continue
        have = versions.get(req.name) or _version(req.name)
        if have is None:
            problems.append(f"{req.name} missing")
        elif not req.specifier.contains(have, prereleases=True):
            problems.append(f"{req.name} {have} outside {req.specifier}")
    for name in wanted:
        if (versions.get(name) or _version(name)) is None and f"{name} missing" not in problems:
            problems.append(f"{name} missing")
    shown = ", ".join(f"{n} {versions.get(n) or _version(n) or '-'}" for n in wanted)
    facts = {n: versions.get(n) or _version(n) for n in wanted}
    if problems:
        return Check("libraries", "fail", "; ".join(problems), facts)
    return Check("libraries", "ok", shown, facts)


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def check_fused_experts(profile: Profile, transformers_version: str | None, is_moe: bool | None) -> Check:
    """Transformers 5 fuses MoE experts into 3-D parameters that bitsandbytes leaves in 16 bit (`is_moe`
    None: the model's config could not be read, so it is judged as if it were an MoE)."""
    name = "experts in 4 bit"
    q = profile.quantization
    is_moe = True if is_moe is None else is_moe
    if not (is_moe and q.load_in_4bit):
        return Check(name, "ok", "no quantized MoE experts in this profile")
    if q.quantize_experts:
        return Check(name, "ok", "quantization.quantize_experts = true: the trainer packs the experts in NF4")
    if (_major(transformers_version) or 0) >= 5:
        return Check(
            name,
            "warn",
            f"transformers {transformers_version} fuses the MoE experts and bitsandbytes leaves them in "
            "16 bit (quantization.quantize_experts = false): set it to true",
            {"transformers": transformers_version, "quantize_experts": False},
        )
    kept = f"transformers {transformers_version} keeps experts as nn.Linear for bitsandbytes"
    return Check(name, "ok", kept)


def check_flash4(profile: Profile, version: str | None) -> Check:
    """FlashAttention-4 (the `flash4` extra) for the packed attention on Hopper GPUs, where a run uses it."""
    name = "packed attention"
    if profile.training.attention != "varlen" or not profile.hardware.gpus:
        return Check(name, "ok", "no packed attention on a GPU in this profile")
    if version is None:
        return Check(name, "warn", "flash-attn-4 missing: torch's FlashAttention-2 runs it, 1.7x slower on "
                     "Hopper and holding more memory than `cockpit plan` counts there; pip install "
                     "'cockpit[flash4]'", {"flash_attn_4": None})  # fmt: skip
    return Check(name, "ok", f"flash-attn-4 {version} on Hopper GPUs (checked at each run's start)",
                 {"flash_attn_4": version})  # fmt: skip


def check_zero_init(profile: Profile, transformers_version: str | None) -> Check:
    """Transformers skips `deepspeed.zero.Init` for quantized models: from_pretrained is whole on each GPU."""
    name = "partition at load"
    if profile.deepspeed.stage != 3 or not profile.quantization.load_in_4bit:
        return Check(name, "ok", "not a quantized ZeRO-3 run")
    if profile.model.loader == "layerwise":
        return Check(name, "ok", 'model.loader = "layerwise": each layer is partitioned as it loads')
    return Check(
        name,
        "warn",
        f"transformers {transformers_version} skips zero.Init for quantized models "
        '(model.loader = "transformers"): every rank holds the whole model before ZeRO-3 partitions it; '
        'model.loader = "layerwise" avoids it',
        {"loader": profile.model.loader},
    )


# --- toolchain and ops ---------------------------------------------------------------------------------
def _first_line(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (out.stdout or out.stderr).strip().splitlines()
    return lines[0] if out.returncode == 0 and lines else None


def check_toolchain(op_needed_unbuilt: bool) -> list[Check]:
    """The C++ compiler and ninja DeepSpeed's JIT ops are built with; a failure only where a build is due."""
    missing: Status = "fail" if op_needed_unbuilt else "warn"
    why = (
        "needed to build the DeepSpeed ops this run compiles"
        if op_needed_unbuilt
        else "needed only to build DS ops"
    )
    checks = []
    cxx = os.environ.get("CXX", "c++")
    path = shutil.which(cxx)
    version = _first_line([path, "--version"]) if path else None
    if path and version:
        checks.append(Check("c++ compiler", "ok", f"{path}: {version}", {"path": path, "version": version}))
    else:
        checks.append(Check("c++ compiler", missing, f"no working '{cxx}' on PATH ({why})"))
    # the ninja a run's builds find: the interpreter's folder first on PATH (`dsops.ninja_first`)
    found = shutil.which("ninja", path=dsops.ninja_first(os.environ.get("PATH", "")))
    ninja_path = os.path.realpath(found) if found else None
    ninja = _first_line([ninja_path, "--version"]) if ninja_path else None
    if ninja_path and ninja:
        checks.append(
            Check("ninja", "ok", f"{ninja_path}: ninja {ninja}", {"path": ninja_path, "version": ninja})
        )
    else:
        checks.append(Check("ninja", missing, f"no working 'ninja' on PATH ({why}; pip install ninja)"))
    return checks


def op_facts(state: dsops.OpState) -> dict[str, Any]:
    """An op's state as JSON holds it (its lock's path as text, whether the lock is stale)."""
    facts = asdict(state)
    if state.lock is not None:
        facts["lock"] = {**facts["lock"], "path": str(state.lock.path), "stale": state.lock.stale}
    return facts


def _op_check(name: str, state: dsops.OpState, facts: dict[str, Any]) -> Check:
    """An op a run uses: ok when DeepSpeed loads it as built with nothing in its way, else warn with what
    the first run will do (compile it, or wait, or remove a stale lock) and `--prebuild`."""
    if state.built and state.lock is None:
        return Check(name, "ok", state.describe, facts)
    if not state.compatible:
        return Check(name, "fail", state.describe, facts)
    took = dsops.BUILD_TIME.get(state.name, "minutes")
    if state.built:  # a lock in its way
        return Check(name, "warn", state.describe, facts)
    first = "compiles it again" if state.rebuild else "compiles it"
    return Check(
        name,
        "warn",
        f"{state.describe}: the first run {first} ({took} on two cores); `cockpit doctor --prebuild` "
        "builds it now",
        facts,
    )


def check_cpu_adam(profile: Profile, state: dsops.OpState | None, error: str = "") -> Check:
    """What DeepSpeed's loader will do with its CPU Adam (`dsops.op_state`), if this profile needs it."""
    name = "DeepSpeed CPU Adam"
    needed = dsops.needs_cpu_adam(profile)
    if state is None:
        return Check(name, "fail" if needed else "warn", f"cannot ask DeepSpeed: {error}")
    facts = op_facts(state) | {"needed": needed}
    if not needed and not state.built:
        return Check(name, "ok", f"{state.describe}; not needed (deepspeed.offload_optimizer = none)", facts)
    return _op_check(name, state, facts)


def cpu_adam_state() -> tuple[dsops.OpState | None, str]:
    """DeepSpeed's answer, or why there is none."""
    try:
        return dsops.cpu_adam_state(rebuild_reason), ""
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"


def check_shm_comm(state: dsops.OpState | None) -> Check | None:
    """What DeepSpeed's loader will do with the CPU accelerator's shared-memory op (None: no such op)."""
    if state is None:
        return None
    if not state.compatible:  # DeepSpeed's communication goes without it
        return Check("DeepSpeed shm op", "warn", state.describe, op_facts(state))
    return _op_check("DeepSpeed shm op", state, op_facts(state))


def prebuild(profile: Profile, progress: Callable[[str], None], every_s: float = 15.0) -> Check:
    """Do now what a run of `profile` would do to DeepSpeed's ops before its first step (`dsops.ensure_ops`):
    compile those it would compile, remove a stale lock. Says each compile before it, and how long it has
    been building every `every_s` seconds."""
    name = "prebuild DeepSpeed ops"
    done = threading.Event()
    t0 = time.monotonic()

    def tick() -> None:
        while not done.wait(every_s):
            progress(f"  still building ({time.monotonic() - t0:.0f} s)")

    ticker = threading.Thread(target=tick, daemon=True)

    def announce(state: dsops.OpState, words: str) -> None:
        progress(f"{words} ({state.where}) ...")
        if not ticker.is_alive():
            ticker.start()

    try:
        built = dsops.ensure_ops(profile, announce, rebuild_reason)
    except Exception as exc:
        return Check(name, "fail", f"build failed after {time.monotonic() - t0:.0f} s: {exc}")
    finally:
        done.set()
        if ticker.is_alive():
            ticker.join()
    if not built:
        return Check(
            name, "ok", "nothing to compile: DeepSpeed loads every op this profile's run uses as built"
        )
    took = time.monotonic() - t0
    return Check(name, "ok", f"built {', '.join(s.name for s in built)} in {took:.0f} s", {"build_s": took})


# --- GPUs, RAM, disk ------------------------------------------------------------------------------------
def nvml_gpus() -> tuple[list[dict[str, Any]], str]:
    """Every GPU NVML sees (name, memory, free memory), or an empty list and why NVML could not answer."""
    return hostinfo.nvml_gpus(free=True)


def check_gpus(profile: Profile, gpus: list[dict[str, Any]], why: str, gpu_peak: int | None) -> Check:
    """The profile's GPU count and the plan's per-GPU peak against what NVML sees."""
    want = profile.hardware.gpus
    facts: dict[str, Any] = {"wanted": want, "gpus": gpus}
    if not gpus:
        status: Status = "fail" if want else "ok"
        need = f"the profile wants {want}" if want else "the profile needs none (hardware.gpus = 0)"
        return Check("GPUs", status, f"no GPUs: {why or 'NVML sees none'}; {need}", facts)
    smallest = min(g["mem_total_mib"] for g in gpus)
    seen = f"{len(gpus)} x {gpus[0]['name']}, {memory(smallest)} each"
    if len(gpus) < want:
        return Check("GPUs", "fail", f"{seen}; the profile wants {want}", facts)
    if gpu_peak and smallest * 2**20 < gpu_peak:
        return Check("GPUs", "fail", f"{seen}; the plan's GPU peak is {size(gpu_peak)}", facts)
    peak = f"; the plan's GPU peak {size(gpu_peak)}" if gpu_peak else ""
    return Check("GPUs", "ok", seen + peak, facts)


def check_host_ram(total: int, available: int, host_peak: int | None) -> Check:
    """This machine's RAM against the plan's host peak (load or training, whichever is larger)."""
    facts = {"total_bytes": total, "available_bytes": available, "plan_host_peak_bytes": host_peak}
    have = f"{size(available)} available of {size(total)}"
    if not host_peak:
        return Check("host RAM", "ok", f"{have} (no plan to compare with)", facts)
    need = f"the plan's host peak is {size(host_peak)}"
    if total < host_peak:
        return Check("host RAM", "fail", f"{have}; {need}", facts)
    if available < host_peak:
        return Check("host RAM", "warn", f"{have}; {need}: free some memory first", facts)
    return Check("host RAM", "ok", f"{have}; {need}", facts)


def existing_parent(path: Path) -> Path:
    """`path`, or the nearest folder above it that exists (where it would be created)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk(runs_dir: Path, free: int, need: int | None) -> Check:
    """Free space where the run's record goes against the plan's checkpoints and adapter."""
    where = str(runs_dir)
    facts = {"runs_dir": where, "free_bytes": free, "need_bytes": need}
    have = f"{size(free)} free for {where}"
    if not need:
        return Check("disk", "ok", f"{have} (no plan to compare with)", facts)
    need_text = f"checkpoints and adapter need {size(need)}"
    return Check("disk", "fail" if free < need else "ok", f"{have}; {need_text}", facts)


def check_nf4_caches(profile: Profile, caches: list[model_cache.CacheInfo]) -> Check:
    """The NF4 model caches on this machine (one line each in the facts) and their disk use, and whether
    the profile's model has one its next load would read."""
    now = time.time()
    facts = {"caches": [c.to_dict() for c in caches], "lines": [model_cache.describe(c, now) for c in caches]}
    reason = model_cache.summary(caches)
    model = Path(profile.model.path)
    if not profile.quantization.cache:
        return Check("NF4 cache", "ok", f"{reason}; off for this profile (quantization.cache = false)", facts)
    if not model.is_dir():
        return Check("NF4 cache", "ok", reason, facts)
    wanted = model_cache.settings(profile, "cuda" if profile.hardware.gpus else "cpu")
    mine = [c for c in caches if c.model == str(model.resolve()) and c.settings == wanted and not c.problem]
    if mine:
        c = mine[0]
        state = f"cached ({c.done}/{c.units} units, {size(c.bytes)}): its next load reads it"
    else:
        state = "not cached: its first load writes the cache"
    return Check("NF4 cache", "ok", f"{reason}; this profile's model: {state}", facts)


# --- the whole examination -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Examination:
    profile: str
    checks: list[Check]

    @property
    def failed(self) -> bool:
        return any(c.status == "fail" for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        counts = {s: sum(c.status == s for c in self.checks) for s in ("ok", "warn", "fail")}
        return {"profile": self.profile, "checks": [c.to_dict() for c in self.checks], "counts": counts}


def _plan_figures(profile: Profile) -> tuple[Check, dict[str, Any] | None, bool | None]:
    """The profile's plan on its own hardware (completed from this machine), or why there is none."""
    from cockpit.plan import PlanError, build_plan
    from cockpit.plan.geometry import check_packable

    try:
        plan = build_plan(profile)
        check_packable(plan.geometry, profile)  # what the loader would refuse (GeometryError)
    except (PlanError, OSError, ValueError) as exc:
        return Check("plan", "fail", f"cannot plan the profile: {exc}"), None, None
    verdict = plan.verdict()
    status: Status = "fail" if verdict.startswith("DOES NOT FIT") else "ok"
    if verdict.startswith("NOT CHECKED"):
        status = "warn"
    hw = plan.hardware
    on = f"{hw.gpus} x {hw.gpu_name or 'GPU'}" if hw.gpus else "the CPU"
    if hw.nodes > 1:
        on = f"{hw.nodes} nodes of {on}"
    here = [k for k, v in hw.source.items() if v == "this machine"]
    whose = f"{', '.join(here)} from this machine" if here else "the profile's hardware"
    where = f"on {on}, {hw.host_ram_gib:,.0f} GiB of host RAM ({whose})"
    return Check("plan", status, f"{verdict}; {where}"), plan.to_dict(), plan.geometry.is_moe


def check_model_and_data(profile: Profile, source: str) -> Check:
    """What `cockpit run` checks before it starts: the model and the data are on this machine."""
    from cockpit.profiles import ProfileError, check_runnable

    try:
        check_runnable(profile, source)
    except ProfileError as exc:
        return Check("model and data", "fail", str(exc))
    return Check(
        "model and data",
        "ok",
        f"model {profile.model.path}, data {profile.data.source}",
        {"model": profile.model.path, "data": profile.data.source},
    )


def examine(profile: Profile, runs_dir: Path, source: str = "") -> Examination:
    """Every check for `profile` (read from `source`), with run records going to `runs_dir`."""
    import psutil

    versions = library_versions()
    checks = [check_libraries(versions), check_model_and_data(profile, source or profile.name)]
    plan_check, plan, is_moe = _plan_figures(profile)
    checks.append(check_fused_experts(profile, versions.get("transformers"), is_moe))
    checks.append(check_zero_init(profile, versions.get("transformers")))
    checks.append(check_flash4(profile, _version("flash-attn-4")))
    state, error = cpu_adam_state()
    unbuilt = dsops.needs_cpu_adam(profile) and not (state is not None and state.built)
    checks.append(check_cpu_adam(profile, state, error))
    try:
        shm_state = dsops.shm_comm_state(rebuild_reason) if dsops.needs_shm_comm(profile) else None
        shm = check_shm_comm(shm_state)
        unbuilt = unbuilt or (shm_state is not None and shm_state.due)
    except Exception as exc:  # DeepSpeed cannot say: the CPU Adam check above says so already
        shm = Check("DeepSpeed shm op", "warn", f"cannot ask DeepSpeed: {type(exc).__name__}: {exc}")
    if shm is not None:
        checks.append(shm)
    checks += check_toolchain(unbuilt)
    configured = (plan or {}).get("configured") or {}

    def peak(key: str) -> int | None:
        return max((configured.get(p) or {}).get(key) or 0 for p in ("load", "train")) or None

    gpus, why = nvml_gpus()
    checks.append(check_gpus(profile, gpus, why, peak("gpu_peak") if profile.hardware.gpus else None))
    memory = psutil.virtual_memory()
    checks.append(check_host_ram(memory.total, memory.available, peak("host_peak")))
    disk = (plan or {}).get("disk") or {}
    need = (disk.get("checkpoints_kept") or 0) + (disk.get("adapter") or 0) or None
    folder = existing_parent(runs_dir)
    checks.append(check_disk(runs_dir, shutil.disk_usage(folder).free, need))
    checks.append(check_nf4_caches(profile, model_cache.list_caches()))
    checks.append(plan_check)
    return Examination(profile.name, checks)
