"""The whole run predicted from a rehearsal: each figure's fit read at full depth, scaled to the target.

The fits (`cockpit.rehearse.figures`) give each figure at the model's full depth on the machine the
rehearsal ran on, with its range and whether the depths measured it (`says`). Scaling to the profile's
GPUs (their count and model) uses the plan's exact weight bytes (`cockpit.plan`, checked against the
trainer by `tests/test_contract.py`) and states every assumption it makes (`Scaling.lines`). The wall
clock a user books is a range, and the forecast names what dominates it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cockpit.plan.inputs import GiB
from cockpit.plan.run_length import data_size, run_steps
from cockpit.plan.validation_time import validation_time
from cockpit.rehearse.evaluation import EvalForecast, forecast_eval
from cockpit.rehearse.figures import fit_all, gathered_knee, terms_for
from cockpit.rehearse.fit import Fit
from cockpit.rehearse.measure import DepthMeasure
from cockpit.rehearse.scaling import Scaling, serial_fetch, step_target
from cockpit.rehearse.serving import serving

__all__ = ["LABELS", "Forecast", "ModelFacts", "Scaling", "forecast", "model_facts"]

TOLERANCE = 0.15
CACHE_ASSUMPTION = (
    "NF4 cache (a second run, a resume, evaluation's reload): the plan's packed bytes (NF4 codes, scales, "
    "quantization state, the rest in 16 bit) read at the same disk rate, and at most the first load's "
    "work a layer (it skips the quantization, not told apart from placement here: an upper bound)"
)
WALL_PARTS = {
    "load_s": "load",
    "start_s": "start-up",
    "train_s": "training",
    "save_s": "checkpoint saves",
    "validation_s": "validation",
    "eval_s": "evaluation",
}


@dataclass(frozen=True)
class ModelFacts:
    """What the plan knows exactly about the whole model (bytes from the contract-checked formats)."""

    layers: int
    layer_bytes: float  # stored weight bytes of one decoder layer (what ZeRO-3 partitions and gathers)
    other_bytes: float  # embeddings, final norm, head
    checkpoint_bytes: float  # the 16-bit checkpoint on disk
    cache_bytes: float = 0.0  # the NF4 cache a later load reads (`cockpit.plan.load_read`); 0: none kept


def model_facts(plan: dict[str, Any]) -> ModelFacts:
    """ModelFacts from a plan's dict (`Plan.to_dict()`: `model.layers`, `zero3.blocks`, `disk`)."""
    blocks = plan.get("zero3", {}).get("blocks", {})
    layer_blocks = [v for k, v in blocks.items() if k.startswith("layer.")]
    layers = int(plan.get("model", {}).get("layers") or len(layer_blocks) or 1)
    layer_bytes = sum(layer_blocks) / max(1, len(layer_blocks))
    other = sum(v for k, v in blocks.items() if not k.startswith("layer."))
    return ModelFacts(
        layers=layers,
        layer_bytes=layer_bytes,
        other_bytes=other,
        checkpoint_bytes=float(plan.get("weights_bytes", {}).get("checkpoint") or 0.0),
        cache_bytes=float((plan.get("load") or {}).get("cache_bytes") or 0.0),
    )


Range = tuple[float, float]


