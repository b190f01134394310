"""The run's lifecycle: start, stop, kill, resume, evaluate, and reconciling a lost supervisor.

The one place that creates run records, starts the detached supervisor and signals a run's
processes. Every training or evaluation process is launched by the supervisor (`cockpit.service.supervisor`),
never from here. Refusals are `LifecycleError`s whose message is for the user.
"""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from cockpit.profiles import (
    Profile,
    anchor_set_paths,
    apply_overrides,
    check_runnable,
    load_profile,
    parse_profile,
    profile_to_dict,
)
from cockpit.record import RunPaths, control, load_manifest, write_manifest
from cockpit.record.manifest import update_manifest
from cockpit.service import liveness, spawn
from cockpit.service.disk_space import room_problem
from cockpit.service.lost import LOST, lost_verdict
from cockpit.service.outcome import Evaluation
from cockpit.service.runs import create_run

ACTIVE = ("planned", "running")


class LifecycleError(Exception):
    """A request the run's state refuses (stop a run that has ended, resume one still running)."""


@dataclass(frozen=True)
class Launch:
    """A supervisor just started for a run."""

    run_dir: Path
    process: subprocess.Popen[bytes] | None

    def running(self) -> bool:
        """The supervisor process has not exited (it is this process's child)."""
        return self.process is not None and self.process.poll() is None


class StopOutcome(Enum):
    """What `stop` did."""

    STOP_REQUESTED = "stop requested"  # the trainer checkpoints at its next step, then exits
    KILL_REQUESTED = "kill requested"  # the supervisor kills the training processes
    TRAINER_STOP_REQUESTED = "trainer stop requested"  # supervisor lost: the trainer polls the request
    TRAINER_KILLED = "trainer killed"  # supervisor lost: its process group killed from here


def check_trainer() -> None:
    """Refuse (`LifecycleError`) when the ranks would import another project's `trainer` (or none)."""
    problem = spawn.trainer_problem()
    if problem is not None:
        raise LifecycleError(problem)


def _spawn(run_dir: Path, **how: Any) -> Launch:
    return Launch(run_dir, spawn.spawn_detached(run_dir, **how))


# --- start -------------------------------------------------------------------------------------------
def check_data(profile: Profile) -> None:
    """Read and check the profile's own data before anything starts: `LifecycleError` with the one-line
    error of the first problem a run would meet (the built-in tenants are generated, never wrong)."""
    from cockpit.cache import cache_root
    from cockpit.data import DataError, load_examples
    from cockpit.profiles import BUILTIN_PREFIX

    if profile.data.source.startswith(BUILTIN_PREFIX):
        return
    try:
        load_examples(Path(profile.data.source), profile.data, cache_dir=cache_root() / "datasets")
    except DataError as exc:
        raise LifecycleError(str(exc)) from None


def start(runs_dir: Path, profile_ref: str, overrides: Sequence[str], argv: list[str]) -> Launch:
    """Validate the profile (`ProfileError`) and its data, create a `planned` run record, start its
    supervisor."""
    profile, path = load_profile(profile_ref, list(overrides))
    check_runnable(profile, str(path))
    check_data(profile)
    check_trainer()
    return _spawn(create_run(runs_dir, profile, path, argv))


def eval_request(examples: int | None = None, time_budget_s: float | None = None) -> dict[str, Any] | None:
    """What `cockpit eval --examples/--time-budget` asks of the evaluation, over the profile's eval section
    (`trainer.evaluation.evaluate` reads it from run.json); None when neither is given."""
    asked = {"examples": examples, "time_budget_s": time_budget_s}
    return {k: v for k, v in asked.items() if v} or None


def start_eval(
    runs_dir: Path,
    profile_ref: str,
    models: Sequence[tuple[str, Path]],
    argv: list[str],
    request: dict[str, Any] | None = None,
) -> Launch:
    """An evaluation-only run: the profile's base model and every other model, side by side (`request`:
    `eval_request`'s sample)."""
    profile, path = load_profile(profile_ref)
    check_runnable(profile, str(path))
    check_data(profile)
    check_trainer()
    eval_args = [a for name, model in models for a in ("--model", f"{name}={Path(model).resolve()}")]
    extra = {"eval_request": request}
    return _spawn(create_run(runs_dir, profile, path, argv, mode="eval", eval_args=eval_args, extra=extra))


