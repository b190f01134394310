"""The layers, held by the code: one table (`devtools/layers.py`), its rules (`devtools/checks.py`).

Every module of cockpit/ and trainer/ belongs to a layer; a module imports its own floor or lower (lazy
and type-checking imports count); no loop between modules or between rooms (folders); nothing in cockpit/
imports the trainer, which is started as a process; only the service starts or signals processes; the
core never imports Textual; the ground floor and the shared facts never import torch; benchmarks use
the product's public names. Each rule is also shown to fail on a tree planted with what it forbids.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from devtools import checks
from devtools.import_graph import modules
from devtools.layers import LAYERS, claims, layer_of

ROOT = Path(__file__).resolve().parent.parent
EDGES = checks.edges_of(ROOT)


def test_every_module_belongs_to_a_layer() -> None:
    assert checks.unclaimed(ROOT) == []


def test_no_import_reaches_a_higher_floor() -> None:
    assert checks.upward(EDGES) == []


def test_nothing_imports_the_trainer_which_is_started_as_a_process() -> None:
    assert checks.into_started(EDGES) == []


def test_no_loops_between_modules_or_between_rooms() -> None:
    assert checks.module_loops(EDGES) == []
    assert checks.room_loops(EDGES) == []


def test_only_the_service_starts_or_signals_processes() -> None:
    assert checks.process_calls(ROOT) == []


def test_benchmarks_use_the_products_public_names() -> None:
    assert checks.private_imports(ROOT) == []


def test_the_core_imports_no_textual() -> None:
    """Only cockpit.app may import Textual (lazy imports included)."""
    offenders = []
    for name, path in modules(ROOT, ("cockpit",)).items():
        if claims("cockpit.app", name):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            offenders += [(name, n) for n in names if n.split(".")[0] in ("textual", "textual_plotext")]
    assert offenders == []


@pytest.mark.parametrize("floor", [0, 1])
def test_the_lowest_floors_import_no_torch(floor: int) -> None:
    """The record and the shared facts are read by viewers that never load torch."""
    for name, path in modules(ROOT, ("cockpit",)).items():
        if (layer_of(name) or ("", 99))[1] != floor:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not any(m.split(".")[0] == "torch" for m in imported), name


MODULE_LINES = 500  # the most lines a module of the product may have (one job a module)


def test_no_module_is_over_its_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for folder in ("cockpit", "trainer")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MODULE_LINES
    }
    assert not long, f"over {MODULE_LINES} lines: {long}"


def test_the_table_names_each_folder_once() -> None:
    prefixes = [p for _, _, ps in LAYERS for p in ps]
    assert len(prefixes) == len(set(prefixes))
    ranks = [rank for _, rank, _ in LAYERS]
    assert ranks == sorted(ranks)


def _plant(root: Path, files: dict[str, str]) -> Path:
    for rel, text in {"cockpit/__init__.py": "", "trainer/__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_each_rule_fails_on_a_planted_tree(tmp_path: Path) -> None:
    """An import up a floor (a type-checking one, a lazy one, one between the trainer's rooms), a loop
    between rooms that no two modules close, a module no layer claims, a process started from a model,
    the trainer imported, a benchmark's reach into a private name: each is found and named."""
    root = _plant(
        tmp_path,
        {
            "cockpit/record/__init__.py": "",
            "cockpit/record/view.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from cockpit.plan.inputs import Setup\n"
            ),
            "cockpit/plan/__init__.py": "",
            "cockpit/plan/inputs.py": "def f():\n    from cockpit.service.runs import find_run\n",
            "cockpit/plan/speed.py": "from cockpit.report.model import Report\n",
            "cockpit/report/__init__.py": "",
            "cockpit/report/model.py": "import subprocess\n",
            "cockpit/report/bars.py": "from cockpit.plan.inputs import f\n",
            "cockpit/service/__init__.py": "",
            "cockpit/service/runs.py": "import os\ndef stop(p):\n    os.kill(p, 9)\n",
            "cockpit/loose.py": "",
            "cockpit/compare.py": "from trainer import evaluate\n",
            "trainer/evaluate.py": "def _row_logprobs():\n    pass\n",
            "trainer/layers/__init__.py": "",
            "trainer/layers/rope.py": "def f():\n    from trainer.evaluation.decode import step\n",
            "trainer/evaluation/__init__.py": "",
            "trainer/layers/loss.py": "def g():\n    pass\n",
            "trainer/evaluation/decode.py": "def step():\n    pass\n",
            "trainer/evaluation/validation.py": "from trainer.layers.loss import g\n",
            "benchmarks/__init__.py": "",
            "benchmarks/score.py": "from trainer.evaluate import _row_logprobs\n",
        },
    )
    edges = checks.edges_of(root)
    assert checks.upward(edges) == [
        ("cockpit.compare", "trainer.evaluate"),  # the trainer's floor is above the models' too
        ("cockpit.plan.inputs", "cockpit.service.runs"),
        ("cockpit.record.view", "cockpit.plan.inputs"),
        ("trainer.layers.rope", "trainer.evaluation.decode"),  # the trainer's rooms are steps of its floor
    ]
    assert checks.room_loops(edges) == [
        ["cockpit.plan", "cockpit.report"],
        ["trainer.evaluation", "trainer.layers"],
    ]
    assert checks.module_loops(edges) == []  # the loop is between rooms only
    assert checks.unclaimed(root) == ["cockpit.loose"]
    assert checks.process_calls(root) == [
        "cockpit.report.model: import subprocess"
    ]  # the service's is its own
    assert checks.into_started(edges) == [("cockpit.compare", "trainer.evaluate")]
    assert checks.private_imports(root) == ["benchmarks.score: trainer.evaluate._row_logprobs"]