@dataclass
class Forecast:
    """The whole run, predicted: each figure with its range, and which the depths measured."""

    layers: int
    fits: dict[str, Fit | None]
    here: dict[str, float | None]  # at full depth, on the measured machine (per rank)
    target: dict[str, float | None]  # on the profile's machine (per rank; host_gib for all ranks)
    wall: dict[str, float | None]
    plan: dict[str, float | None]
    disagreements: list[str]
    scaling: Scaling
    notes: list[str] = field(default_factory=list)
    depths: list[dict[str, Any]] = field(default_factory=list)  # the measured depths (DepthMeasure.to_dict)
    ranges: dict[str, dict[str, Range]] = field(default_factory=dict)  # here, target, wall: key -> lo, hi
    evaluation: EvalForecast | None = None  # evaluation on the profile's machine (`wall["eval_s"]`)
    serving: dict[str, Any] | None = None  # the tuned model served there, priced (`cockpit.rehearse.serving`)
    load_cache: dict[str, Any] | None = None  # a load from the NF4 cache (`wall["load_cached_s"]`)

    def measured(self, key: str) -> bool:
        """Whether the depths measured the figure (rather than bound it or take the plan's term)."""
        fit = self.fits.get(key)
        return fit is not None and fit.says

    def dominant(self) -> tuple[str, float] | None:
        """The part of the wall clock that weighs most, and its share."""
        total = self.wall.get("total_s")
        parts = {k: self.wall.get(k) or 0.0 for k in WALL_PARTS}
        if not total:
            return None
        key = max(parts, key=lambda k: parts[k])
        return WALL_PARTS[key], parts[key] / total

    def summary(self) -> str:
        """One line: the whole run's wall clock (a range) and speed on the profile's machine."""
        machine = self.scaling.target_machine
        total, step, tps = (
            self.wall.get("total_s"),
            self.target.get("step_s"),
            self.target.get("tokens_per_s"),
        )
        if total is None or step is None:
            ev = self.evaluation
            if ev is not None and ev.measured:  # depths that timed only evaluation (--eval-only)
                lo, hi = ev.range_s
                return (
                    f"predicted on {machine}: evaluation {ev.total_s / 3600:.2f} h ({lo / 3600:.2f}-"
                    f"{hi / 3600:.2f} h) for the base and the tuned model; training not measured"
                )
            return f"rehearsal: not enough depths measured to predict ({len(self.depths)} depth(s))"
        lo, hi = self.ranges.get("wall", {}).get("total_s", (total, total))
        top = self.dominant()
        share = f", {top[0]} {top[1]:.0%} of it" if top else ""
        evaluation = self.wall.get("eval_s") or 0.0
        if evaluation and top and top[0] != WALL_PARTS["eval_s"]:
            share += f", evaluation {evaluation / total:.0%}"
        bound = "" if self.measured("step_s") else " (the step is a bound: see the notes)"
        return (
            f"predicted on {machine}: {total / 3600:.2f} h ({lo / 3600:.2f}-{hi / 3600:.2f} h) for the whole "
            f"run{share} ({self.wall['steps']:.0f} steps of {step:.2f} s, {tps or 0:,.0f} tokens/s){bound}"
        )

    def to_dict(self) -> dict[str, Any]:
        top = self.dominant()
        return {
            "summary": self.summary(),
            "depths": self.depths,
            "layers": self.layers,
            "fits": {k: None if v is None else v.to_dict(self.layers) for k, v in self.fits.items()},
            "here": self.here,
            "target": self.target,
            "wall": self.wall,
            "ranges": {part: {k: list(v) for k, v in r.items()} for part, r in self.ranges.items()},
            "measured": {k: self.measured(k) for k in self.fits},
            "dominant": {"part": top[0], "share": top[1]} if top else None,
            "plan": self.plan,
            "disagreements": self.disagreements,
            "assumptions": self.scaling.lines()
            + ([CACHE_ASSUMPTION] if self.load_cache else [])
            + (self.evaluation.assumptions if self.evaluation else []),
            "notes": self.notes,
            "evaluation": self.evaluation.to_dict(self.layers) if self.evaluation else None,
            "serving": self.serving,
            "load_cache": self.load_cache,
        }


def _validation_target(
    here: dict[str, float | None],
    here_range: dict[str, Range],
    target: dict[str, float | None],
    target_range: dict[str, Range],
) -> None:
    """A validation forward on the target: the one measured here at full depth, scaled as the optimizer
    step is (a forward is the step's forward, on the same layers, copies and gathers); none where the
    depths timed none (records before the `rehearse_validation` event) or the step is unknown."""
    forward, step, there = here.get("validation_s"), here.get("step_s"), target.get("step_s")
    target["validation_s"] = None
    target_range.pop("validation_s", None)
    if forward is None or not step or there is None:
        return
    ratio = there / step
    target["validation_s"] = forward * ratio
    lo, hi = here_range.get("validation_s", (forward, forward))
    target_range["validation_s"] = (lo * ratio, hi * ratio)


def _shift(r: Range | None, delta: float) -> Range | None:
    return None if r is None else (r[0] + delta, r[1] + delta)


