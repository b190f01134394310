"""Run profiles: one TOML file per run, validated field by field before anything starts.

A profile says which model to tune on which hardware, how to quantize it, where DeepSpeed puts
parameters and optimizer state, and what to train and evaluate on. The rooms:

- `schema`: the sections as pydantic models, each field described (`Profile` and its sections);
- `load`: `load_profile` turns a file (or a name from `./profiles/` or the shipped ones) into a `Profile`,
  or raises `ProfileError` whose message names the file, the field and what was expected;
- `checks`: what a run needs of this machine (`check_runnable`, `check_hosts`);
- `shipped`: where the shipped profiles are, and the built-in model and data names.

Every public name is importable from `cockpit.profiles` itself. Imports no torch.
"""

from cockpit.profiles.checks import TOKENIZER_FILES, WEIGHT_FILES, check_hosts, check_runnable
from cockpit.profiles.load import (
    ANCHORED,
    ProfileError,
    anchor_set_paths,
    apply_overrides,
    load_profile,
    parse_profile,
    profile_names,
    resolve_profile_path,
)
from cockpit.profiles.schema import (
    MAX_GPU_MEM_GIB,
    MAX_GPUS,
    MAX_HOST_RAM_GIB,
    MAX_NODES,
    ColumnsSpec,
    CostSpec,
    DataSpec,
    DeepSpeedSpec,
    EvalSpec,
    HardwareSpec,
    LauncherSpec,
    LoraSpec,
    ModelSpec,
    Profile,
    QuantizationSpec,
    TrainingSpec,
    ValidationSpec,
    profile_to_dict,
)
from cockpit.profiles.shipped import (
    BUILTIN_DATA,
    BUILTIN_MODELS,
    BUILTIN_PREFIX,
    DEFAULT_PROFILE,
    PROFILES_DIR,
    shipped_profiles_dir,
)

__all__ = [
    "ANCHORED",
    "BUILTIN_DATA",
    "BUILTIN_MODELS",
    "BUILTIN_PREFIX",
    "DEFAULT_PROFILE",
    "MAX_GPUS",
    "MAX_GPU_MEM_GIB",
    "MAX_HOST_RAM_GIB",
    "MAX_NODES",
    "PROFILES_DIR",
    "TOKENIZER_FILES",
    "WEIGHT_FILES",
    "ColumnsSpec",
    "CostSpec",
    "DataSpec",
    "DeepSpeedSpec",
    "EvalSpec",
    "HardwareSpec",
    "LauncherSpec",
    "LoraSpec",
    "ModelSpec",
    "Profile",
    "ProfileError",
    "QuantizationSpec",
    "TrainingSpec",
    "ValidationSpec",
    "anchor_set_paths",
    "apply_overrides",
    "check_hosts",
    "check_runnable",
    "load_profile",
    "parse_profile",
    "profile_names",
    "profile_to_dict",
    "resolve_profile_path",
    "shipped_profiles_dir",
]
