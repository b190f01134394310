"""The delta chart's geometry: where 0, each delta and its 95% interval fall across a row of character
columns, and which glyph each column gets. Pure arithmetic; the app's widget draws it."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from cockpit.report.model import Delta

NICE_STEPS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # tick labels at whole points where they can be


@dataclass(frozen=True)
class Scale:
    """A value range drawn across `width` character columns; 0 is always inside it."""

    lo: float
    hi: float
    width: int
    step: float  # between tick labels

    def col(self, x: float) -> int:
        """The column of value `x` (clamped to the field)."""
        frac = (x - self.lo) / (self.hi - self.lo)
        return min(self.width - 1, max(0, round(frac * (self.width - 1))))

    def ticks(self) -> list[float]:
        first = math.ceil(self.lo / self.step - 1e-9)
        last = math.floor(self.hi / self.step + 1e-9)
        return [round(i * self.step, 10) for i in range(first, last + 1)]


def delta_scale(deltas: Iterable[Delta], width: int, max_ticks: int = 8) -> Scale:
    """A range holding 0 and every delta with its interval, widened to round tick steps."""
    values = [0.0]
    for d in deltas:
        values += [d.value, d.low, d.high]
    lo, hi = min(values), max(values)
    span = max(hi - lo, 1e-9)
    step = next((s for s in NICE_STEPS if span / s <= max_ticks), NICE_STEPS[-1])
    lo = math.floor(lo / step + 1e-9) * step
    hi = math.ceil(hi / step - 1e-9) * step
    if hi - lo < step:
        hi = lo + step
    return Scale(lo, hi, max(2, width), step)


@dataclass(frozen=True)
class Cell:
    """One column of a delta bar: inside the bar or not, and the glyph drawn over it."""

    bar: bool
    glyph: str  # " ", "│" (the zero axis), or the interval's whisker: "├", "─", "┤", "┼", "│"
    whisker: bool = False


def bar_cells(d: Delta, scale: Scale) -> list[Cell]:
    """The bar from 0 to the delta, the 95% interval as a whisker over it, the zero axis under both."""
    zero, end = scale.col(0.0), scale.col(d.value)
    low, high = scale.col(d.low), scale.col(d.high)
    bar_lo, bar_hi = min(zero, end), max(zero, end)
    cells = []
    for c in range(scale.width):
        bar = bar_lo <= c <= bar_hi and bar_lo != bar_hi
        glyph, whisker = " ", False
        if low <= c <= high:
            whisker = True
            if low == high:
                glyph = "┼"
            elif c == low:
                glyph = "├"
            elif c == high:
                glyph = "┤"
            else:
                glyph = "┼" if c == zero else "─"
        elif c == zero:
            glyph = "│"
        cells.append(Cell(bar, glyph, whisker))
    return cells
