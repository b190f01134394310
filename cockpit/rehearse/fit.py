"""Rehearsed figures over depth, each fitted in the shape it is known to have, read at any depth with a range.

Every figure is, where it is read (the model's full depth), a line: `fixed + per_layer x layers`. What
differs is which depths may set that line:

- **Lines** (`fit_line`): host RSS, the GPU peak at load, saves, the step without parameter offload, the
  GPU peak where nothing is gathered. Every depth lies on them.
- **The step with parameter offload** (`fit_past_window`): while ZeRO-3's prefetch window fills, a layer's
  copy is partly exposed, so the first layers cost more than the later ones (one H200, the story's slice:
  0.21 s a layer from 1 to 2 layers, 0.173 s from 4 on). At and past the window (`1 + prefetch_layers`
  layers) every further layer costs the same. Only depths at or past the window set the line; with one
  such depth the line through it and a shallower one is an upper bound (the shallower layers cost more),
  and with none the depths inside the window bound it from above.
- **The GPU peak in training where ZeRO-3 gathers** (`fit_gathered`): it rises by a whole gathered layer
  a layer until the layers in flight stop growing (the prefetch window, and on one rank
  `GATHERED_BEYOND_PREFETCH` more held by the overlapped fetch), then by a layer's checkpointed
  activations and what stays with them (measured 0.159 GiB a layer on the story's slice). Only depths at
  or past that knee set the line; with fewer than two, the per-layer growth is the plan's (modelled).

A fit that cannot say its figure from the depths given says so (`says` false) in one line (`note`) that
names the depths to add, and gives the figure it can defend: a bound, or the plan's term.

Ranges: each depth's value carries its own uncertainty (the timed steps' spread over their count, or a
floor for peaks) and the fit's residuals; the band at a depth is twice the standard error of the line
there (least squares weights of each depth), widened to the bound where the depths only bound the figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# A peak's own uncertainty, relative: allocator rounding and what one step holds more than another.
PEAK_FLOOR = 0.005
STEP_FLOOR = 0.005  # a step's, relative, where its timed steps are not in the record (older records)


@dataclass(frozen=True)
class Point:
    """One depth's value with its own 1-sd uncertainty."""

    layers: int
    value: float
    error: float = 0.0


@dataclass(frozen=True)
class Fit:
    """A figure over depth: `fixed + per_layer x layers` where it is read, with its range.

    `used` are the depths the line went through (least squares, or one depth and a given slope);
    `points` every depth given. `bounds`, where set, are slopes through the deepest depth used that the
    range reaches too: where the depths only bound the figure (`says` is then false and `note` says why
    and what to add), or where a per-layer cost was seen to vary between depths (the load).
    """

    fixed: float
    per_layer: float
    points: tuple[tuple[int, float], ...]
    used: tuple[Point, ...] = ()
    says: bool = True
    note: str = ""
    bounds: tuple[float, ...] = ()  # other slopes through the deepest depth used that the range reaches
    knee: int = 0  # the depth from which the line holds (the window, the gathered knee; 0: every depth)
    slope_given: bool = False  # per_layer was not fitted but given (the plan's, or a bound's)

    def at(self, layers: float) -> float:
        return self.fixed + self.per_layer * layers

    def band(self, layers: float) -> float:
        """Twice the standard error of the line at `layers`, from the used depths' own uncertainties."""
        used = self.used
        if not used:
            return 0.0
        if len(used) == 1 or self.slope_given:
            anchor = max(used, key=lambda p: p.layers)
            return 2 * anchor.error
        n = len(used)
        mean = sum(p.layers for p in used) / n
        sxx = sum((p.layers - mean) ** 2 for p in used)
        if sxx <= 0:
            return 2 * max(p.error for p in used)
        var = sum(((1 / n) + (layers - mean) * (p.layers - mean) / sxx) ** 2 * p.error**2 for p in used)
        return 2 * math.sqrt(var)

    def range(self, layers: float) -> tuple[float, float]:
        """The least and the most the depths allow at `layers` (never below zero)."""
        ends = [self.at(layers)]
        if self.bounds and self.used:
            anchor = max(self.used, key=lambda p: p.layers)
            ends += [anchor.value + slope * (layers - anchor.layers) for slope in self.bounds]
        band = self.band(layers)
        return max(0.0, min(ends) - band), max(ends) + band

    def to_dict(self, layers: int) -> dict[str, object]:
        lo, hi = self.range(layers)
        return {
            "fixed": self.fixed,
            "per_layer": self.per_layer,
            "points": self.points,
            "used": [p.layers for p in self.used],
            "says": self.says,
            "note": self.note,
            "knee": self.knee,
            "range": [lo, hi],
        }


