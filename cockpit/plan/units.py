"""Byte counts in the unit that fits their size: a tiny model's 300 KB reads as such, not as 0.0 GB."""

from __future__ import annotations

from collections.abc import Iterable

DECIMAL = (("GB", 1000**3), ("MB", 1000**2), ("KB", 1000), ("B", 1))
BINARY = (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024), ("B", 1))


def unit_for(n: float, *, binary: bool = True) -> tuple[str, int]:
    """The largest unit (at most GB or GiB) in which `n` bytes is at least 1; GB or GiB for 0."""
    units = BINARY if binary else DECIMAL
    return next(((name, size) for name, size in units if abs(n) >= size), units[0])


def size(n: float, *, binary: bool = True) -> str:
    """`n` bytes in the unit that fits: '470.2 GB', '2.4 GiB', '716.8 MiB', '12 B'."""
    name, unit = unit_for(n, binary=binary)
    return f"{n:,.0f} B" if unit == 1 else f"{n / unit:,.1f} {name}"


def common_unit(values: Iterable[float]) -> tuple[str, int]:
    """One binary unit for a table's column of byte counts: the one that fits the largest."""
    return unit_for(max((abs(v) for v in values), default=0.0))
