"""Byte counts and durations as people read them: the one formatter of each that every viewer uses.

- **Bytes** (`size`): in the unit that fits their size, so a tiny model's 300 KB reads as such, not as
  0.0 GB; binary units (GiB, MiB, KiB) unless decimal ones are asked for (a model's weights, as the hub
  gives them); a table's column in one unit (`common_unit`).
- **Memory readings in MiB** (`memory`): the record's `*_mib` fields, in GiB from 1 GiB on and in whole
  MiB under it: `2.3 GiB`, `754 MiB`; `23.5G`, `743M` where room is short (a chart's legend and axis).
- **Durations**: a clock (`clock`: `1:02:03`, `4:05`), a rough one (`about`: `40 s`, `4 min`, `1.5 h`)
  and hours (`hours`: `0.40 h`).

The ground floor: it imports nothing of the project, so every layer can print through it.
"""

from __future__ import annotations

from collections.abc import Iterable

KIB = 1024
MIB = 1024**2
GIB = 1024**3
DECIMAL = (("GB", 1000**3), ("MB", 1000**2), ("KB", 1000), ("B", 1))
BINARY = (("GiB", GIB), ("MiB", MIB), ("KiB", KIB), ("B", 1))


# --- bytes -----------------------------------------------------------------------------------------------
def unit_for(n: float, *, binary: bool = True, largest: str | None = None) -> tuple[str, int]:
    """The largest unit (at most GB or GiB, or `largest`) in which `n` bytes is at least 1; that largest
    unit for 0."""
    units = BINARY if binary else DECIMAL
    if largest is not None:
        units = units[[name for name, _ in units].index(largest) :]
    return next(((name, size) for name, size in units if abs(n) >= size), units[0])


def size(n: float, *, binary: bool = True, largest: str | None = None) -> str:
    """`n` bytes in the unit that fits: '470.2 GB', '2.4 GiB', '716.8 MiB', '12 B'; `largest` caps the
    unit (a limit set in MiB reads in MiB: '1,024.0 MiB')."""
    name, unit = unit_for(n, binary=binary, largest=largest)
    return f"{n:,.0f} B" if unit == 1 else f"{n / unit:,.1f} {name}"


def common_unit(values: Iterable[float]) -> tuple[str, int]:
    """One binary unit for a table's column of byte counts: the one that fits the largest."""
    return unit_for(max((abs(v) for v in values), default=0.0))


def memory(mib: float | None, *, digits: int = 1, short: bool = False, in_gib: bool | None = None) -> str:
    """A memory reading given in MiB: GiB with `digits` decimals from 1 GiB on (or when `in_gib` says so),
    whole MiB under it: '2.3 GiB', '754 MiB'; `short`: '2.3G', '754M'; '-' when there is none."""
    if mib is None:
        return "-"
    if in_gib if in_gib is not None else abs(mib) >= 1024:
        return f"{mib / 1024:.{digits}f}" + ("G" if short else " GiB")
    return f"{mib:.0f}" + ("M" if short else " MiB")


# --- durations -------------------------------------------------------------------------------------------
def clock(seconds: float | None, unknown: str = "--:--", padded: bool = False) -> str:
    """`1:02:03` from an hour on, `4:05` under it (whole seconds); `04:05` when `padded` (plain log lines,
    where the stamps align); `unknown` when there is no figure."""
    if seconds is None:
        return unknown
    whole = int(max(0.0, seconds))
    h, rem = divmod(whole, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}:{m:02d}:{s:02d}"
    return f"{m:02d}:{s:02d}" if padded else f"{m}:{s:02d}"


def about(seconds: float) -> str:
    """A rough duration: '40 s', '4 min', '1.5 h'."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def hours(seconds: float | None, digits: int = 2) -> str:
    """A duration in hours: '0.40 h'; '-' when there is none."""
    return "-" if seconds is None else f"{seconds / 3600:.{digits}f} h"
