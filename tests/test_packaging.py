"""How the project installs: its dependency ranges and what a wheel carries."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def _requirement(name: str) -> Requirement:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    found = [Requirement(r) for r in pyproject["project"]["dependencies"] if Requirement(r).name == name]
    assert len(found) == 1, f"{name} is not declared once in pyproject.toml"
    return found[0]


@pytest.mark.parametrize(
    ("version", "accepted"),
    [
        ("2.11.0a0+gitabc", True),  # NVIDIA's container build: pip must keep it, not replace it
        ("2.11.0", True),
        ("2.13.0", True),
        ("2.14.1+cu128", True),
        ("2.10.1", False),
        ("2.15.0", False),
    ],
)
def test_torch_range_keeps_container_builds(version: str, accepted: bool) -> None:
    assert _requirement("torch").specifier.contains(version) is accepted
