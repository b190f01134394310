"""The one byte and duration formatter (`cockpit.units`): sizes in the plan's text read at any scale (the
tiny model's KB and MiB, the story's GB and GiB), memory readings as every viewer shows them, one clock."""

from __future__ import annotations

import pytest

from cockpit.cli import main
from cockpit.units import about, clock, common_unit, hours, memory, size


def test_size_picks_the_unit_that_fits() -> None:
    assert size(470.2e9, binary=False) == "470.2 GB"
    assert size(262_144, binary=False) == "262.1 KB"
    assert size(12) == "12 B"
    assert size(1.5 * 1024**2) == "1.5 MiB"
    assert size(2.4 * 1024**3) == "2.4 GiB"
    assert size(5000 * 1024**3) == "5,000.0 GiB"  # GiB at most: the story's figures stay in GiB
    assert common_unit([0.7 * 1024**3, 4 * 1024**2]) == ("MiB", 1024**2)
    assert common_unit([0.0]) == ("GiB", 1024**3)


def test_a_size_against_a_limit_set_in_mib_stays_in_mib() -> None:
    assert size(1.2 * 1024**3, largest="MiB") == "1,228.8 MiB"
    assert size(2048, largest="MiB") == "2.0 KiB"
    assert size(0, largest="MiB") == "0.0 MiB"


def test_memory_readings_in_gib_from_one_gib_and_whole_mib_under_it() -> None:
    assert memory(754.4) == "754 MiB"
    assert memory(2.3 * 1024) == "2.3 GiB"
    assert memory(2.3 * 1024, digits=2) == "2.30 GiB"
    assert (memory(23.5 * 1024, short=True), memory(743, short=True)) == ("23.5G", "743M")
    assert memory(-2048, short=True) == "-2.0G"
    assert memory(512, digits=2, short=True, in_gib=True) == "0.50G"  # an axis that spans GiB
    assert memory(None) == "-"


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
        "47.3 GiB of 73.6 GiB usable",
    ):
        assert words in out, words
    assert "0.0 GB" not in out


CASES = [(0, "0:00"), (59.9, "0:59"), (65, "1:05"), (3599, "59:59"), (3600, "1:00:00"), (93784, "26:03:04")]


@pytest.mark.parametrize(("seconds", "text"), [*CASES, (-3, "0:00")])
def test_clock_reads_minutes_then_hours(seconds: float, text: str) -> None:
    assert clock(seconds) == text


def test_log_lines_pad_the_minutes_so_stamps_align() -> None:
    assert [clock(s, padded=True) for s, _ in CASES] == [
        "00:00", "00:59", "01:05", "59:59", "1:00:00", "26:03:04",
    ]  # fmt: skip


def test_an_unknown_duration_says_so() -> None:
    assert clock(None) == "--:--"
    assert clock(None, unknown="-") == "-"
    assert hours(None) == "-"


def test_rough_durations_and_hours() -> None:
    assert [about(s) for s in (0.2, 40, 240, 5400)] == ["1 s", "40 s", "4 min", "1.5 h"]
    assert hours(1440) == "0.40 h"
