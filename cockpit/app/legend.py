"""A chart's legend laid out to its width: every line named where it can be, values as room allows.

Tried in turn until one fits in `max_lines` lines: each entry `━ label value` two spaces apart, then
one space apart, then without the values the chart holds least dear (`Trace.keep`, a level at a
time, lowest first), down to no value at all. Only when the names alone do not fit does `+N` say how
many were left out (and it always has its room). Imports no Textual.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len

MARK = "━ "
LEAD = 1  # a space before the first entry of a line


@dataclass(frozen=True)
class Entry:
    label: str
    value: str
    color: str
    keep: int = 0  # higher: the value stays longer when room is short

    def text(self, with_value: bool) -> str:
        return f"{self.label} {self.value}".rstrip() if with_value and self.value else self.label


@dataclass(frozen=True)
class Legend:
    lines: list[list[tuple[Entry, str]]]  # each line's entries and the text shown for each
    gap: int  # spaces between entries
    hidden: int  # entries left out (said as `+N` at the end of the last line)


def _pack(texts: list[str], width: int, max_lines: int, gap: int) -> list[list[int]] | None:
    """Entry indices per line, greedily, or None when they need more than `max_lines` lines."""
    lines: list[list[int]] = [[]]
    used = LEAD
    for i, text in enumerate(texts):
        need = cell_len(MARK) + cell_len(text)
        if lines[-1] and used + gap + need > width:
            if len(lines) == max_lines:
                return None
            lines.append([])
            used = LEAD
        if not lines[-1] and used + need > width:
            return None
        used += need + (gap if lines[-1] else 0)
        lines[-1].append(i)
    return lines


def layout(entries: list[Entry], width: int, max_lines: int = 1) -> Legend:
    """The fullest legend of `entries` that fits `max_lines` lines of `width` cells."""
    if not entries:
        return Legend([], 2, 0)
    with_value = [bool(e.value) for e in entries]
    forms: list[tuple[int, list[bool]]] = [(2, list(with_value)), (1, list(with_value))]
    # Values go a level of `keep` at a time, least kept first: entries of one level alike.
    for level in sorted({e.keep for e in entries}):
        with_value = [v and e.keep != level for e, v in zip(entries, with_value, strict=True)]
        forms.append((1, with_value))
    for gap, values in forms:
        texts = [e.text(v) for e, v in zip(entries, values, strict=True)]
        packed = _pack(texts, width, max_lines, gap)
        if packed is not None:
            return Legend([[(entries[i], texts[i]) for i in line] for line in packed], gap, 0)
    return _overflow(entries, width, max_lines)


def _overflow(entries: list[Entry], width: int, max_lines: int) -> Legend:
    """Names only, as many as fit with room kept for `+N` on the last line."""
    lines: list[list[tuple[Entry, str]]] = [[]]
    used = LEAD
    for i, e in enumerate(entries):
        need = cell_len(MARK) + cell_len(e.label)
        left = len(entries) - i - 1
        reserve = len(f" +{left}") if left and len(lines) == max_lines else 0
        gap = 1 if lines[-1] else 0
        if used + gap + need + reserve > width:
            if len(lines) < max_lines and lines[-1]:
                lines.append([])
                used, gap = LEAD, 0
                reserve = len(f" +{left}") if left and len(lines) == max_lines else 0
            if used + gap + need + reserve > width:
                return Legend(lines, 1, len(entries) - i)
        lines[-1].append((e, e.label))
        used += gap + need
    return Legend(lines, 1, 0)
