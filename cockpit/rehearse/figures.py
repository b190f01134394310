"""From a rehearsal's depths to one fit a figure, each in its known shape (`cockpit.rehearse.fit`).

What the shapes need of the profile and the plan is gathered in `Terms`: the prefetch window and a
layer's copies (the offloaded step), the knee where the gathered layers stop growing and the plan's
growth a layer past it (the GPU peak in training), and what the load pays a layer.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from cockpit.contract import GATHERED_BEYOND_PREFETCH, ZERO3_LAYER_FETCHES, overlapped_fetch
from cockpit.plan.inputs import GiB
from cockpit.rehearse.fit import (
    PEAK_FLOOR,
    STEP_FLOOR,
    Fit,
    Point,
    fit_gathered,
    fit_line,
    fit_past_window,
)
from cockpit.rehearse.measure import DEFAULT_LAYERS, DepthMeasure

MEMORY = ("gpu_load", "gpu_train", "rss_load", "rss_train")
METRICS = (*MEMORY, "step_s", "load_s", "save_s", "start_s", "validation_s")


def prefetch_window(profile: Any) -> int | None:
    """Layers whose copies fill ZeRO-3's prefetch at the start of a pass (the one computing and those
    prefetched), where parameters are offloaded and prefetched; else None."""
    ds = profile.deepspeed
    if ds.stage != 3 or ds.offload_param == "none" or not ds.prefetch_layers:
        return None
    return 1 + math.ceil(ds.prefetch_layers)


def gathers(profile: Any, ranks: int) -> bool:
    """Whether ZeRO-3 gathers layers in training on `ranks` ranks (parameter offload, or several ranks;
    one rank without offload holds every layer whole and gathers none)."""
    ds = profile.deepspeed
    return ds.stage == 3 and (ds.offload_param != "none" or ranks > 1)


def gathered_knee(profile: Any, ranks: int) -> int | None:
    """The depth from which the layers kept gathered in training stop growing: the computing one, those
    prefetched, and on one rank with the overlapped fetch `GATHERED_BEYOND_PREFETCH` more; None where
    nothing is gathered."""
    if not gathers(profile, ranks):
        return None
    ahead = math.ceil(profile.deepspeed.prefetch_layers or 0)
    overlapped = overlapped_fetch(ranks, profile.deepspeed.offload_param)
    return 1 + ahead + (GATHERED_BEYOND_PREFETCH if overlapped else 0)


def default_depths(profile: Any, model_layers: int, ranks: int = 1) -> list[int]:
    """The depths a rehearsal measures unless told: `DEFAULT_LAYERS`, and where a knee bends a figure
    (the offloaded step's prefetch window, the knee of the gathered layers in the GPU peak) the doublings
    on from them until two depths are at or past the deeper knee, as deep as the model goes, so that each
    figure past its knee is measured (the story: 1, 2, 4, 8 and 16)."""
    depths = {d for d in DEFAULT_LAYERS if d <= model_layers}
    knees = [k for k in (prefetch_window(profile), gathered_knee(profile, ranks)) if k]
    if knees:
        depth = 1
        while sum(d >= max(knees) for d in depths) < 2 and depth <= model_layers:
            depths.add(depth)
            depth *= 2
    return sorted(depths)


def copy_per_layer_s(profile: Any, layer_bytes: float, ranks: int, h2d_gbps: float) -> float:
    """One decoder layer's host-to-device copies an optimizer step, per rank (`ZERO3_LAYER_FETCHES` a
    micro-batch, this rank's share, over its link); 0 without parameter offload."""
    if profile.deepspeed.offload_param == "none" or h2d_gbps <= 0:
        return 0.0
    micro = profile.training.grad_accum
    return ZERO3_LAYER_FETCHES * micro * layer_bytes / (max(1, ranks) * h2d_gbps * 1e9)


@dataclass(frozen=True)
class Terms:
    """What the shapes take from the profile and the plan, for the machine the depths ran on."""

    full: int  # the model's depth, where the fits are read
    window: int | None = None  # the offloaded step's prefetch window (None: its step is a line)
    copy_s: float = 0.0  # one layer's copies an optimizer step here
    knee: int | None = None  # where the gathered layers stop growing (None: nothing is gathered)
    checkpoint_gib: float = 0.0  # the plan's growth of the training peak a layer past the knee


def terms_for(
    profile: Any, plan: dict[str, Any], full: int, layer_bytes: float, ranks: int, h2d: float
) -> Terms:
    """The profile's terms on `ranks` ranks of a machine whose link copies `h2d` GB/s."""
    train = ((plan.get("configured") or {}).get("train") or {}).get("gpu_terms") or {}
    layers = int((plan.get("model") or {}).get("layers") or full or 1)
    checkpoint = float(train.get("checkpointed activations") or 0.0) / layers / GiB
    return Terms(
        full=full,
        window=prefetch_window(profile),
        copy_s=copy_per_layer_s(profile, layer_bytes, ranks, h2d),
        knee=gathered_knee(profile, ranks),
        checkpoint_gib=checkpoint,
    )


def _points(done: list[DepthMeasure], metric: str) -> list[Point]:
    out = []
    for m in done:
        if metric == "step_s":
            if m.step_s is not None:
                out.append(Point(m.layers, float(m.step_s), m.step_error_s or STEP_FLOOR * m.step_s))
        elif metric == "validation_s":
            if m.validation_s is not None:
                v = float(m.validation_s)
                out.append(Point(m.layers, v, max(m.validation_error_s or 0.0, STEP_FLOOR * v)))
        elif metric in MEMORY:
            value = m.peak(metric)
            if value is not None:
                out.append(Point(m.layers, float(value), PEAK_FLOOR * value))
        else:
            value = getattr(m, metric)
            if value is not None:
                out.append(Point(m.layers, float(value)))
    return out


def load_fit(done: list[DepthMeasure]) -> Fit | None:
    """The load on this machine: what a layer costs and what is fixed. A layer costs at least what the
    layer-by-layer load's progress shows between two layers (the median at each depth, pooled: robust to
    one slow run), and the line through the depths' totals can show more (work a layer does after its
    progress event); the larger is taken. What is fixed is the median of each depth's total less its
    layers. The range reaches the least and the most per-layer cost the depths showed (the host's pinning
    and copies vary from run to run: 0.73 to 1.10 s a layer on the story's slice), read past the deepest
    depth. Records without the progress take the line through the totals."""
    line = fit_line(_points(done, "load_s"), floor=0.0)
    seen = sorted(m.load_layer_s for m in done if m.load_layer_s)
    totals = [m for m in done if m.load_s is not None]
    if line is None or not seen:
        return line
    per_layer = max(statistics.median(seen), line.per_layer)
    fixed_each = sorted(float(m.load_s) - per_layer * m.layers for m in totals)
    fixed = max(0.0, fixed_each[len(fixed_each) // 2])
    deepest = max(totals, key=lambda m: m.layers)
    misses = [float(m.load_s) - fixed - per_layer * m.layers for m in totals]
    spread = (sum(x * x for x in misses) / max(1, len(misses) - 1)) ** 0.5 if len(misses) > 1 else 0.0
    anchor = Point(deepest.layers, fixed + per_layer * deepest.layers, spread)
    return Fit(
        fixed,
        per_layer,
        line.points,
        (anchor,),
        slope_given=True,
        bounds=(min(seen[0], line.per_layer), max(seen[-1], line.per_layer)),
    )


def fit_all(measures: list[DepthMeasure], terms: Terms) -> dict[str, Fit | None]:
    """A fit a figure over the complete depths: lines, the offloaded step past its window, the gathered
    GPU peak past its knee, the load a layer from its progress."""
    done = [m for m in measures if m.complete]
    fits: dict[str, Fit | None] = {}
    for metric in METRICS:
        points = _points(done, metric)
        if metric == "step_s" and terms.window is not None:
            fits[metric] = fit_past_window(points, terms.window, terms.copy_s, terms.full)
        elif metric == "validation_s":  # a line through every depth: the story's showed no bend at the window
            fits[metric] = fit_line(points, floor=STEP_FLOOR)
        elif metric == "gpu_train" and terms.knee is not None and terms.checkpoint_gib > 0:
            fits[metric] = fit_gathered(points, terms.knee, terms.checkpoint_gib, terms.full)
        elif metric == "load_s":
            fits[metric] = load_fit(done)
        elif metric == "start_s":
            values = sorted(p.value for p in points)
            fits[metric] = (
                Fit(values[len(values) // 2], 0.0, tuple((p.layers, p.value) for p in points))
                if values
                else None
            )
        else:
            fits[metric] = fit_line(points, floor=0.0 if metric == "save_s" else PEAK_FLOOR)
    return fits
