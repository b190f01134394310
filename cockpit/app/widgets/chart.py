"""A braille line chart: each cell is 2×4 dots, each dot column one bucket of the data.

The data arrives already bucketed to the widget's width (min/max per dot column, see
`cockpit.record.downsample`), so drawing costs the same for a 4-minute run and a 26-hour one. Strips are
built once per snapshot or resize and served from a cache in `render_line`.
"""

from __future__ import annotations

import math
import textwrap

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

from cockpit.app.charts import ChartData
from cockpit.app.legend import MARK, Entry, layout
from cockpit.units import clock, memory

GUTTER = 8  # y-axis labels
# Braille dot bits, [row][column] within a cell.
_BITS = np.array([[0x01, 0x08], [0x02, 0x10], [0x04, 0x20], [0x40, 0x80]], dtype=np.int64)
_AXIS = Style(color="#8a8a8a")
_NOTE = Style(color="#8a8a8a", italic=True)


def fmt_axis(value: float, unit: str, span: float = 0.0) -> str:
    """A y-axis label, with as many decimals as the span of the axis needs to tell labels apart."""
    decimals = min(4, max(0, math.ceil(-math.log10(span)) + 1)) if span > 0 else 2
    if value == 0:
        return "0"
    if unit == "mib":  # in GiB once the axis spans one, with the decimals its span needs
        gib = abs(value) >= 1024 or span >= 1024
        return memory(value, digits=1 if span >= 10 * 1024 else 2, short=True, in_gib=gib)
    a = abs(value)
    if a >= 1e6:
        return f"{value / 1e6:.1f}M"
    if a >= 1e3:
        k_decimals = min(3, max(0, math.ceil(-math.log10(span / 1e3)) + 1)) if span > 0 else 1
        return f"{value / 1e3:.{k_decimals}f}k"
    return f"{value:.{decimals}f}"