def forecast(
    measures: list[DepthMeasure],
    profile: Any,
    plan: dict[str, Any],
    scaling: Scaling,
) -> Forecast:
    """Fit the depths, read them at full depth, scale to the profile's machine, add the wall clock."""
    facts = model_facts(plan)
    nm, nt = scaling.measured_gpus or 1, scaling.target_gpus or 1
    full = facts.layers
    terms = terms_for(profile, plan, full, facts.layer_bytes, nm, scaling.h2d_gbps_measured)
    fits = fit_all(measures, terms)
    # A cost cannot be negative: a fit that extrapolates below zero (a save of ~0 s) reads as zero.
    here: dict[str, float | None] = {k: (max(0.0, v.at(full)) if v else None) for k, v in fits.items()}
    here_range: dict[str, Range] = {k: v.range(full) for k, v in fits.items() if v}
    notes: list[str] = [v.note for v in fits.values() if v is not None and v.note]
    done = [m for m in measures if m.complete]
    if len(done) < 2:
        notes.append("fewer than two depths measured: nothing can be fitted")
    ds = profile.deepspeed
    offload = ds.offload_param != "none"
    weights = facts.layer_bytes * full + facts.other_bytes
    moved = weights * (1 / nm - 1 / nt) / GiB  # partitions each rank no longer holds
    target: dict[str, float | None] = dict(here)
    target_range: dict[str, Range] = dict(here_range)

    def shift(key: str, delta: float) -> None:
        if target[key] is not None:
            target[key] = target[key] + delta
            target_range[key] = _shift(target_range.get(key), delta) or (target[key], target[key])

    if not offload and ds.stage == 3:
        for key in ("gpu_load", "gpu_train"):
            shift(key, -moved)
        # one rank without offload holds every layer whole and gathers none; several gather a window
        knee = gathered_knee(profile, nt)
        if knee and gathered_knee(profile, nm) is None:
            shift("gpu_train", knee * facts.layer_bytes / GiB)
    if offload and ds.stage == 3:
        # Each rank pins its partitions of every layer: what a layer adds to a rank's RSS here (the pinned
        # allocator's rounding included) is shared by the target's ranks.
        for key in ("rss_load", "rss_train"):
            fit = fits.get(key)
            if fit is not None:
                shift(key, -fit.per_layer * full * (1 - nm / nt))
    rss_here = [v for v in (here["rss_load"], here["rss_train"]) if v is not None]
    here["host_gib"] = max(rss_here) * nm if rss_here else None
    per_node = nt // max(1, scaling.target_nodes)
    rss = [v for v in (target["rss_load"], target["rss_train"]) if v is not None]
    target["host_gib"] = max(rss) * per_node if rss else None  # a node's
    if rss:
        key = max((k for k in ("rss_load", "rss_train") if target[k] is not None), key=lambda k: target[k])
        lo, hi = target_range.get(key, (target[key], target[key]))
        target_range["host_gib"] = (lo * per_node, hi * per_node)
    pages = ((plan.get("configured") or {}).get("load") or {}).get("rss_terms", {}).get("checkpoint pages")
    if pages and target["rss_load"] is not None:
        # Random weights map no checkpoint; the real load maps it, and its pages count in each rank's RSS
        # (shared page cache, not more RAM: host_gib leaves them out).
        shift("rss_load", pages / GiB)
        notes.append(
            f"host RSS at load adds the plan's {pages / GiB:.1f} GiB of mapped checkpoint pages a rank "
            "(random weights map none; shared page cache, not counted in host RAM)"
        )
    step_fit = fits.get("step_s")
    if step_fit is not None:
        target["step_s"], target_range["step_s"] = step_target(step_fit, facts, profile, scaling)
        if step_fit.knee and step_fit.says:
            notes.append(
                f"step with offload: {step_fit.per_layer:.3f} s a further layer here, the line of the depths "
                f"at or past the prefetch window ({step_fit.knee} layers); its slope stands for compute when "
                f"scaled (copy {terms.copy_s:.3f} s a layer an optimizer step here), an upper bound where "
                "the copy sets it"
            )
        if step_fit.knee and serial_fetch(profile, scaling):
            notes.append(
                f"step on {nt} ranks: they fetch offloaded layers by DeepSpeed's own fetch, these depths "
                "by the overlapped one (one rank); how much of the copies and gathers compute hides there "
                "is not measured: the step's range reaches them added to compute"
            )
    _validation_target(here, here_range, target, target_range)
    tokens_step = statistics_tokens(done)
    step = here.get("step_s")
    here["tokens_per_s"] = tokens_step / step if tokens_step and step else None
    # tokens a step are every rank's (the trainer's count is gathered): per rank, times the target's ranks
    target_step = target.get("step_s")
    target["tokens_per_s"] = tokens_step / nm * nt / target_step if tokens_step and target_step else None
    if tokens_step and "step_s" in target_range:
        lo, hi = target_range["step_s"]
        target_range["tokens_per_s"] = (
            tokens_step / nm * nt / hi if hi else 0.0,
            tokens_step / nm * nt / lo if lo else 0.0,
        )
    data = next((m.data for m in reversed(done) if m.data), {})
    size = data_size(profile, data)
    steps, how = run_steps(profile, size, nt)
    notes.append(f"training tokens: {how}")
    evaluation = forecast_eval(measures, profile, full, scaling, plan, size)
    plan_values = plan_figures(plan)
    wall, wall_range = _wall(
        profile, facts, scaling, target, target_range, steps, size, evaluation, notes, plan_values
    )
    return Forecast(
        layers=full,
        fits=fits,
        here=here,
        target=target,
        wall=wall,
        plan=plan_values,
        disagreements=disagreements(target, plan_values),
        scaling=scaling,
        notes=notes,
        depths=[m.to_dict() for m in measures],
        ranges={"here": here_range, "target": target_range, "wall": wall_range},
        evaluation=evaluation,
        serving=serving(evaluation, profile, scaling.target_machine),
        load_cache=load_cache_facts(facts, scaling, wall),
    )


