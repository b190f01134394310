"""Sizes in the plan's text read at any scale: the tiny model's KB and MiB, the story's GB and GiB."""

from __future__ import annotations

import pytest

from cockpit.cli import main
from cockpit.plan.units import common_unit, size


def test_size_picks_the_unit_that_fits() -> None:
    assert size(470.2e9, binary=False) == "470.2 GB"
    assert size(262_144, binary=False) == "262.1 KB"
    assert size(12) == "12 B"
    assert size(1.5 * 1024**2) == "1.5 MiB"
    assert size(2.4 * 1024**3) == "2.4 GiB"
    assert size(5000 * 1024**3) == "5,000.0 GiB"  # GiB at most: the story's figures stay in GiB
    assert common_unit([0.7 * 1024**3, 4 * 1024**2]) == ("MiB", 1024**2)
    assert common_unit([0.0]) == ("GiB", 1024**3)


def test_the_tiny_plan_prints_no_zero_sizes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["plan", "--profile", "tiny-cpu", "--host-ram-gib", "24"]) == 0
    out = capsys.readouterr().out
    for zero in ("0.0 GB", "0.0 GiB", "0.0 MB", "0.0 MiB"):
        assert zero not in out, zero
    assert "MB instead of" in out and "MiB of page cache" in out


def test_the_story_plan_keeps_its_units(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["plan", "--profile", "qwen3-235b-a22b-thinking-4xh100"]) == 0
    out = capsys.readouterr().out
    for words in (
        "470.2 GB",
        "GiB per GPU and for the whole host",
        "437.9 GiB of page cache",
        "30.3 GiB of 73.6 GiB usable",
    ):
        assert words in out, words
    assert "0.0 GB" not in out
