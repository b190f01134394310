"""Downsampling for plots: many points in, one bucket per screen column out. Pure numpy, no Textual.

A plot that is W dots wide never needs more than W buckets, whatever the length of the run: a
26-hour record of 100,000 steps draws from the same few hundred numbers as a 4-minute one.

- `bucketize` cuts a time range into equal buckets and keeps, per bucket, the minimum, maximum,
  mean and last value (min/max keeps spikes visible: an OOM-bound memory peak must not vanish).
- `minmax_points` is the same idea returned as points (at most two a bucket, in time order).
- `Series` is an append-only (x, y) store with bounded memory: past its capacity it halves itself,
  keeping each group's extremes (envelope series) or its mean (smoothed series).
- `ema` smooths like TensorBoard's smoothing slider, with the start-up bias removed.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

DEFAULT_CAPACITY = 16384


@dataclass(frozen=True)
class Buckets:
    """Per-bucket figures over `n` equal slices of [lo, hi]; `count` 0 means an empty bucket (values NaN)."""

    lo: float
    hi: float
    count: np.ndarray
    ymin: np.ndarray
    ymax: np.ndarray
    ymean: np.ndarray
    ylast: np.ndarray

    @property
    def n(self) -> int:
        return len(self.count)


def bucketize(x: np.ndarray, y: np.ndarray, lo: float, hi: float, n: int) -> Buckets:
    """Bucket sorted `x` (and its `y`) into `n` equal slices of [lo, hi]; points outside are left out."""
    n = max(1, int(n))
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    nan = np.full(n, np.nan)
    if hi <= lo or len(x) == 0:
        return Buckets(lo, hi, np.zeros(n, dtype=np.int64), nan, nan.copy(), nan.copy(), nan.copy())
    start = int(np.searchsorted(x, lo, side="left"))
    stop = int(np.searchsorted(x, hi, side="right"))
    xs, ys = x[start:stop], y[start:stop]
    if len(xs) == 0:
        return Buckets(lo, hi, np.zeros(n, dtype=np.int64), nan, nan.copy(), nan.copy(), nan.copy())
    index = ((xs - lo) * (n / (hi - lo))).astype(np.int64)
    np.clip(index, 0, n - 1, out=index)
    count = np.bincount(index, minlength=n)
    present = count > 0
    # x is sorted, so each bucket's points are contiguous: reduce over those runs.
    starts = np.flatnonzero(np.r_[True, index[1:] != index[:-1]])
    keys = index[starts]
    ymin, ymax, ymean, ylast = nan.copy(), nan.copy(), nan.copy(), nan.copy()
    ymin[keys] = np.minimum.reduceat(ys, starts)
    ymax[keys] = np.maximum.reduceat(ys, starts)
    ymean[keys] = np.add.reduceat(ys, starts) / count[present]
    ends = np.r_[starts[1:], len(ys)] - 1
    ylast[keys] = ys[ends]
    return Buckets(lo, hi, count, ymin, ymax, ymean, ylast)


def minmax_points(x: np.ndarray, y: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """At most `2 n` points of (x, y) that keep every bucket's minimum and maximum, in time order."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if len(x) <= 2 * n:
        return x.copy(), y.copy()
    edges = np.linspace(0, len(x), n + 1).astype(np.int64)
    keep = np.zeros(len(x), dtype=bool)
    for a, b in itertools.pairwise(edges):
        if b > a:
            seg = y[a:b]
            keep[a + int(np.argmin(seg))] = True
            keep[a + int(np.argmax(seg))] = True
    return x[keep], y[keep]


def ema(
    values: np.ndarray, weight: float, state: tuple[float, int] = (0.0, 0)
) -> tuple[np.ndarray, tuple[float, int]]:
    """Debiased exponential moving average; `state` carries (biased average, count) across calls."""
    acc, count = state
    out = np.empty(len(values))
    for i, v in enumerate(np.asarray(values, dtype=np.float64).tolist()):
        count += 1
        acc = acc * weight + (1.0 - weight) * v
        out[i] = acc / (1.0 - weight**count)
    return out, (acc, count)


