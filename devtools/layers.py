"""The one table of layers: each folder (or loose module) of the cockpit and the rank of its floor.

A module may import its own floor and the floors below it, never a higher one. `tests/test_architecture.py`
holds the code to it (lazy and type-checking imports included, no loop between rooms, no module that no
layer claims, processes only from the service), and `benchmarks/architecture.py` reports from it.
ARCHITECTURE.md draws the same picture in words.
"""

from __future__ import annotations

# (layer, rank, module prefixes): the lower the rank, the lower the floor. A prefix claims the module of
# that name and every module under it.
LAYERS: tuple[tuple[str, float, tuple[str, ...]], ...] = (
    ("ground: the run record", 0, ("cockpit.record", "cockpit.units")),
    (
        "shared facts",
        1,
        (
            "cockpit.contract",
            "cockpit.profiles",
            "cockpit.launcher",
            "cockpit.hostinfo",
            "cockpit.cache",
            "cockpit.model_cache",
            "cockpit.limits",
            "cockpit.textfile",
            "cockpit.trackers",
            "cockpit.ranks",
        ),
    ),
    ("the user's data and DeepSpeed's ops", 2, ("cockpit.data", "cockpit.ops")),
    (
        "models",
        3,
        (
            "cockpit.plan",
            "cockpit.report",
            "cockpit.rehearse",
            "cockpit.importers",
            "cockpit.compare",
            "cockpit.export",
            "cockpit.predictions",
        ),
    ),
    # The trainer, a process of its own, is floor 4; its rooms stand on steps of it, the run at the top.
    (
        "the trainer's shared pieces",
        4.0,
        (
            "trainer.nf4_pack",
            "trainer.fast_path",
            "trainer.pass_through",
            "trainer.ds_config",
            "trainer.distributed",
        ),
    ),
    ("the trainer's kernels", 4.1, ("trainer.kernels",)),
    ("the trainer's inputs", 4.2, ("trainer.inputs",)),
    ("the trainer's layers", 4.3, ("trainer.layers",)),
    ("the trainer's weights", 4.4, ("trainer.weights",)),
    ("the trainer's model", 4.5, ("trainer.model",)),
    ("the trainer's evaluation", 4.6, ("trainer.evaluation",)),
    ("the trainer's run (a process of its own)", 4.7, ("trainer",)),
    ("service: every process", 5, ("cockpit.service",)),
    ("front ends", 6, ("cockpit.cli", "cockpit.headless", "cockpit.app", "cockpit.__main__")),
)
# Modules claimed by name alone (a prefix of theirs would claim everything under them).
FACES = {"cockpit": ("the package's face", 0)}
# Rooms no other room may import at all, whatever its floor: the trainer is started as a process.
STARTED_NOT_IMPORTED = ("trainer",)
# Where processes are started or signalled: `subprocess`, `os.kill`, `os.killpg` nowhere else in cockpit/.
PROCESS_OWNERS = ("cockpit.service",)
# Above every layer: they may import any of it (through its public names; see the test).
TOOLS = ("benchmarks", "devtools", "screenshots", "tests")


def claims(prefix: str, module: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> tuple[str, float] | None:
    """The layer and rank of `module` (the longest prefix that claims it), or None."""
    if module in FACES:
        return FACES[module]
    best: tuple[int, str, float] | None = None
    for name, rank, prefixes in LAYERS:
        for prefix in prefixes:
            if claims(prefix, module) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), name, rank)
    return None if best is None else (best[1], best[2])


def room_of(module: str) -> str:
    """The room a module lives in: its folder under cockpit/ or trainer/ (`cockpit.plan`, `trainer.layers`),
    or a loose module of either (`cockpit.compare`, `trainer.recipe`); anything else, its top package."""
    parts = module.split(".")
    if parts[0] not in ("cockpit", "trainer") or len(parts) == 1:
        return parts[0]
    return ".".join(parts[:2])
