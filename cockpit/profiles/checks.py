"""What a profile needs of this machine before a run starts: the model's files, the data, the trackers, and
the hosts of the launcher's hostfile (each missing piece named, as a `ProfileError`)."""

from __future__ import annotations

from pathlib import Path

from cockpit.launcher import selection_problem
from cockpit.profiles.load import ProfileError
from cockpit.profiles.schema import Profile
from cockpit.profiles.shipped import BUILTIN_DATA, BUILTIN_MODELS, BUILTIN_PREFIX
from cockpit.textfile import NotUtf8, read_utf8
from cockpit.trackers import tracker_problems

WEIGHT_FILES = ("*.safetensors", "*.bin")  # a checkpoint's shards, as Transformers writes them
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def check_runnable(profile: Profile, source: str) -> None:
    """What a run needs here before it starts: the model (config, weights, tokenizer), the data, and the
    trackers of `training.report_to` able to start. Every missing piece is named, in one line."""
    problems = _model_problems(profile.model.path) + _data_problems(profile.data.source)
    paths = " (set them with --set KEY=PATH)" if problems else ""
    if problems := problems + tracker_problems(profile.training.report_to):
        raise ProfileError(f"{source}: " + "; ".join(problems) + paths)
    check_hosts(profile, source)


def _model_problems(spec: str) -> list[str]:
    if spec.startswith(BUILTIN_PREFIX):
        if spec not in BUILTIN_MODELS:
            return [f"model.path: unknown built-in model {spec!r} (known: {', '.join(BUILTIN_MODELS)})"]
        return []
    folder = Path(spec).expanduser()
    if not (folder / "config.json").is_file():
        return [f"model.path: no config.json in {spec!r} on this machine"]
    missing = []
    if not any(next(folder.glob(pattern), None) for pattern in WEIGHT_FILES):
        missing.append("weights (*.safetensors)")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        missing.append("tokenizer (tokenizer.json)")
    return [f"model.path: no {' and no '.join(missing)} in {spec!r}"] if missing else []


def _data_problems(data: str) -> list[str]:
    if data.startswith(BUILTIN_PREFIX):
        if data not in BUILTIN_DATA:
            return [f"data.source: unknown built-in data {data!r} (known: {', '.join(BUILTIN_DATA)})"]
        return []
    if not Path(data).expanduser().exists():
        return [f"data.source: no such file or folder {data!r}"]
    return []


def check_hosts(profile: Profile, source: str) -> None:
    """The hosts the launcher will use are the run's plan: `hardware.nodes` of the hostfile's hosts, each
    with a slot for each of its ranks (`ProfileError` naming the field otherwise)."""
    spec = profile.launcher
    if not spec.hostfile:
        if profile.hardware.nodes > 1:
            raise ProfileError(
                f"{source}: hardware.nodes: {profile.hardware.nodes} nodes need launcher.hostfile "
                "(DeepSpeed's launcher finds the other hosts there)"
            )
        return
    try:
        text = read_utf8(Path(spec.hostfile).expanduser())
    except (OSError, NotUtf8) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise ProfileError(f"{source}: launcher.hostfile: cannot read {spec.hostfile!r}: {why}") from None
    problem = selection_problem(spec, profile.hardware.nodes, profile.ranks_per_node, text)
    if problem:
        raise ProfileError(f"{source}: {problem} ({spec.hostfile})")
