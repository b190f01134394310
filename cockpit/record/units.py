"""How a record's durations read for people: one clock for every viewer (headless, app, compare)."""

from __future__ import annotations


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