def _errors(points: Sequence[Point], fixed: float, per_layer: float, floor: float) -> tuple[Point, ...]:
    """Each point's uncertainty: its own, the residual standard deviation (more depths than a line
    needs), and the relative floor, whichever is largest."""
    n = len(points)
    residual = 0.0
    if n > 2:
        sse = sum((p.value - fixed - per_layer * p.layers) ** 2 for p in points)
        residual = math.sqrt(sse / (n - 2))
    return tuple(Point(p.layers, p.value, max(p.error, residual, floor * abs(p.value))) for p in points)


def least_squares(points: Sequence[Point]) -> tuple[float, float] | None:
    """(fixed, per_layer) through at least two distinct depths; None with fewer."""
    if len({p.layers for p in points}) < 2:
        return None
    n = len(points)
    mx = sum(p.layers for p in points) / n
    my = sum(p.value for p in points) / n
    slope = sum((p.layers - mx) * (p.value - my) for p in points) / sum((p.layers - mx) ** 2 for p in points)
    return my - slope * mx, slope


def fit_line(points: Sequence[Point], floor: float = PEAK_FLOOR) -> Fit | None:
    """A line through every depth (least squares); None with fewer than two distinct depths.

    Every figure fitted here (memory, seconds) can only grow with depth; a negative slope is two depths'
    noise, and read 90 layers out it would predict nothing at all. It is read as flat at the largest
    value measured (per layer 0: the conservative line through no fewer bytes or seconds than any depth).
    """
    solved = least_squares(points)
    if solved is None:
        return None
    fixed, slope = solved
    pts = tuple((p.layers, p.value) for p in points)
    if slope < 0:
        top = max(points, key=lambda p: p.value)
        used = _errors([top], top.value, 0.0, floor)
        return Fit(top.value, 0.0, pts, used, slope_given=True)
    return Fit(fixed, slope, pts, _errors(points, fixed, slope, floor))


def _depths_words(depths: Sequence[int]) -> str:
    return ",".join(str(d) for d in sorted(set(depths)))


def suggest(window: int, have: Sequence[int], full: int, count: int = 2) -> list[int]:
    """Depths at or past `window` to add (the window and twice it, then further doublings), as deep as the
    model goes, that the rehearsal lacks."""
    out: list[int] = []
    depth = window
    while len(out) < count and depth <= full:
        if depth not in have:
            out.append(depth)
        depth *= 2
    return out