def _fit(values: np.ndarray, width: int) -> np.ndarray:
    """Stretch or squeeze bucket arrays to `width` columns (until the next snapshot has the new width)."""
    if len(values) == width:
        return values
    if len(values) == 0:
        return np.full(width, np.nan)
    return values[(np.arange(width) * len(values)) // width]


def raster(chart: ChartData, cols: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Braille codes (rows × cols) and, per cell, the index of the trace drawn on top (-1: none)."""
    w, h = cols * 2, rows * 4
    codes = np.zeros((rows, cols), dtype=np.int64)
    owner = np.full((rows, cols), -1, dtype=np.int64)
    if cols <= 0 or rows <= 0:
        return codes, owner
    span = chart.y_hi - chart.y_lo or 1.0
    row_index = np.arange(h)[:, None]
    for k, trace in enumerate(chart.traces):
        ymin, ymax = _fit(trace.ymin, w), _fit(trace.ymax, w)
        valid = ~np.isnan(ymin)
        present = np.flatnonzero(valid)
        if len(present) == 0:
            continue
        # Columns without data between two with data: join them with a straight line.
        a, b = present[0], present[-1] + 1
        xs = np.arange(a, b)
        lo_y = np.interp(xs, present, ymin[valid])
        hi_y = np.interp(xs, present, ymax[valid])
        top = np.clip(np.rint((chart.y_hi - hi_y) / span * (h - 1)), 0, h - 1).astype(np.int64)
        bot = np.clip(np.rint((chart.y_hi - lo_y) / span * (h - 1)), 0, h - 1).astype(np.int64)
        # Join each column to the one before it, so a steep move stays one unbroken stroke.
        if len(xs) > 1:
            t0, b0 = top.copy(), bot.copy()
            top[1:] = np.where(t0[1:] > b0[:-1], b0[:-1], t0[1:])
            bot[1:] = np.where(b0[1:] < t0[:-1], t0[:-1], b0[1:])
        mask = np.zeros((h, w), dtype=bool)
        mask[:, a:b] = (row_index >= top[None, :]) & (row_index <= bot[None, :])
        cells = mask.reshape(rows, 4, cols, 2)
        code = np.einsum("rico,io->rc", cells.astype(np.int64), _BITS)
        codes |= code
        owner[code != 0] = k
    return codes, owner


RESUME_MARK = "┊"  # down an empty plot column where the run resumed
MARK_OWNER = -3


def mark_columns(data: ChartData, cols: int) -> set[int]:
    """The plot columns of `data.marks`."""
    span = data.x_hi - data.x_lo
    if span <= 0 or cols <= 0:
        return set()
    return {min(cols - 1, max(0, int((m - data.x_lo) / span * cols))) for m in data.marks}


def _style(styles: list[Style], owner: int) -> Style | None:
    return styles[owner] if owner >= 0 else _AXIS if owner == MARK_OWNER else None


class BrailleChart(Widget):
    """A titled chart: legend line, braille plot with a y-axis gutter, elapsed-time axis."""

    DEFAULT_CSS = """
    BrailleChart {
        height: 1fr;
        width: 1fr;
    }
    """

    def __init__(self, title: str, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.border_title = title
        self.data: ChartData | None = None
        self._strips: list[Strip] = []
        self._built_for: tuple[int, int] | None = None

    @property
    def dot_columns(self) -> int:
        """Dot columns of the plot (the content less the y-axis gutter): one bucket each."""
        return 2 * max(0, self.size.width - GUTTER)

    def set_data(self, data: ChartData) -> None:
        self.data = data
        self.border_title = data.title
        self.border_subtitle = data.note or None
        self._rebuild()
        self.refresh()

    def on_resize(self) -> None:
        self._rebuild()

    def _rebuild(self) -> None:
        width, height = self.size.width, self.size.height
        self._built_for = (width, height)
        blank = Strip([Segment(" " * width)], width) if width else Strip.blank(0)
        if self.data is None or width <= GUTTER or height < 3:
            self._strips = [blank] * height
            return
        data = self.data
        # A second legend line where the plot keeps three rows at least (a short terminal keeps one).
        strips = self._legend(data, width, max_lines=2 if height >= 6 else 1)
        cols, rows = width - GUTTER, height - 1 - len(strips)
        codes, owner = raster(data, cols, rows)
        empty = not np.any(owner >= 0)
        styles = [Style(color=t.color) for t in data.traces]
        span = data.y_hi - data.y_lo
        labels = {0: fmt_axis(data.y_hi, data.y_unit, span), rows - 1: fmt_axis(data.y_lo, data.y_unit, span)}
        if rows >= 5:
            labels[(rows - 1) // 2] = fmt_axis((data.y_hi + data.y_lo) / 2, data.y_unit, span)
        notes: dict[int, str] = {}
        if empty:  # no scale to read: say why instead, over as many rows as it takes
            labels = {}
            wrapped = textwrap.wrap(data.empty, cols) or [""]
            wrapped = wrapped[:rows]
            top = max(0, (rows - len(wrapped)) // 2)
            notes = {top + i: line for i, line in enumerate(wrapped)}
        marked = mark_columns(data, cols)
        for r in range(rows):
            label = labels.get(r, "")
            segments = [
                Segment(
                    label.rjust(GUTTER - 2)[: GUTTER - 2] + " ┤" if label else " " * (GUTTER - 1) + "│", _AXIS
                )
            ]
            row_codes, row_owner = codes[r].tolist(), owner[r].tolist()
            run_owner, run_chars = -2, []
            for c, (code, who) in enumerate(zip(row_codes, row_owner, strict=True)):
                if not code and c in marked:
                    who = MARK_OWNER
                if who != run_owner and run_chars:
                    segments.append(Segment("".join(run_chars), _style(styles, run_owner)))
                    run_chars = []
                run_owner = who
                run_chars.append(chr(0x2800 + code) if code else RESUME_MARK if who == MARK_OWNER else " ")
            if run_chars:
                segments.append(Segment("".join(run_chars), _style(styles, run_owner)))
            if r in notes:
                segments = [segments[0], Segment(notes[r].center(cols)[:cols], _NOTE)]
            strips.append(Strip(segments, width))
        strips.append(self._x_axis(data, width))
        self._strips = strips

    def _legend(self, data: ChartData, width: int, max_lines: int = 2) -> list[Strip]:
        """`━ label value` entries in up to `max_lines` lines (`cockpit.app.legend`: every line named where
        it can be, values as room allows; `+N` says how many did not fit)."""
        entries = [Entry(t.label, t.value, t.color, t.keep) for t in data.traces if t.legend]
        legend = layout(entries, width, max_lines)
        strips = []
        for i, line in enumerate(legend.lines or [[]]):
            segments = [Segment(" ")]
            for j, (entry, text) in enumerate(line):
                if j:
                    segments.append(Segment(" " * legend.gap))
                segments += [Segment(MARK, Style(color=entry.color, bold=True)), Segment(text)]
            if legend.hidden and i == len(legend.lines) - 1:
                segments.append(Segment(f"{' ' if line else ''}+{legend.hidden}", _NOTE))
            strips.append(Strip(segments).crop(0, width).extend_cell_length(width))
        return strips

    def _x_axis(self, data: ChartData, width: int) -> Strip:
        cols = width - GUTTER
        left, right = clock(data.x_lo), clock(data.x_hi)
        mid = clock((data.x_lo + data.x_hi) / 2)
        line = [" "] * cols
        for pos, text in ((0, left), ((cols - len(mid)) // 2, mid), (cols - len(right), right)):
            for i, ch in enumerate(text):
                if 0 <= pos + i < cols:
                    line[pos + i] = ch
        return Strip([Segment(" " * (GUTTER - 1) + "└", _AXIS), Segment("".join(line), _AXIS)], width)

    def render_line(self, y: int) -> Strip:
        if self._built_for != (self.size.width, self.size.height):
            self._rebuild()
        if 0 <= y < len(self._strips):
            return self._strips[y]
        return Strip.blank(self.size.width)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return container.height
