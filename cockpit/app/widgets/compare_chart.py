"""The run screen's braille chart with an x axis in steps or in elapsed time (the compare screen's)."""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip

from cockpit.app.charts import ChartData
from cockpit.app.widgets.chart import GUTTER, BrailleChart

_AXIS = Style(color="#8a8a8a")


def fmt_step(value: float) -> str:
    return f"{value / 1000:.1f}k" if value >= 10_000 else f"{value:,.0f}"


class CompareChart(BrailleChart):
    """A `BrailleChart` whose x labels are steps (`x_unit = "step"`) or elapsed time."""

    x_unit = "step"

    def _x_axis(self, data: ChartData, width: int) -> Strip:
        if self.x_unit != "step":
            return super()._x_axis(data, width)
        cols = width - GUTTER
        labels = [fmt_step(v) for v in (data.x_lo, (data.x_lo + data.x_hi) / 2, data.x_hi)]
        line = [" "] * cols
        positions = (0, (cols - len(labels[1])) // 2, cols - len(labels[2]))
        for pos, text in zip(positions, labels, strict=True):
            for i, ch in enumerate(text):
                if 0 <= pos + i < cols:
                    line[pos + i] = ch
        return Strip([Segment(" " * (GUTTER - 1) + "└", _AXIS), Segment("".join(line), _AXIS)], width)