def fit_past_window(
    points: Sequence[Point], window: int, copy_s: float, full: int, floor: float = STEP_FLOOR
) -> Fit | None:
    """The offloaded step: the line of the depths at or past the prefetch window (`window` layers).

    - Two depths there or more: their line; it `says` the step.
    - One: the line through it and the deepest depth inside the window, an upper bound (the window's
      layers cost more); the least it can be takes the inside layers' extra cost as a whole layer's copy
      (`copy_s`, the most a layer's exposed copy can add).
    - None: the line of the depths inside the window, an upper bound; the least takes a layer's copy off
      its slope.
    """
    past = [p for p in points if p.layers >= window]
    inside = [p for p in points if p.layers < window]
    pts = tuple((p.layers, p.value) for p in points)
    have = [p.layers for p in points]
    if len({p.layers for p in past}) >= 2:
        line = fit_line(past, floor)
        assert line is not None
        return Fit(line.fixed, line.per_layer, pts, line.used, knee=window, slope_given=line.slope_given)
    add = _depths_words(suggest(window, have, full))
    if len(past) == 1 and inside:
        far, near = past[0], max(inside, key=lambda p: p.layers)
        line = fit_line([near, far], floor)
        assert line is not None
        spread = copy_s * (window - near.layers) / (far.layers - near.layers)
        note = (
            f"only one depth at or past the prefetch window ({window} layers): the step is at most this "
            f"(its line runs through {near.layers} layers, inside the window, where layers cost more); "
            f"measure {add} too (--layers {_depths_words(have + suggest(window, have, full))})"
        )
        return _bound(line, pts, note, line.per_layer - spread, window)
    line = fit_line(inside or list(points), floor)
    if line is None:
        return None
    note = (
        f"no depth at or past the prefetch window ({window} layers): a layer costs at most this (layers "
        f"inside the window cost more than those past it); measure {add} too "
        f"(--layers {_depths_words(have + suggest(window, have, full))})"
    )
    return _bound(line, pts, note, line.per_layer - copy_s, window)


def _bound(line: Fit, pts: tuple[tuple[int, float], ...], note: str, least: float, knee: int) -> Fit:
    """`line` as an upper bound that cannot say its figure (`note` says why), its range reaching down to
    a slope of `least` a layer."""
    return Fit(
        line.fixed,
        line.per_layer,
        pts,
        line.used,
        says=False,
        note=note,
        bounds=(max(0.0, least),),
        knee=knee,
        slope_given=line.slope_given,
    )


def fit_gathered(
    points: Sequence[Point],
    knee: int,
    modelled_per_layer: float,
    full: int,
    floor: float = PEAK_FLOOR,
) -> Fit | None:
    """The GPU peak in training where ZeRO-3 gathers: the line of the depths at or past `knee` (the layers
    in flight stop growing there).

    With fewer than two such depths the growth a layer past the knee is `modelled_per_layer` (the plan's
    checkpointed activations a layer), from the peak at the knee: measured where a depth is at or past
    it (the shallowest such), else read off the depths below it (their line, a whole gathered layer a
    layer, up to the knee)."""
    past = [p for p in points if p.layers >= knee]
    pts = tuple((p.layers, p.value) for p in points)
    have = [p.layers for p in points]
    if len({p.layers for p in past}) >= 2:
        line = fit_line(past, floor)
        assert line is not None
        return Fit(line.fixed, line.per_layer, pts, line.used, knee=knee, slope_given=line.slope_given)
    if not points:
        return None
    if past:
        anchor = min(past, key=lambda p: p.layers)
        anchor = _errors([anchor], anchor.value, 0.0, floor)[0]
    else:
        below = fit_line(points, floor)
        if below is None:
            return None
        deepest = max(points, key=lambda p: p.layers)
        value = below.at(knee)
        anchor = Point(knee, value, max(deepest.error, floor * value, below.band(knee) / 2))
    add = suggest(knee, have, full)
    note = (
        f"the GPU peak past {knee} layers (the layers kept gathered stop growing there) is measured at "
        f"{len(past)} depth(s): its growth a layer is the plan's ({modelled_per_layer:.3f} GiB, checkpointed "
        f"activations), modelled; measure {_depths_words(add)} too "
        f"(--layers {_depths_words(have + add)})"
    )
    return Fit(
        anchor.value - modelled_per_layer * anchor.layers,
        modelled_per_layer,
        pts,
        (anchor,),
        says=False,
        note=note,
        knee=knee,
        slope_given=True,
    )


def fit(points: Sequence[tuple[int, float]]) -> Fit | None:
    """`fit_line` over plain (layers, value) pairs, no uncertainty of their own (benchmarks' slopes)."""
    return fit_line([Point(d, v) for d, v in points], floor=0.0)