def _wall(
    profile: Any,
    facts: ModelFacts,
    scaling: Scaling,
    target: dict[str, float | None],
    target_range: dict[str, Range],
    steps: int,
    size: Any,
    evaluation: EvalForecast,
    notes: list[str],
    plan_values: dict[str, float | None],
) -> tuple[dict[str, float | None], dict[str, Range]]:
    """The run's wall clock on the target, part by part, each with its range. A validation forward is the
    rehearsed one where the depths timed it, else the plan's modelled one scaled to the rehearsed step."""
    nt = scaling.target_gpus or 1
    disk = facts.checkpoint_bytes / (scaling.disk_gbps * 1e9)
    work = target["load_s"] or 0.0
    load = work + disk
    load_r = _shift(target_range.get("load_s"), disk) or (load, load)
    start = target.get("start_s") or 0.0
    step = target.get("step_s")
    train = steps * step if step and steps else None
    step_lo, step_hi = target_range.get("step_s", (step or 0.0, step or 0.0))
    train_r = (steps * step_lo, steps * step_hi) if train is not None else (0.0, 0.0)
    saves = steps // profile.training.save_steps if profile.training.save_steps else 0
    save = (saves + 1) * (target["save_s"] or 0.0)
    save_lo, save_hi = target_range.get("save_s", (target["save_s"] or 0.0,) * 2)
    save_r = ((saves + 1) * save_lo, (saves + 1) * save_hi)
    eval_s = evaluation.total_s
    micro_step = step / profile.training.grad_accum if step else None
    forward = target.get("validation_s")
    planned, plan_step = plan_values.get("validation_s"), plan_values.get("step_s")
    timed = None
    if forward:
        timed = (forward, f"rehearsed: {forward:.2f} s a forward, timed on the slices and scaled")
    elif planned and plan_step and step:
        timed = (
            planned * step / plan_step,
            f"the plan's {planned:.2f} s a forward, scaled to the rehearsed step",
        )
    validation = validation_time(profile, steps, nt, micro_step, size, timed)
    validation_s = validation.total_s if validation is not None and validation.total_s is not None else 0.0
    if forward:  # rehearsed: the forward's own range
        validation_r = tuple(validation_s * x / forward for x in target_range["validation_s"])
    else:  # modelled as a share of the step: the step's range
        validation_r = tuple(validation_s * x / step if step else validation_s for x in (step_lo, step_hi))
    wall: dict[str, float | None] = {
        "load_s": load,
        "start_s": start,
        "steps": float(steps),
        "train_s": train,
        "saves": float(saves + 1),
        "save_s": save,
        "validations": float(validation.passes) if validation is not None else 0.0,
        "validation_s": validation_s,
        "eval_s": eval_s,
        "total_s": None if train is None else load + start + train + save + validation_s + eval_s,
    }
    parts = {
        "load_s": load_r,
        "start_s": (start, start),
        "train_s": train_r,
        "save_s": save_r,
        "validation_s": validation_r,
        "eval_s": evaluation.range_s,
    }
    wall_range = dict(parts)
    if train is not None:
        wall_range["total_s"] = (sum(r[0] for r in parts.values()), sum(r[1] for r in parts.values()))
    if facts.cache_bytes:  # a second run, a resume: the same run loading from the NF4 cache
        cached, cached_r = cached_load(facts.cache_bytes, scaling.disk_gbps, work, load_r[1] - disk)
        wall["load_cached_s"], wall_range["load_cached_s"] = cached, cached_r
        total = wall["total_s"]
        if total is not None:
            lo, hi = wall_range["total_s"]
            wall["total_cached_s"] = total - load + cached
            wall_range["total_cached_s"] = (lo - load_r[0] + cached_r[0], hi - load_r[1] + cached_r[1])
    ev_lo, ev_hi = evaluation.range_s
    for total_key, key in (("total_s", "without_eval_s"), ("total_cached_s", "without_eval_cached_s")):
        if wall.get(total_key) is not None:  # the training run alone, its load included: what a run books
            lo, hi = wall_range[total_key]
            wall[key], wall_range[key] = wall[total_key] - eval_s, (lo - ev_lo, hi - ev_hi)
    if validation is not None:
        notes.append(f"validation loss ({'rehearsed' if forward else 'not rehearsed'}): {validation.words()}")
    elif profile.validation.eval_steps:
        notes.append("validation loss not counted: the validation sample's size is unknown here")
    notes.append(evaluation.how)
    return wall, wall_range


