"""One clock for every viewer."""

from __future__ import annotations

import pytest

from cockpit.record.units import clock

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
