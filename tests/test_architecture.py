"""The layers' one-way arrows (ARCHITECTURE.md), checked on the source: no import loops, no forbidden edge."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from devtools.import_graph import cycles, graph, modules

ROOT = Path(__file__).resolve().parent.parent
# (importer prefix, imported prefixes it must never reach): lazy imports count too.
FORBIDDEN = [
    (
        "cockpit.record",
        ("cockpit.plan", "cockpit.report", "cockpit.rehearse", "cockpit.app", "cockpit.service.lifecycle"),
    ),
    ("cockpit.contract", ("cockpit.", "trainer")),
    (
        "cockpit.plan",
        ("trainer", "cockpit.report", "cockpit.rehearse", "cockpit.app", "cockpit.service.lifecycle"),
    ),
    ("cockpit.report", ("trainer", "cockpit.plan", "cockpit.app", "cockpit.service.lifecycle")),
    ("cockpit.rehearse", ("trainer", "cockpit.app")),
    (
        "cockpit.importers",
        ("cockpit.app", "cockpit.service.lifecycle", "cockpit.plan", "cockpit.report", "trainer"),
    ),
    ("cockpit.export", ("cockpit.app", "cockpit.service.lifecycle", "trainer")),
    ("cockpit.compare", ("cockpit.app", "cockpit.service.lifecycle", "trainer")),
    (
        "cockpit.data",
        (
            "cockpit.plan",
            "cockpit.report",
            "cockpit.rehearse",
            "cockpit.app",
            "cockpit.service.lifecycle",
            "cockpit.cli",
        ),
    ),
    ("cockpit", ("benchmarks", "tests")),
    ("trainer", ("cockpit.app", "cockpit.service.lifecycle", "cockpit.cli", "benchmarks", "tests")),
]
CORE_EXCEPT = "cockpit.app"


def forbidden_edges(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    found = []
    for importer, targets in edges.items():
        for source, banned in FORBIDDEN:
            if importer == source or importer.startswith(source + "."):
                found += [(importer, t) for t in targets if any(t == b or t.startswith(b) for b in banned)]
    return sorted(set(found))


def test_no_import_loops() -> None:
    assert cycles(graph(ROOT, ("cockpit", "trainer", "benchmarks"))) == []


def test_no_forbidden_edges() -> None:
    assert forbidden_edges(graph(ROOT, ("cockpit", "trainer", "benchmarks"))) == []


def test_the_core_imports_no_textual() -> None:
    """Only cockpit.app may import Textual (lazy imports included)."""
    offenders = []
    for name, path in modules(ROOT, ("cockpit",)).items():
        if name == CORE_EXCEPT or name.startswith(CORE_EXCEPT + "."):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            offenders += [(name, n) for n in names if n.split(".")[0] in ("textual", "textual_plotext")]
    assert offenders == []


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """A planted loop and a planted forbidden edge are found."""
    for package, files in {
        "cockpit": {
            "__init__.py": "",
            "record/__init__.py": "",
            "record/view.py": "from cockpit.plan.model import x\n",
            "plan/__init__.py": "",
            "plan/model.py": "def f():\n    from cockpit.plan import other\n",
            "plan/other.py": "from cockpit.plan.model import f\n",
        },
        "trainer": {"__init__.py": ""},
    }.items():
        for rel, text in files.items():
            path = tmp_path / package / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    edges = graph(tmp_path)
    assert cycles(edges) == [["cockpit.plan.model", "cockpit.plan.other"]]
    assert forbidden_edges(edges) == [("cockpit.record.view", "cockpit.plan.model")]


@pytest.mark.parametrize("layer", ["cockpit.record", "cockpit.contract", "cockpit.profiles"])
def test_the_ground_floor_imports_no_torch(layer: str) -> None:
    """The record, the contract and the profiles are read by viewers that never load torch."""
    for name, path in modules(ROOT, ("cockpit",)).items():
        if name == layer or name.startswith(layer + "."):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
            assert not any(m.split(".")[0] == "torch" for m in imported), name
