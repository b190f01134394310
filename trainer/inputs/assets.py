"""Where a profile's model and data are on this machine: its own folders, or the built-in tiny model
(`trainer.inputs.tiny`) and tenants (`cockpit.data.builtin`), built on a first run and cached after."""

from __future__ import annotations

from pathlib import Path

from cockpit.profiles import BUILTIN_PREFIX, Profile


def setup_words(profile: Profile) -> str:
    """What the setup phase does, for the viewers: the built-in assets are built on a first run."""
    from trainer.inputs import tiny

    d = profile.data
    builtin = profile.model.path.startswith(BUILTIN_PREFIX) or d.source.startswith(BUILTIN_PREFIX)
    if builtin and not tiny.built(d.seed, d.train_examples_per_tenant, d.eval_examples_per_tenant):
        return "building the built-in model, tokenizer and data (first run; cached after)"
    return "reading and tokenizing the training data"


def resolve_assets(profile: Profile) -> tuple[str, Path]:
    """The model directory and data file of a profile, building the built-in ones if needed."""
    from cockpit.data import builtin
    from trainer.inputs import tiny

    model_dir = (
        str(tiny.model_path(seed=0)) if profile.model.path.startswith(BUILTIN_PREFIX) else profile.model.path
    )
    data = profile.data
    if data.source.startswith(BUILTIN_PREFIX):
        return model_dir, builtin.data_path(
            data.seed, data.train_examples_per_tenant, data.eval_examples_per_tenant
        )
    return model_dir, Path(data.source)