def gpus_here() -> int:
    """GPUs NVML sees on this machine (0 without any)."""
    from cockpit.hostinfo import gpu_inventory

    return len(gpu_inventory())


def start_rehearsal(
    runs_dir: Path,
    profile_ref: str,
    overrides: Sequence[str],
    layers: Sequence[int] | None,
    steps: int,
    gpus: int | None,
    argv: list[str],
    eval_tokens: int = 0,
) -> Launch:
    """A rehearsal: the profile's architecture sliced to each depth, random weights, on the GPUs at hand.
    `eval_tokens`: after each depth's steps, evaluation is timed on the slice, thinking that many tokens
    (0: not); `steps` 0 with it times only the evaluation.

    `layers` None: the profile's default depths (`cockpit.rehearse.figures.default_depths`), those past
    the prefetch window left out where they would not fit here. Refused before anything loads
    (`LifecycleError`) when a depth's slice does not fit this machine, when the model's config.json is
    not here, or when the loader cannot take random weights.
    """
    from cockpit.plan.inputs import PlanError, resolve_geometry
    from cockpit.profiles import profile_to_dict
    from cockpit.rehearse.figures import default_depths
    from cockpit.rehearse.measure import WARMUP_STEPS
    from cockpit.rehearse.run import RehearsalError, preflight, rehearsal_profile

    profile, path = load_profile(profile_ref, list(overrides))
    if profile.model.trust_remote_code:
        raise LifecycleError(
            f"{path}: model.trust_remote_code: a rehearsal draws random weights only for models "
            "Transformers builds itself"
        )
    if profile.model.loader != "layerwise":
        raise LifecycleError(
            f'{path}: model.loader: a rehearsal needs the layer-by-layer loader ("layerwise")'
        )
    depths = sorted(set(layers)) if layers is not None else []  # the defaults once the model is known
    if layers is not None and (len(depths) < 2 or depths[0] < 1):
        raise LifecycleError(
            f"--layers {','.join(map(str, layers))}: two different depths of at least one layer are needed "
            "to fit per-layer and fixed costs"
        )
    if steps <= WARMUP_STEPS and not (steps == 0 and eval_tokens):
        raise LifecycleError(
            f"--steps {steps}: at least {WARMUP_STEPS + 1} ({WARMUP_STEPS} warm up, the rest are timed)"
        )
    available = gpus_here()
    if gpus is not None and not 0 <= gpus <= available:
        raise LifecycleError(f"--gpus {gpus}: this machine has {available} GPU(s)")
    here = rehearsal_profile(profile, available if gpus is None else gpus)
    if not here.hardware.gpus and profile.training.bf16:
        raise LifecycleError(
            f"{path}: training.bf16: a bf16 rehearsal needs a GPU and "
            + ("this machine has none" if not available else "--gpus 0 gives it none")
            + "; rehearse where the run will train (`cockpit plan` models it anywhere), or add "
            "--set training.bf16=false for a CPU smoke test of the method"
        )
    try:
        geometry = resolve_geometry(profile)
    except PlanError as exc:  # no config.json to plan from
        raise LifecycleError(f"{path}: {exc}") from None
    if layers is None:
        depths = _default_depths_here(here, geometry, default_depths(profile, geometry.layers))
        if len(depths) < 2:
            raise LifecycleError(
                f"{path}: the model has {geometry.layers} decoder layer(s): a rehearsal fits per-layer and "
                "fixed costs over two depths at least"
            )
    if depths[-1] > geometry.layers:
        raise LifecycleError(
            f"--layers: depth {depths[-1]} is deeper than the model ({geometry.layers} layers)"
        )
    try:
        preflight(here, geometry, depths)  # every depth must fit here, not only the shallowest
    except RehearsalError as exc:
        raise LifecycleError(str(exc)) from None
    check_trainer()
    rehearsal = {
        "layers": depths,
        "steps": steps,
        "eval_tokens": eval_tokens,
        "target": profile.hardware.model_dump(),
        "target_profile": profile_to_dict(profile),
    }
    run_dir = create_run(
        runs_dir, here, path, argv, mode="rehearse", extra={"rehearsal": rehearsal}, plan_for=profile
    )
    return _spawn(run_dir)