class Series:
    """Append-only (x, y) points with bounded memory.

    `mode="envelope"` halves by keeping each group of four's minimum and maximum (in time order);
    `mode="mean"` halves by averaging pairs. Missing or non-finite values (NaN, inf) are not stored.
    x never decreases: a point stamped before the last one (the wall clock stepped back) is stored at
    the last one's x, so the series stays sorted for bucketing.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY, mode: str = "envelope") -> None:
        if capacity < 8:
            raise ValueError("capacity must be at least 8")
        if mode not in ("envelope", "mean"):
            raise ValueError(f"unknown mode {mode!r}")
        self.capacity = capacity
        self.mode = mode
        self._x = np.empty(min(1024, capacity))
        self._y = np.empty(min(1024, capacity))
        self._n = 0
        self.total = 0  # points ever appended (kept or compacted away)
        self.last: float | None = None

    def __len__(self) -> int:
        return self._n

    @property
    def x(self) -> np.ndarray:
        return self._x[: self._n]

    @property
    def y(self) -> np.ndarray:
        return self._y[: self._n]

    def append(self, x: float, y: float | None) -> None:
        if y is None or not math.isfinite(y):
            return
        if self._n == len(self._x):
            self._grow(1)
        if self._n and x < self._x[self._n - 1]:
            x = float(self._x[self._n - 1])
        self._x[self._n] = x
        self._y[self._n] = y
        self._n += 1
        self.total += 1
        self.last = float(y)

    def extend(self, xs: np.ndarray, ys: np.ndarray) -> None:
        if len(xs) == 1:  # one new point (a live update): the same as `append`, without numpy's overhead
            self.append(float(xs[0]), float(ys[0]))
            return
        xs = np.asarray(xs, dtype=np.float64)
        ys = np.asarray(ys, dtype=np.float64)
        ok = np.isfinite(ys)
        if not ok.all():
            xs, ys = xs[ok], ys[ok]
        if len(xs):  # never before the last stored x (see the class docstring)
            floor = self._x[self._n - 1] if self._n else -np.inf
            xs = np.maximum.accumulate(np.maximum(xs, floor))
        while len(xs):
            if self._n == len(self._x):
                self._grow(len(xs))
            take = min(len(xs), len(self._x) - self._n)
            self._x[self._n : self._n + take] = xs[:take]
            self._y[self._n : self._n + take] = ys[:take]
            self._n += take
            self.total += take
            self.last = float(ys[take - 1])
            xs, ys = xs[take:], ys[take:]

    def _grow(self, wanted: int) -> None:
        if len(self._x) < self.capacity:
            size = min(self.capacity, max(2 * len(self._x), self._n + wanted))
            self._x = np.resize(self._x, size)
            self._y = np.resize(self._y, size)
        else:
            self._compact()

    def _compact(self) -> None:
        """Halve the points in place (down to at most capacity / 2)."""
        n = self._n - self._n % 4
        x, y = self._x[:n], self._y[:n]
        rest_x, rest_y = self._x[n : self._n].copy(), self._y[n : self._n].copy()
        if self.mode == "mean":
            nx = x.reshape(-1, 2).mean(axis=1)
            ny = y.reshape(-1, 2).mean(axis=1)
        else:
            gx, gy = x.reshape(-1, 4), y.reshape(-1, 4)
            rows = np.arange(len(gy))
            imin, imax = gy.argmin(axis=1), gy.argmax(axis=1)
            first, second = np.minimum(imin, imax), np.maximum(imin, imax)
            # Two points a group: the extremes in time order (the same point twice if flat).
            nx = np.stack([gx[rows, first], gx[rows, second]], axis=1).ravel()
            ny = np.stack([gy[rows, first], gy[rows, second]], axis=1).ravel()
        k = len(nx)
        self._x[:k], self._y[:k] = nx, ny
        self._x[k : k + len(rest_x)], self._y[k : k + len(rest_y)] = rest_x, rest_y
        self._n = k + len(rest_x)

    def buckets(self, lo: float, hi: float, n: int) -> Buckets:
        return bucketize(self.x, self.y, lo, hi, n)

    def y_range(self, lo: float, hi: float) -> tuple[float, float] | None:
        """Minimum and maximum y of the points with x in [lo, hi]."""
        a = int(np.searchsorted(self.x, lo, side="left"))
        b = int(np.searchsorted(self.x, hi, side="right"))
        if b <= a:
            return None
        seg = self._y[a:b]
        return float(seg.min()), float(seg.max())

    def nbytes(self) -> int:
        return self._x.nbytes + self._y.nbytes