def load_cache_facts(facts: ModelFacts, s: Scaling, wall: dict[str, float | None]) -> dict[str, Any] | None:
    """The NF4 cache's bytes (the cache's disk use too), their read, and the cached load's work bound."""
    if not facts.cache_bytes:
        return None
    rate = s.disk_gbps * 1e9
    return {
        "cache_bytes": facts.cache_bytes,
        "checkpoint_bytes": facts.checkpoint_bytes,
        "disk_gbps": s.disk_gbps,
        "read_s": facts.cache_bytes / rate,
        "checkpoint_read_s": facts.checkpoint_bytes / rate,
        "work_bound_s": (wall.get("load_cached_s") or 0.0) - facts.cache_bytes / rate,
    }


def cached_load(cache_bytes: float, disk_gbps: float, work_s: float, work_hi: float) -> tuple[float, Range]:
    """A load from the NF4 cache: its bytes read at the disk rate, and at most the first load's work.

    The rehearsal's load work a layer (random weights: drawn, quantized, placed) holds the quantization
    a cached load skips and the placement (partitions, pinned copies) it still pays, not told apart: the
    figure is the bound (the first load's work, its range's top), the range's low end the read alone."""
    read = cache_bytes / (disk_gbps * 1e9)
    return read + work_s, (read, read + max(work_s, work_hi))


def statistics_tokens(done: list[DepthMeasure]) -> float | None:
    values = [m.tokens_per_step for m in done if m.tokens_per_step]
    return sum(values) / len(values) if values else None


def plan_figures(plan: dict[str, Any]) -> dict[str, float | None]:
    """The plan's own figures for the configured setup, in the forecast's units."""
    c = plan.get("configured") or {}
    load, train = c.get("load") or {}, c.get("train") or {}

    def gib(v: Any) -> float | None:
        return None if not v else float(v) / GiB  # 0: nothing planned there (no GPUs)

    return {
        "gpu_load": gib(load.get("gpu_peak")),
        "gpu_train": gib(train.get("gpu_peak")),
        "rss_load": gib(load.get("rss_peak")),
        "rss_train": gib(train.get("rss_peak")),
        "host_gib": gib(max(load.get("host_peak") or 0, train.get("host_peak") or 0) or None),
        # The plan's step is a micro-batch's; the forecast's an optimizer step's.
        "step_s": (plan.get("run") or {}).get("optimizer_step_s") or c.get("step_s"),
        "tokens_per_s": c.get("tokens_per_s"),
        "validation_s": _plan_forward(((plan.get("run") or {}).get("validation")) or {}),
    }


def _plan_forward(validation: dict[str, Any]) -> float | None:
    """The plan's validation forward of a micro-batch: its pass over the forwards a rank runs."""
    pass_s, rounds = validation.get("pass_s"), validation.get("rounds")
    return pass_s / rounds if pass_s and rounds else None


LABELS = {
    "gpu_load": "GPU peak at load, GiB a GPU",
    "gpu_train": "GPU peak in training, GiB a GPU",
    "rss_load": "host RSS at load, GiB a rank",
    "rss_train": "host RSS in training, GiB a rank",
    "host_gib": "host RAM, GiB all ranks",
    "step_s": "optimizer step, s",
    "tokens_per_s": "tokens/s, all GPUs",
    "validation_s": "validation forward, s a micro-batch",
}


def disagreements(target: dict[str, float | None], plan: dict[str, float | None]) -> list[str]:
    """Figures where the plan and the rehearsal differ by more than 15% (the rehearsal's is measured)."""
    out = []
    for key, label in LABELS.items():
        mine, theirs = target.get(key), plan.get(key)
        if mine is None or theirs is None or mine == 0:
            continue
        error = (theirs - mine) / abs(mine)
        if abs(error) > TOLERANCE:
            out.append(
                f"{label}: plan {theirs:.3g}, rehearsal {mine:.3g} ({error:+.0%}); the rehearsal's is "
                "measured (fitted over the depths and scaled), the plan's is modelled"
            )
    return out