def _default_depths_here(here: Any, geometry: Any, depths: list[int]) -> list[int]:
    """The default depths less those past `DEFAULT_LAYERS` that do not fit here, deepest dropped first (the
    shallow ones stay, for the preflight to refuse with its own reason when even they do not fit)."""
    from cockpit.rehearse.measure import DEFAULT_LAYERS
    from cockpit.rehearse.run import RehearsalError, preflight

    while True:
        try:
            preflight(here, geometry, depths)
            return depths
        except RehearsalError:
            extra = [d for d in depths if d not in DEFAULT_LAYERS]
            if not extra:
                return depths
            depths = [d for d in depths if d != max(extra)]


# --- join (a launch without ssh over several nodes) -----------------------------------------------------
def join(run_dir: Path, node_rank: int) -> Launch:
    """Start node `node_rank`'s supervisor (`cockpit.service.node`) on this machine for a run whose node 0 was
    started without ssh; it launches this node's ranks once node 0 has launched its own."""
    manifest = load_manifest(run_dir)
    profile = parse_profile(manifest["profile"], str(RunPaths(run_dir).manifest))
    nodes = profile.hardware.nodes
    if not profile.launcher.no_ssh or nodes < 2:
        raise LifecycleError(
            f"{run_dir.name}: nothing to join: its profile does not launch several nodes without ssh "
            "(launcher.no_ssh = true and hardware.nodes > 1)"
        )
    if not 0 < node_rank < nodes:
        raise LifecycleError(
            f"--node-rank {node_rank}: node 0 started the run; the nodes that join are 1..{nodes - 1}"
        )
    if manifest.get("status") not in ACTIVE:
        raise LifecycleError(f"{run_dir.name} has ended (status {manifest.get('status')}): nothing to join")
    check_trainer()
    return Launch(run_dir, spawn.spawn_node(run_dir, node_rank))


# --- stop --------------------------------------------------------------------------------------------
def request_stop(run_dir: Path) -> bool:
    """Ask for a checkpoint and a clean exit; False if a stop was already asked for."""
    return control.request_stop(run_dir)


def request_kill(run_dir: Path) -> None:
    """Ask the supervisor to kill the training processes now."""
    control.request_kill(run_dir)


def stop(run_dir: Path, kill: bool = False) -> StopOutcome:
    """Stop a planned or running run: a checkpoint and a clean exit first; a second stop (or `kill`) kills.

    With its supervisor lost and the training processes alive, nobody reads `control/kill`: the
    trainer still polls `control/stop` at every step, and a kill signals its process group from here,
    once `liveness` has proven the group the run's own. A stale record (its supervisor and trainer gone,
    their ids reused since) is marked ended, and the refusal says so.
    """
    lost = reconcile(run_dir)  # a run whose supervisor and trainer are both gone is not running any more
    manifest = load_manifest(run_dir)
    if manifest.get("status") not in ACTIVE:
        stale = f": {manifest.get('diagnosis')}" if lost else ""  # ended just now: why
        raise LifecycleError(f"{run_dir.name} is not running (status {manifest.get('status')}){stale}")
    state = liveness.check(run_dir, manifest)
    if manifest.get("status") == "running" and not state.supervisor_alive and state.trainer_alive:
        if kill or not request_stop(run_dir):
            _kill_group(manifest["trainer_pgid"])
            return StopOutcome.TRAINER_KILLED
        return StopOutcome.TRAINER_STOP_REQUESTED
    if kill or not request_stop(run_dir):
        request_kill(run_dir)
        return StopOutcome.KILL_REQUESTED
    return StopOutcome.STOP_REQUESTED


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # gone between the check and the kill
        os.killpg(pgid, signal.SIGKILL)


