"""The layers' rules, checked on the source (`devtools.layers` is the table they read).

Each check returns what breaks its rule (empty when none does), so a test can assert on the real tree
and on a planted one alike. Imports are read with `ast` (lazy ones and `if TYPE_CHECKING:` ones
included: a module that names another's types knows its shape); nothing is imported to read them.
"""

from __future__ import annotations

import ast
from pathlib import Path

from devtools.import_graph import cycles, graph, modules
from devtools.layers import PROCESS_OWNERS, STARTED_NOT_IMPORTED, claims, layer_of, room_of

PACKAGES = ("cockpit", "trainer")
PROCESS_MODULES = ("subprocess", "multiprocessing")
SIGNAL_CALLS = ("kill", "killpg")  # os.kill, os.killpg


def edges_of(root: Path) -> dict[str, set[str]]:
    """Module -> the project modules it imports, type-checking imports included."""
    return graph(root, PACKAGES, type_checking=True)


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs where the imported module's floor is above the importer's."""
    found = []
    for importer, targets in edges.items():
        mine = layer_of(importer)
        for target in targets:
            theirs = layer_of(target)
            if mine and theirs and theirs[1] > mine[1]:
                found.append((importer, target))
    return sorted(found)


def into_started(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports of a package that is started as a process, from outside it (`STARTED_NOT_IMPORTED`)."""
    return sorted(
        (importer, target)
        for importer, targets in edges.items()
        for target in targets
        for started in STARTED_NOT_IMPORTED
        if claims(started, target) and not claims(started, importer)
    )


def room_loops(edges: dict[str, set[str]]) -> list[list[str]]:
    """Loops between rooms (folders and loose modules), which a loop-free module graph can still hide."""
    rooms: dict[str, set[str]] = {}
    for importer, targets in edges.items():
        mine = room_of(importer)
        rooms.setdefault(mine, set()).update(room_of(t) for t in targets if room_of(t) != mine)
    return cycles(rooms)


def module_loops(edges: dict[str, set[str]]) -> list[list[str]]:
    return cycles(edges)


def unclaimed(root: Path) -> list[str]:
    """Modules under the packages that no layer claims."""
    return sorted(m for m in modules(root, PACKAGES) if layer_of(m) is None)


def process_calls(root: Path) -> list[str]:
    """`module: what` for each import of subprocess or multiprocessing and each os.kill / os.killpg call
    outside the rooms that own processes."""
    found = []
    for name, path in modules(root, PACKAGES).items():
        if any(claims(owner, name) for owner in PROCESS_OWNERS):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found += [
                    f"{name}: import {a.name}" for a in node.names if a.name.split(".")[0] in PROCESS_MODULES
                ]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                if node.module.split(".")[0] in PROCESS_MODULES:
                    found.append(f"{name}: from {node.module} import")
                elif node.module == "os":
                    found += [
                        f"{name}: from os import {a.name}" for a in node.names if a.name in SIGNAL_CALLS
                    ]
            elif (
                isinstance(node, ast.Attribute)
                and node.attr in SIGNAL_CALLS
                and isinstance(node.value, ast.Name)
                and node.value.id == "os"
            ):
                found.append(f"{name}: os.{node.attr}")
    return sorted(found)


def private_imports(root: Path, importers: tuple[str, ...] = ("benchmarks",)) -> list[str]:
    """`module: name` for each underscore name a tool imports from the product (its internals)."""
    found = []
    for name, path in modules(root, importers).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.ImportFrom)
                and not node.level
                and node.module
                and node.module.split(".")[0] in PACKAGES
            ):
                found += [
                    f"{name}: {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    return sorted(found)
