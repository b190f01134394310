"""The project's own import graph, read from the source (lazy imports inside functions included).

Used by the architecture test (the layers' one-way arrows, no loops; `devtools.checks`) and by
`benchmarks/architecture.py` (who imports each layer). Pure `ast`: nothing is imported to read it.
Imports under `if TYPE_CHECKING:` never run: they are left out unless asked for (`type_checking=True`,
what the layers' rules read: a module that names another's types knows its shape).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

PACKAGES = ("cockpit", "trainer", "benchmarks", "tests", "devtools")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules(root: Path, packages: Iterable[str] = ("cockpit", "trainer")) -> dict[str, Path]:
    """Every module of the packages under `root`, by dotted name."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "__snapshots__" not in path.parts:
                found[module_name(root, path)] = path
    return found


def _resolve(current: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = current.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(name: str, path: Path, known: set[str], type_checking: bool = False) -> set[str]:
    """The project modules `name` imports (a `from package import submodule` counts the submodule)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree) if type_checking else _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(name, path.name == "__init__.py", node)
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] in PACKAGES:
                found.add(target)
    found.discard(name)
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> Iterable[ast.AST]:
    """Every node except those under `if TYPE_CHECKING:` (its `else` branch runs, so it is kept)."""
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and _type_checking(node):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def graph(
    root: Path, packages: Iterable[str] = ("cockpit", "trainer"), type_checking: bool = False
) -> dict[str, set[str]]:
    """Module -> the project modules it imports (with `type_checking`, those under `if TYPE_CHECKING:`)."""
    mods = modules(root, packages)
    known = set(mods)
    return {name: imports_of(name, path, known, type_checking) for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Import loops: strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out
