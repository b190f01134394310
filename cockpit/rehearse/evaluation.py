"""Evaluation predicted from the depths that timed it on their slices (`rehearse_eval` events).

Each figure is a line over depth (`fixed + per_layer x layers`, `cockpit.rehearse.fit.fit_line`, every
depth on it): the thinking batch's prefill and decode step, the same at batch 1, and a scoring forward.
Read at the model's full depth, they are scaled to the profile's GPUs:

- a decode step reads every weight a step: memory-bound, its per-layer time scales by the two GPUs' HBM
  bandwidths; its fixed part (the head's sampling, `generate`'s own work) is host-bound and kept;
- the prefill and a scoring forward are compute-bound: they scale by the bf16 rates (`Scaling`);
- evaluation is one process whose layers are in blocks over the GPUs, run one after another: a layer's
  time does not divide by the GPU count.

Then evaluation's wall time is counted as the plan counts it (`cockpit.plan.eval_time.eval_seconds`).
Without a depth that timed it, the plan's modelled term stands in, and says so.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from cockpit.contract import EVAL_BATCH_SIZE, MAX_EVAL_BATCH
from cockpit.plan.eval_time import (
    GRAPH_BLOCK_SOURCE,
    EvalCosts,
    EvalShape,
    EvalSplit,
    budgeted,
    eval_seconds,
    eval_split,
    hbm_gbps,
    spread_overhead,
)
from cockpit.rehearse.fit import Fit, Point, fit_line
from cockpit.rehearse.measure import DepthMeasure
from cockpit.rehearse.scaling import Scaling

# Each timed figure: its spread's field, and what it is bound by (how it scales to another GPU).
FIGURES = {
    "prefill_s": ("prefill_sd_s", "compute"),
    "decode_step_s": ("decode_step_sd_s", "memory"),
    "score_s": ("score_sd_s", "compute"),
    "single_prefill_s": ("single_prefill_sd_s", "compute"),
    "single_decode_step_s": ("single_decode_step_sd_s", "memory"),
    "large_prefill_s": ("large_prefill_sd_s", "compute"),
    "large_decode_step_s": ("large_decode_step_sd_s", "memory"),
    "eager_decode_step_s": ("eager_decode_step_sd_s", "memory"),  # launched one by one, no CUDA graph
}
DECODE_STEPS = ("decode_step_s", "single_decode_step_s", "large_decode_step_s")
# The batches a depth times thinking at, by their figures' prefix (the event says each one's size).
BATCHES = {"single_": "1", "": "batch", "large_": "large_batch"}
TIMING_FLOOR = 0.01  # a timing's own uncertainty, relative, where its repeats say less

Range = tuple[float, float]


def eval_points(measures: list[DepthMeasure], key: str) -> list[Point]:
    """The depths that timed `key`, each with its uncertainty (its repeats' spread over their count)."""
    spread_key = FIGURES[key][0]
    out = []
    for m in measures:
        value = m.eval.get(key)
        if value is None:
            continue
        repeats = max(1, int(m.eval.get("repeats") or 1))
        spread = m.eval.get(spread_key)
        error = float(spread) / repeats**0.5 if spread else 0.0
        out.append(Point(m.layers, float(value), max(error, TIMING_FLOOR * float(value))))
    return out


def fit_eval(measures: list[DepthMeasure]) -> dict[str, Fit | None]:
    """A line over depth for each timed figure (None where fewer than two depths timed it)."""
    return {key: fit_line(eval_points(measures, key), floor=TIMING_FLOOR) for key in FIGURES}


@dataclass(frozen=True)
class EvalScaling:
    """From the rehearsal's GPU to the target's, for evaluation: the two ratios and why."""

    memory_ratio: float  # target decode time a layer / measured (HBM bandwidths)
    compute_ratio: float  # target prefill and scoring time / measured (bf16 rates)
    here_gbps: float
    there_gbps: float
    gpus: int

    @classmethod
    def of(cls, s: Scaling) -> EvalScaling:
        here, there = hbm_gbps(s.measured_gpu), hbm_gbps(s.target_gpu or s.measured_gpu)
        ratio = here / there if here and there else 1.0
        gpus = max(1, (s.target_gpus or 1) // max(1, s.target_nodes))  # one host's: evaluation is one process
        return cls(ratio, s.compute_ratio, here, there, gpus)

    def lines(self) -> list[str]:
        known = f"{self.here_gbps:,.0f} GB/s here, {self.there_gbps:,.0f} GB/s on the target"
        hbm = known if self.here_gbps and self.there_gbps else "one GPU's or the other's unknown"
        return [
            f"evaluation's decode step: a layer's time x {self.memory_ratio:.2f} (memory-bound: HBM "
            f"bandwidth, {hbm}); its fixed part (sampling, generate's own work) host-bound, as measured",
            f"evaluation's prefill and scoring forwards: x {self.compute_ratio:.2f} (compute-bound: the "
            "bf16 rate)",
            f"evaluation spread over the target's {self.gpus} GPU(s): layer blocks run one after another, so "
            "a layer's time does not divide by the GPU count",
        ]


def _scaled(fit: Fit, bound: str, full: int, es: EvalScaling) -> tuple[float, Range]:
    """A figure at full depth on the target, and its range (the fit's, scaled alike)."""
    if bound == "memory":
        value = fit.fixed + fit.per_layer * full * es.memory_ratio
    else:
        value = (fit.fixed + fit.per_layer * full) * es.compute_ratio
    value = max(0.0, value)
    here = fit.at(full)
    lo, hi = fit.range(full)
    factor = value / here if here > 0 else 1.0
    return value, (lo * factor, hi * factor)


@dataclass
class EvalForecast:
    """Evaluation on the profile's machine: its costs, its wall time and range, and how it was found."""

    total_s: float
    range_s: Range
    measured: bool  # timed on the rehearsal's slices (else the plan's modelled term, or nothing)
    how: str
    fits: dict[str, Fit | None] = field(default_factory=dict)
    target: dict[str, float] = field(default_factory=dict)  # each figure at full depth on the target
    target_range: dict[str, Range] = field(default_factory=dict)
    shape: EvalShape | None = None
    assumptions: list[str] = field(default_factory=list)
    timed_batches: dict[str, int] = field(default_factory=dict)  # figure prefix -> the batch it timed

    def pick(self, key: str, which: int | None = None) -> float:
        """A figure on the target: its value, or an end of its range (0: least, 1: most)."""
        if which is None:
            return self.target[key]
        return self.target_range.get(key, (self.target[key],) * 2)[which]

    def batch_points(self, figure: str, which: int | None = None) -> list[tuple[int, float]]:
        """(batch, `figure` on the target) of each batch timed, in batch order; a larger batch never below a
        smaller one's (more rows are never less work: a timing that says so is noise, read as the smaller
        batch's)."""
        points = sorted(
            (b, self.pick(prefix + figure, which))
            for prefix, b in self.timed_batches.items()
            if prefix + figure in self.target
        )
        return [(b, max(y for _, y in points[: i + 1])) for i, (b, _) in enumerate(points)]

    def at_batch(self, figure: str, batch: int, which: int | None = None) -> float:
        """`prefill_s` or `decode_step_s` at `batch` rows: piecewise linear through the batches timed
        (`batch_points`), the end segments extended."""
        return max(0.0, piecewise(self.batch_points(figure, which), batch))

    def costs(self, which: int | None = None) -> EvalCosts:
        """A batch's costs on the target at evaluation's batch (`shape.batch`): the values, or an end of
        their ranges (0: least, 1: most)."""
        batch = self.shape.batch if self.shape is not None else 1
        return EvalCosts(
            self.at_batch("prefill_s", batch, which),
            self.at_batch("decode_step_s", batch, which),
            self.pick("score_s", which),
        )

    def to_dict(self, layers: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "total_s": self.total_s,
            "range_s": list(self.range_s),
            "measured": self.measured,
            "how": self.how,
            "target": self.target,
            "target_range": {k: list(v) for k, v in self.target_range.items()},
            "fits": {k: None if v is None else v.to_dict(layers) for k, v in self.fits.items()},
            "assumptions": self.assumptions,
        }
        if self.shape is not None:
            s = self.shape
            out["shape"] = {
                "examples": s.split.examples,
                "examples_how": s.split.how,
                "labels": s.split.labels,
                "systems": s.systems,
                "batch": s.batch,
                "prompt_tokens": s.prompt_tokens,
                "think_tokens": s.think_tokens,
                "rows_per_forward": s.rows_per_forward,
                "scoring_forwards": s.forwards(s.split.examples),
            }
        return out


def piecewise(points: list[tuple[int, float]], x: float) -> float:
    """The value at `x` of the line through `points` (sorted by their first), piece by piece; past either
    end, the end piece extended; one point: its value."""
    if len(points) == 1:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1 or (x1, y1) == points[-1]:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 != x0 else y1
    return points[-1][1]


def _timed_shape(measures: list[DepthMeasure]) -> dict[str, Any]:
    """The shape the deepest depth timed evaluation at (its event's fields)."""
    timed = [m for m in measures if m.eval.get("decode_step_s") is not None]
    return max(timed, key=lambda m: m.layers).eval if timed else {}


def forecast_eval(
    measures: list[DepthMeasure], profile: Any, full: int, scaling: Scaling, plan: dict[str, Any], size: Any
) -> EvalForecast:
    """Evaluation on the profile's machine: from the depths that timed it (two at least), else the plan's
    modelled term (`plan["run"]["evaluation"]`), else nothing (0 s, saying why)."""
    none = (0.0, 0.0)
    if not profile.eval.enabled:
        return EvalForecast(0.0, none, False, "evaluation not counted: eval.enabled is false")
    split = eval_split(profile, size)
    fits = fit_eval(measures)
    timed = _timed_shape(measures)
    needed = ("prefill_s", "decode_step_s", "score_s")
    if split is not None and split.examples and all(fits[k] for k in needed):
        return _from_fits(fits, timed, split, profile, full, scaling, plan)
    modelled = (plan.get("run") or {}).get("evaluation") or {}
    if modelled.get("total_s"):
        total = float(modelled["total_s"])
        lo, hi = modelled.get("range_s") or (total, total)
        why = "fewer than two depths timed it" if timed else "no depth timed it"
        how = f"evaluation not rehearsed ({why}), {modelled['how']}"
        return EvalForecast(total, (float(lo), float(hi)), False, how)
    if split is None or not split.examples:
        return EvalForecast(0.0, none, False, "evaluation not counted: the held-out split's size is unknown")
    why = "fewer than two depths timed it and the plan does not model it here (no GPU bandwidth known)"
    return EvalForecast(0.0, none, False, f"evaluation not counted: {why}")


def _from_fits(
    fits: dict[str, Fit | None],
    timed: dict[str, Any],
    split: EvalSplit,
    profile: Any,
    full: int,
    scaling: Scaling,
    plan: dict[str, Any],
) -> EvalForecast:
    """Each timed figure at full depth on the target, and evaluation counted from them at the target's
    batch (the plan's)."""
    es = EvalScaling.of(scaling)
    lines: list[str] = []
    target: dict[str, float] = {}
    ranges: dict[str, Range] = {}
    for key, (_, bound) in FIGURES.items():
        fit = fits.get(key)
        if fit is not None:
            target[key], ranges[key] = _scaled(fit, bound, full, es)
    if es.gpus > 1:
        lines.append(_spread(es.gpus, target, ranges))
    batch = int(((plan.get("run") or {}).get("evaluation") or {}).get("batch") or EVAL_BATCH_SIZE)
    think = profile.eval.max_think_tokens
    shape = EvalShape(split, float(timed.get("prompt_tokens") or 0), think, min(batch, MAX_EVAL_BATCH))
    lines += [
        *es.lines(),
        f"evaluation's batch on the target: {shape.batch} (the plan's, as evaluation chooses it from the "
        "memory free once loaded); a prefill and a decode step read between the batches timed "
        "(piecewise linear in the batch)",
    ]
    timed_batches = {
        p: 1 if k == "1" else int(timed[k]) for p, k in BATCHES.items() if k == "1" or timed.get(k)
    }
    largest = max(timed_batches.values())
    if shape.batch > largest:
        lines.append(
            f"evaluation's batch {shape.batch} is past the largest timed ({largest}): the line through the "
            "two largest is extended, an upper bound (a decode step reads its weights once, whatever the "
            "batch)"
        )
    result = EvalForecast(0.0, (0.0, 0.0), True, "", fits, target, ranges, shape, lines, timed_batches)
    for figure in ("prefill_s", "decode_step_s"):
        floor, raised = 0.0, []
        for b, p in sorted((b, p) for p, b in timed_batches.items() if p + figure in target):
            if target[p + figure] < floor:
                raised.append(f"{b} ({target[p + figure]:.4g} s, read as {floor:.4g} s)")
            floor = max(floor, target[p + figure])
        if raised:
            lines.append(f"{figure} below a smaller batch's at batch {', '.join(raised)}: timing noise")
    n = split.examples
    total = budgeted(profile, eval_seconds(shape, result.costs()))
    least = budgeted(
        profile, eval_seconds(shape, result.costs(0), split.least if split.least is not None else n)
    )
    most = budgeted(profile, eval_seconds(shape, result.costs(1)))
    result.total_s, result.range_s = total, (min(least, total), max(most, total))
    depths = ", ".join(str(d) for d, _ in fits["decode_step_s"].points)  # type: ignore[union-attr]
    result.how = (
        f"evaluation timed on the slices ({depths} layers) and scaled: {shape.systems} systems x {n:,.0f} "
        f"examples, {shape.batches_words(n)} of {shape.batch} prompts of {shape.prompt_tokens:,.0f} tokens "
        f"(prefill {result.costs().prefill_s:.2f} s + {shape.think_tokens} thinking tokens x "
        f"{result.costs().decode_step_s * 1000:.1f} ms a step), {shape.forwards(n)} scoring forwards x "
        f"{target['score_s']:.2f} s; each example thinks to eval.max_think_tokens (an upper bound); "
        f"examples: {split.how}"
        + (
            f"; at most eval.time_budget_s {profile.eval.time_budget_s:g} s"
            if profile.eval.time_budget_s
            else ""
        )
    )
    return result


def _spread(gpus: int, target: dict[str, float], ranges: dict[str, Range]) -> str:
    """Where evaluation spans the target's GPUs its decode step replays a CUDA graph on each
    (`trainer/evaluation/decode_blocks.py`): each step gains `spread_overhead`. Adds it to `target` and
    `ranges`; says how. (The rehearsal's steps launched one by one, `eager_*`, are what it costs if a capture
    fails: not counted.)"""
    extra = spread_overhead(gpus)
    for key in DECODE_STEPS:
        if key in target:
            target[key] += extra
            lo, hi = ranges[key]
            ranges[key] = (lo + extra, hi + extra)
    return (
        f"evaluation spans the target's {gpus} GPUs: its decode step replays a CUDA graph on each, "
        f"{extra * 1000:.2f} ms more a step ({GRAPH_BLOCK_SOURCE}; the copies between GPUs not counted)"
    )