# --- resume, evaluate --------------------------------------------------------------------------------
def ended(run_dir: Path, refusal: str) -> None:
    """Refuse (`LifecycleError`, the message ending in `refusal`) unless the run has ended.

    A run whose supervisor and training processes are both gone is marked ended first.
    """
    reconcile(run_dir)
    status = load_manifest(run_dir).get("status")
    if status in ACTIVE:
        raise LifecycleError(f"{run_dir.name} is {status}{refusal}")


@dataclass(frozen=True)
class Resumed(Launch):
    """A resume just started: from which checkpoint (None: over from step 0), and what `--set` changed."""

    checkpoint: str | None = None
    changes: tuple[str, ...] = ()


SCHEDULE_FIELDS = ("training.max_steps", "training.epochs")


def last_checkpoint(run_dir: Path) -> str | None:
    """The newest complete checkpoint of a run (the one a resume starts from), if any."""
    from cockpit.record.checkpoints import last_complete_checkpoint

    return last_complete_checkpoint(RunPaths(run_dir).checkpoints)[0]


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, name + "."))
        else:
            out[name] = value
    return out


def _changed_profile(run_dir: Path, overrides: Sequence[str]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The run's profile with `overrides` applied and validated (`ProfileError`), and `field: old -> new`
    for each field that changed."""
    manifest = load_manifest(run_dir)
    before = manifest["profile"]
    data = apply_overrides(copy.deepcopy(before), list(overrides))
    anchor_set_paths(data, list(overrides), Path.cwd())  # a path given here is where the user stands
    after = profile_to_dict(parse_profile(data, f"{RunPaths(run_dir).manifest} (with --set overrides)"))
    old, new = _flat(before), _flat(after)
    changes = tuple(f"{k}: {old.get(k)!r} -> {new[k]!r}" for k in new if old.get(k) != new[k])
    return after, changes


def resume(run_dir: Path, overrides: Sequence[str] = (), from_scratch: bool = False) -> Resumed:
    """Continue an ended run from its last checkpoint, in the same record.

    Refused (`LifecycleError`, saying why) when there is no complete checkpoint, unless `from_scratch`
    (the run starts over from step 0), and for a finished run unless `overrides` extend its schedule
    (`training.max_steps` or `training.epochs`), and when the disk lacks the room its next checkpoint
    needs (`cockpit.service.disk_space`). `overrides` (`section.key=value`) change the profile
    the run continues with; the fields they changed are returned.
    """
    ended(run_dir, "; only an ended run can be resumed")
    _not_a_rehearsal(run_dir, "resumed: start a new rehearsal")
    check_trainer()
    manifest = load_manifest(run_dir)
    if manifest.get("mode") == "eval":
        raise LifecycleError(f"{run_dir.name} is an evaluation-only run: it has no training to resume")
    profile, changes = _changed_profile(run_dir, overrides)
    checkpoint = last_checkpoint(run_dir)
    status = manifest.get("status")
    if (manifest.get("training") or {}).get("status"):  # its evaluation ended last: the training's outcome
        status = manifest["training"]["status"]
    extended = any(c.split(":", 1)[0] in SCHEDULE_FIELDS for c in changes)
    if status == "finished" and not extended and not from_scratch:
        raise LifecycleError(
            f"{run_dir.name} finished its schedule; nothing to resume: extend it with "
            "--set training.max_steps=N (or training.epochs=N), or start a new run"
        )
    if from_scratch and checkpoint is not None:
        raise LifecycleError(
            f"{run_dir.name} has a checkpoint ({Path(checkpoint).name}): resume from it without "
            "--from-scratch, or start a new run"
        )
    if checkpoint is None and not from_scratch:
        raise LifecycleError(
            f"{run_dir.name} has no complete checkpoint in {RunPaths(run_dir).checkpoints} to resume from; "
            f"`cockpit resume {run_dir.name} --from-scratch` starts it over from step 0"
        )
    no_room = room_problem(run_dir, checkpoint)
    if no_room is not None:
        raise LifecycleError(no_room)
    _new_attempt(run_dir, training=None)
    if changes:
        update_manifest(run_dir, profile=profile)
    launch = _spawn(run_dir) if from_scratch else _spawn(run_dir, resume=True)
    return Resumed(run_dir, launch.process, checkpoint=None if from_scratch else checkpoint, changes=changes)


def _not_a_rehearsal(run_dir: Path, why: str) -> None:
    """Refuse a rehearsal (`why` says what it cannot be), and an imported log (curves only, no model)."""
    mode = load_manifest(run_dir).get("mode")
    if mode == "rehearse":
        raise LifecycleError(f"{run_dir.name} is a rehearsal and cannot be {why}")
    if mode == "import":
        verb = why.split(":")[0]
        raise LifecycleError(f"{run_dir.name} is an imported log (its curves only) and cannot be {verb}")


def _new_attempt(
    run_dir: Path, training: dict[str, Any] | None, request: dict[str, Any] | None = None
) -> None:
    """Clear the last attempt's requests and put the run back to `planned` before a new owner starts, as for
    a new run: a viewer must not take the old final status for this attempt's. `request`: this attempt's
    evaluation sample (`eval_request`; none: the profile's)."""
    control.clear_requests(run_dir)  # the last attempt's stop must not stop this one
    update_manifest(
        run_dir,
        status="planned",
        diagnosis=None,
        exit_code=None,
        ended_at=None,
        training=training,
        evaluation=None,
        eval_request=request,
    )


def evaluate(
    run_dir: Path, models: Sequence[tuple[str, Path]] = (), request: dict[str, Any] | None = None
) -> Launch:
    """Score an ended run's base model and adapter (and other models) under a new supervisor; `request`:
    `eval_request`'s sample, else the profile's eval section decides.

    The run keeps its training's status; the evaluation's outcome is added to the diagnosis and kept
    as `evaluation` (see `last_evaluation`).
    """
    ended(run_dir, ": evaluate it once it has ended")
    _not_a_rehearsal(run_dir, "evaluated: its weights are random")
    check_trainer()
    manifest = load_manifest(run_dir)
    training = manifest.get("training")
    if training is None and manifest.get("mode", "train") == "train":  # a record from before `training`
        training = {k: manifest.get(k) for k in ("status", "diagnosis", "exit_code")}
    _new_attempt(run_dir, training, request)
    named = [f"{name}={Path(path).resolve()}" for name, path in models]
    return _spawn(run_dir, eval_models=named)


def last_evaluation(run_dir: Path) -> Evaluation | None:
    """How the run's last evaluation ended, if one has."""
    found = load_manifest(run_dir).get("evaluation")
    return Evaluation(**found) if found else None


# --- a lost supervisor -------------------------------------------------------------------------------
def reconcile(run_dir: Path) -> str | None:
    """For a run marked running whose supervisor is gone: a warning, and a final status if all is gone.

    Returns None when the run is not in that state. A lost evaluation of an ended run leaves the
    training's status and adds the loss to its diagnosis.
    """
    manifest = load_manifest(run_dir)
    if manifest.get("status") != "running":
        return None
    state = liveness.check(run_dir, manifest)
    if state.supervisor_alive:
        return None
    if state.trainer_alive:
        return (
            f"supervisor lost: training processes still running (group {manifest.get('trainer_pgid')}); "
            "nothing will diagnose or evaluate this run: `cockpit stop` ends them"
        )
    foreign = state.group.foreign() if state.group else None
    lost = f"{LOST}; {foreign}" if foreign else LOST  # a stale record: its group id is someone else's now
    training = manifest.get("training")
    if training:  # an ended run's evaluation was under way
        manifest.update(
            status=training["status"],
            diagnosis=f"{training.get('diagnosis') or training['status']}; {lost}",
            exit_code=training.get("exit_code"),
            evaluation=asdict(Evaluation("failed", lost)),
        )
    else:  # the trainer's own last words: a clean stop, or the end of its schedule, is not a failure
        status, said = lost_verdict(run_dir, last_checkpoint(run_dir))
        lost = lost if said == LOST else said
        manifest.update(status=status, diagnosis=lost)
    manifest["ended_at"] = time.time()
    write_manifest(run_dir, manifest)
    return lost
