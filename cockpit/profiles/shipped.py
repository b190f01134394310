"""What ships with the cockpit: the profiles (found where the cockpit is installed, or in a checkout), the
default profile's name, and the names of the built-in model and data, which the trainer builds locally."""

from __future__ import annotations

from pathlib import Path


def shipped_profiles_dir() -> Path:
    """The shipped profiles (and the story's config.json beside them): the package data
    `cockpit.shipped_profiles` where the cockpit is installed (a wheel, or editable: the checkout's
    `profiles/`), else a checkout's `profiles/` beside `cockpit/` (run from the source, unbuilt)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("cockpit.shipped_profiles")
    except ImportError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).resolve()
    return Path(__file__).resolve().parents[2] / "profiles"


PROFILES_DIR = shipped_profiles_dir()
DEFAULT_PROFILE = "tiny-cpu"
BUILTIN_PREFIX = "builtin:"
BUILTIN_MODELS = ("builtin:tiny-qwen3-moe",)
BUILTIN_DATA = ("builtin:tiny-tenants",)
