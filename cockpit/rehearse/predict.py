"""The whole run predicted from a rehearsal: costs linear in depth, fitted, then scaled to the target.

Every figure a depth measured is fitted as `fixed + per_layer x layers` (least squares over the depths;
two depths at least) and read at the model's full depth: that is the prediction for the machine the
rehearsal ran on. Scaling to the profile's GPUs (their count and model) uses the plan's exact weight
bytes (`cockpit.plan`, checked against the trainer by `tests/test_contract.py`) and states every
assumption it makes (`Scaling.lines`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from cockpit.contract import EVAL_BATCH_SIZE, ZERO3_LAYER_FETCHES
from cockpit.plan.model import GiB
from cockpit.plan.run_length import data_size, run_steps
from cockpit.plan.validation_time import validation_time
from cockpit.rehearse.measure import DEFAULT_LAYERS, DepthMeasure

TOLERANCE = 0.15
METRICS = ("gpu_load", "gpu_train", "rss_load", "rss_train", "step_s", "load_s", "save_s")


@dataclass(frozen=True)
class Linear:
    """value = fixed + per_layer x layers, fitted to (layers, value) points."""

    fixed: float
    per_layer: float
    points: tuple[tuple[int, float], ...]

    def at(self, layers: float) -> float:
        return self.fixed + self.per_layer * layers


def fit(points: list[tuple[int, float]]) -> Linear | None:
    """Least squares over at least two distinct depths; None with fewer.

    Every figure fitted here (memory, seconds) can only grow with depth; a negative slope is two depths'
    noise, and read 90 layers out it would predict nothing at all. It is read as flat at the largest
    value measured (per layer 0: the conservative line through no fewer bytes or seconds than any depth).
    """
    if len({d for d, _ in points}) < 2:
        return None
    n = len(points)
    mx = sum(d for d, _ in points) / n
    my = sum(v for _, v in points) / n
    slope = sum((d - mx) * (v - my) for d, v in points) / sum((d - mx) ** 2 for d, _ in points)
    if slope < 0:
        return Linear(max(v for _, v in points), 0.0, tuple(points))
    return Linear(my - slope * mx, slope, tuple(points))


@dataclass(frozen=True)
class Gathered:
    """The layers ZeRO-3 keeps gathered in training: the computing one and `ahead` prefetched behind it,
    so `min(depth, 1 + ahead)` layers of `layer_gib`: a term that stops growing with depth. The GPU
    peak is fitted without it and has it added back at the depth read."""

    layer_gib: float = 0.0
    ahead: int = 0

    def at(self, layers: float) -> float:
        return min(layers, 1 + self.ahead) * self.layer_gib if self.ahead else 0.0


@dataclass(frozen=True)
class PlusGathered:
    """The GPU peak in training: a line fitted without the gathered layers, which are added back at the
    depth read (they stop growing once the prefetch window is full)."""

    line: Linear
    gathered: Gathered

    fixed = property(lambda self: self.line.fixed)
    per_layer = property(lambda self: self.line.per_layer)
    points = property(lambda self: self.line.points)

    def at(self, layers: float) -> float:
        return self.line.at(layers) + self.gathered.at(layers)


@dataclass(frozen=True)
class Copies:
    """Parameter offload's host-to-device traffic, per rank: one decoder layer's copies an optimizer step
    (`ZERO3_LAYER_FETCHES` a micro-batch, its bytes, this rank's share, over the link's bandwidth), the
    copies of embeddings and head beyond one layer's, and the layers whose copy cannot run under compute:
    the computing one and the prefetched ones (`window`)."""

    layer_s: float
    other_s: float
    window: int


def prefetch_window(profile: Any) -> int | None:
    """Layers whose copies fill ZeRO-3's prefetch at the start of a pass (the one computing and those
    prefetched), where parameters are offloaded and prefetched; else None."""
    ds = profile.deepspeed
    if ds.stage != 3 or ds.offload_param == "none" or not ds.prefetch_layers:
        return None
    return 1 + math.ceil(ds.prefetch_layers)


def default_depths(profile: Any, model_layers: int) -> list[int]:
    """The depths a rehearsal measures unless told: `DEFAULT_LAYERS`, and with parameter offload two
    depths at or past the prefetch window too (the window and twice it, as deep as the model goes), so
    that the step past the window is measured rather than inferred (`CopyBound.past`)."""
    depths = {d for d in DEFAULT_LAYERS if d <= model_layers}
    window = prefetch_window(profile)
    if window is not None:
        depths |= {d for d in (window, 2 * window) if d <= model_layers}
    return sorted(depths)


def copies_for(
    profile: Any, layer_bytes: float, other_bytes: float, ranks: int, h2d_gbps: float
) -> Copies | None:
    """The profile's offload copies on a machine of `ranks` ranks and `h2d_gbps` a link; None where
    parameters are not offloaded or nothing is prefetched (then nothing overlaps: the plain line holds)."""
    window = prefetch_window(profile)
    if window is None or h2d_gbps <= 0:
        return None
    micro = profile.training.grad_accum
    per_second = max(1, ranks) * h2d_gbps * 1e9
    return Copies(
        layer_s=ZERO3_LAYER_FETCHES * micro * layer_bytes / per_second,
        # embeddings and head cross once a micro-batch; the last layer once instead of twice
        other_s=micro * (other_bytes - layer_bytes) / per_second,
        window=window,
    )


@dataclass(frozen=True)
class CopyBound:
    """Step time with parameter offload: serial while the prefetch window fills, then copy- or
    compute-bound.

    Up to `window` layers, a layer's copy and its compute run one after the other (measured: the second
    layer costs both), so the depths measured there fit `fixed + (copy + compute) x layers`. Past the
    window the next layer's copy runs under this one's compute, and each further layer costs the longer
    of the two. The copy is exact (bytes over bandwidth, `Copies`); compute is the serial slope less it.
    Where two depths past the window were measured too (`past`), their line is read there instead, and
    its slope stands for compute (an upper bound where the copies set it): the trainer's overlapped
    fetch of one rank (`trainer/zero3_fetch.py`) hides copies inside the window too, so there the
    serial slope less the copy says too little. Measured on the story's
    slice (one H200, 4 rows of 4096 tokens a micro-batch): 0.174 s a layer past the window, 0.165 s
    without offload, against 0.101 s for the serial slope less the copy.
    """

    serial: Linear
    copies: Copies
    past: Linear | None = None

    # the line read past the window: the depths' there where measured, else the serial one
    fixed = property(lambda self: (self.past or self.serial).fixed)
    per_layer = property(lambda self: (self.past or self.serial).per_layer)

    @property
    def points(self) -> tuple[tuple[int, float], ...]:
        return tuple(sorted(set(self.serial.points + (self.past.points if self.past else ()))))

    @property
    def compute_s(self) -> float:
        """One layer's compute an optimizer step: with depths past the window their slope (an upper bound
        where the copies set it), else the serial slope less its copies (measured on several ranks, their
        all-gather of the layer is in it too)."""
        serial = max(0.0, self.serial.per_layer - self.copies.layer_s)
        if self.past is not None:  # the slope past the window: compute's, or its bound where the link's
            return max(serial, self.past.per_layer)
        return serial

    def at(self, layers: float) -> float:
        w = self.copies.window
        if self.past is not None and layers >= w:
            return self.past.at(layers)
        beyond = max(0.0, layers - w)
        return self.serial.at(min(layers, w)) + beyond * max(self.copies.layer_s, self.compute_s)


def step_fit(points: list[tuple[int, float]], copies: Copies | None) -> Linear | CopyBound | None:
    """Step time over depth: a line, or with offload `CopyBound` from the depths inside the prefetch
    window (and the line of those past it, where two were measured)."""
    if copies is None:
        return fit(points)
    serial = fit([(d, v) for d, v in points if d <= copies.window])
    if serial is None:
        return fit(points)
    past = [(d, v) for d, v in points if d >= copies.window]
    return CopyBound(serial, copies, fit(past) if len({d for d, _ in past}) >= 2 else None)


def fit_all(
    measures: list[DepthMeasure], gathered: Gathered | None = None, copies: Copies | None = None
) -> dict[str, Any]:
    """A model per metric over the complete depths, each read at any depth with `.at(layers)`: lines,
    the GPU peak in training fitted less `gathered` and given it back, the step copy-bound with offload."""
    done = [m for m in measures if m.complete]
    fits: dict[str, Any] = {}
    for metric in METRICS:
        points = []
        for m in done:
            value = getattr(m, metric) if metric.endswith("_s") else m.peak(metric)
            if value is not None:
                if metric == "gpu_train" and gathered is not None:
                    value -= gathered.at(m.layers)
                points.append((m.layers, float(value)))
        if metric == "step_s":
            fits[metric] = step_fit(points, copies)
            continue
        line = fit(points)
        if metric == "gpu_train" and gathered is not None and gathered.ahead and line is not None:
            fits[metric] = PlusGathered(line, gathered)
        else:
            fits[metric] = line
    return fits


def gathered_for(profile: Any, layer_bytes: float, ranks: int | None = None) -> Gathered:
    """What the profile keeps gathered beyond the computing layer, of `layer_bytes` each, on `ranks`
    ranks (default: the profile's): its prefetched layers, where ZeRO-3 gathers (parameter offload, or
    several ranks; one rank without offload holds every layer whole and gathers none)."""
    ds = profile.deepspeed
    world = profile.world_size if ranks is None else ranks
    gathers = ds.stage == 3 and (ds.offload_param != "none" or world > 1)
    if not gathers or not ds.prefetch_layers:
        return Gathered()
    return Gathered(layer_bytes / GiB, math.ceil(ds.prefetch_layers))


@dataclass(frozen=True)
class Scaling:
    """From the machine the rehearsal ran on to the profile's: every assumption, with its value."""

    measured_gpus: int
    measured_gpu: str
    target_gpus: int  # every rank of the target: nodes x GPUs a node
    target_gpu: str
    target_gpu_mem_gib: float
    target_host_ram_gib: float
    compute_ratio: float  # target step compute time / measured (datasheet bf16 rates; 1.0 when unknown)
    h2d_gbps_measured: float
    h2d_gbps_target: float
    gpu2gpu_gbps: float
    disk_gbps: float
    target_nodes: int = 1  # hosts of the target, each with target_gpus / target_nodes ranks
    internode_gbps: float = 0.0  # what each node's network carries of an all-gather (several nodes)

    @property
    def target_machine(self) -> str:
        """`4 x H100-80GB`, or `2 nodes x 4 x H100-80GB` when the target spans several hosts."""
        gpu = self.target_gpu or self.measured_gpu or "CPU"
        if self.target_nodes > 1:
            return f"{self.target_nodes} nodes x {self.target_gpus // self.target_nodes} x {gpu}"
        return f"{self.target_gpus} x {gpu}"

    def lines(self) -> list[str]:
        network = (
            [
                f"between nodes: {self.internode_gbps:g} GB/s a node for the other nodes' partitions (the "
                "network, assumed: no run over several nodes measured yet); host RAM is a node's"
            ]
            if self.target_nodes > 1
            else []
        )
        return [
            f"GPUs: measured on {self.measured_gpus} x {self.measured_gpu or 'CPU'}, predicted for "
            f"{self.target_machine}",
            f"bf16 rate: target compute time = measured x {self.compute_ratio:.2f} (datasheet dense bf16 "
            "rates; the H100 and the H200 share one chip, so 1.00 between them)",
            f"GPU memory: {self.target_gpu_mem_gib or 'unknown'} GiB a GPU on the target; host RAM "
            f"{self.target_host_ram_gib or 'unknown'} GiB",
            f"host-to-device: {self.h2d_gbps_measured:g} GB/s here, {self.h2d_gbps_target:g} GB/s "
            "a GPU on the target (pinned copies, each GPU its own link; 55 GB/s measured on the H200 hosts); "
            f"a layer crosses {ZERO3_LAYER_FETCHES} times a micro-batch; with offload, the prefetch window's "
            "layers copy and compute in turn and every further layer's copy runs under compute (as measured "
            "there)",
            f"GPU-to-GPU: ZeRO-3 gathers {self.gpu2gpu_gbps:g} GB/s a GPU (NVLink all-gather, assumed); "
            "prefetch hides them under compute when shorter",
            f"disk: the 16-bit checkpoint read once at {self.disk_gbps:g} GB/s at load (random weights read "
            "nothing)",
            "ZeRO-3 partitions: weights (GPU without offload, pinned host memory with it) divide by the "
            "rank count; activations and the gathered working set do not",
            *network,
        ]


@dataclass
class Forecast:
    """The whole run, predicted."""

    layers: int
    fits: dict[str, Linear | None]
    here: dict[str, float | None]  # at full depth, on the measured machine (per rank)
    target: dict[str, float | None]  # on the profile's machine (per rank; host_gib for all ranks)
    wall: dict[str, float | None]
    plan: dict[str, float | None]
    disagreements: list[str]
    scaling: Scaling
    notes: list[str] = field(default_factory=list)
    depths: list[dict[str, Any]] = field(default_factory=list)  # the measured depths (DepthMeasure.to_dict)

    def summary(self) -> str:
        """One line: the whole run's wall clock and speed on the profile's machine."""
        s = self.scaling
        machine = s.target_machine
        total, step, tps = (
            self.wall.get("total_s"),
            self.target.get("step_s"),
            self.target.get("tokens_per_s"),
        )
        if total is None or step is None:
            return f"rehearsal: not enough depths measured to predict ({len(self.depths)} depth(s))"
        return (
            f"predicted on {machine}: {total / 3600:.1f} h for the whole run "
            f"({self.wall['steps']:.0f} steps of {step:.2f} s, {tps or 0:,.0f} tokens/s)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "depths": self.depths,
            "layers": self.layers,
            "fits": {
                k: None if v is None else {"fixed": v.fixed, "per_layer": v.per_layer, "points": v.points}
                for k, v in self.fits.items()
            },
            "here": self.here,
            "target": self.target,
            "wall": self.wall,
            "plan": self.plan,
            "disagreements": self.disagreements,
            "assumptions": self.scaling.lines(),
            "notes": self.notes,
        }


@dataclass(frozen=True)
class ModelFacts:
    """What the plan knows exactly about the whole model (bytes from the contract-checked formats)."""

    layers: int
    layer_bytes: float  # stored weight bytes of one decoder layer (what ZeRO-3 partitions and gathers)
    other_bytes: float  # embeddings, final norm, head
    checkpoint_bytes: float  # the 16-bit checkpoint on disk
    decode_bytes_per_token: float  # weights a batched decode step reads (eval estimate)


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
        decode_bytes_per_token=layer_bytes * layers + other,
    )


def forecast(
    measures: list[DepthMeasure],
    profile: Any,
    plan: dict[str, Any],
    scaling: Scaling,
    eval_examples: int = 0,
) -> Forecast:
    """Fit the depths, read them at full depth, scale to the profile's machine, add the wall clock."""
    facts = model_facts(plan)
    nm, nt = scaling.measured_gpus or 1, scaling.target_gpus or 1
    # The depths ran on nm ranks: what they kept gathered is fitted out; the target keeps its own.
    gathered = gathered_for(profile, facts.layer_bytes, nm)
    gathered_target = gathered_for(profile, facts.layer_bytes, nt)
    copies = copies_for(profile, facts.layer_bytes, facts.other_bytes, nm, scaling.h2d_gbps_measured)
    fits = fit_all(measures, gathered, copies)
    full = facts.layers
    # A cost cannot be negative: a fit that extrapolates below zero (a save of ~0 s) reads as zero.
    here: dict[str, float | None] = {k: (max(0.0, v.at(full)) if v else None) for k, v in fits.items()}
    notes: list[str] = []
    done = [m for m in measures if m.complete]
    if len(done) < 2:
        notes.append("fewer than two depths measured: nothing can be fitted")
    ds = profile.deepspeed
    offload = ds.offload_param != "none"
    weights = facts.layer_bytes * full + facts.other_bytes
    moved = weights * (1 / nm - 1 / nt) / GiB  # partitions each rank no longer holds
    target: dict[str, float | None] = dict(here)
    if not offload and ds.stage == 3:
        for key in ("gpu_load", "gpu_train"):
            target[key] = None if here[key] is None else here[key] - moved
        if target["gpu_train"] is not None:  # e.g. one rank holds every layer; four gather them
            target["gpu_train"] += gathered_target.at(full) - gathered.at(full)
    if offload and ds.stage == 3:
        for key in ("rss_load", "rss_train"):
            target[key] = None if here[key] is None else here[key] - moved
    rss_here = [v for v in (here["rss_load"], here["rss_train"]) if v is not None]
    here["host_gib"] = max(rss_here) * nm if rss_here else None
    rss = [v for v in (target["rss_load"], target["rss_train"]) if v is not None]
    target["host_gib"] = max(rss) * (nt // max(1, scaling.target_nodes)) if rss else None  # a node's
    pages = ((plan.get("configured") or {}).get("load") or {}).get("rss_terms", {}).get("checkpoint pages")
    if pages and target["rss_load"] is not None:
        # Random weights map no checkpoint; the real load maps it, and its pages count in each rank's RSS
        # (shared page cache, not more RAM: host_gib leaves them out).
        target["rss_load"] += pages / GiB
        notes.append(
            f"host RSS at load adds the plan's {pages / GiB:.1f} GiB of mapped checkpoint pages a rank "
            "(random weights map none; shared page cache, not counted in host RAM)"
        )
    step = here["step_s"]
    step_model = fits["step_s"]
    if isinstance(step_model, CopyBound):
        target["step_s"] = copy_bound_target(step_model, facts, profile, scaling)
        past = step_model.past
        copy = step_model.copies.layer_s
        if past is not None:
            notes.append(
                f"step with offload: {past.per_layer:.3f} s a further layer here, the line of the depths at "
                f"or past the prefetch window ({step_model.copies.window} layers; copy {copy:.3f} s an "
                "optimizer step); its slope stands for compute when scaled, an upper bound where the copy "
                "sets it"
            )
        else:
            if nm == 1 and full > step_model.copies.window:
                depths = ",".join(map(str, default_depths(profile, full)))
                notes.append(
                    f"the step past the prefetch window ({step_model.copies.window} layers) is inferred "
                    "from depths inside it: on one rank the overlapped fetch hides copies there too, so "
                    "compute may read low (the story's slice: -19% at 16 layers); measure two depths at or "
                    f"past it as well (--layers {depths})"
                )
            notes.append(
                f"step with offload: {step_model.copies.window} layer(s) copied and computed in turn, then "
                f"{max(copy, step_model.compute_s):.3f} s a further layer here (copy {copy:.3f} s, compute "
                f"{step_model.compute_s:.3f} s an optimizer step, the serial slope less the copy)"
            )
    elif step is not None:
        moved_step = ZERO3_LAYER_FETCHES * profile.training.grad_accum * weights  # a step's gathered bytes
        h2d_here = moved_step / nm / (scaling.h2d_gbps_measured * 1e9) if offload else 0.0
        h2d_target = moved_step / nt / (scaling.h2d_gbps_target * 1e9) if offload else 0.0
        gather = gather_s(moved_step, scaling)
        compute = max(0.0, step - h2d_here) * scaling.compute_ratio
        target["step_s"] = max(compute, gather) + h2d_target
        if gather > compute:
            notes.append(f"ZeRO-3 gathers ({gather:.2f} s a step) would outlast compute ({compute:.2f} s)")
    tokens_step = statistics_tokens(done)
    here["tokens_per_s"] = tokens_step / step if tokens_step and step else None
    # tokens a step are every rank's (the trainer's count is gathered): per rank, times the target's ranks
    target_step = target.get("step_s")
    target["tokens_per_s"] = tokens_step / nm * nt / target_step if tokens_step and target_step else None
    data = next((m.data for m in reversed(done) if m.data), {})
    size = data_size(profile, data)
    steps, how = run_steps(profile, size, nt)
    notes.append(f"training tokens: {how}")
    load = (target["load_s"] or 0.0) + facts.checkpoint_bytes / (scaling.disk_gbps * 1e9)
    train = steps * target["step_s"] if target.get("step_s") and steps else None
    saves = steps // profile.training.save_steps if profile.training.save_steps else 0
    save = (saves + 1) * (target["save_s"] or 0.0)
    eval_s = eval_estimate(profile, facts, eval_examples, scaling)
    micro_step = target["step_s"] / profile.training.grad_accum if target.get("step_s") else None
    validation = validation_time(profile, steps, nt, micro_step, size)
    validation_s = validation.total_s if validation is not None and validation.total_s is not None else 0.0
    wall = {
        "load_s": load,
        "steps": float(steps),
        "train_s": train,
        "saves": float(saves + 1),
        "save_s": save,
        "validations": float(validation.passes) if validation is not None else 0.0,
        "validation_s": validation_s,
        "eval_s": eval_s,
        "total_s": None if train is None else load + train + save + validation_s + eval_s,
    }
    if validation is not None:
        notes.append(f"validation loss (not rehearsed): {validation.words()}")
    elif profile.validation.eval_steps:
        notes.append("validation loss not counted: the validation sample's size is unknown here")
    if not eval_examples:
        notes.append("evaluation not counted: the held-out split is not on this machine")
    else:
        notes.append(
            f"evaluation not rehearsed: {eval_examples} examples x {profile.eval.max_think_tokens} thinking "
            "tokens, each decode step reading every weight once at the target's memory bandwidth (estimate)"
        )
    plan_values = plan_figures(plan)
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
    )


def gather_s(moved_bytes: float, scaling: Scaling) -> float:
    """Seconds the target's ranks spend all-gathering `moved_bytes` of weights (each rank receives the
    others' partitions over NVLink, and over the network those of other nodes)."""
    nt, nodes = scaling.target_gpus or 1, scaling.target_nodes
    seconds = moved_bytes * (nt - 1) / nt / (scaling.gpu2gpu_gbps * 1e9)
    if nodes > 1 and scaling.internode_gbps:
        seconds += moved_bytes * (nodes - 1) / nodes / (scaling.internode_gbps * 1e9)
    return seconds


def copy_bound_target(model: CopyBound, facts: ModelFacts, profile: Any, scaling: Scaling) -> float:
    """The offloaded step on the target: the measured model read at full depth, plus what the parts modelled
    below change from this machine to the target (so a rehearsal on the target machine itself predicts
    exactly its own line)."""
    here = replace(
        scaling,
        target_gpus=scaling.measured_gpus or 1,
        target_nodes=1,
        compute_ratio=1.0,
        h2d_gbps_target=scaling.h2d_gbps_measured,
    )
    change = _offload_parts(model, facts, profile, scaling) - _offload_parts(model, facts, profile, here)
    return max(0.0, model.at(facts.layers) + change)


def _offload_parts(model: CopyBound, facts: ModelFacts, profile: Any, machine: Scaling) -> float:
    """The offloaded step part by part on `machine` (its target fields): each rank copies its share of a
    layer over its own link and all-gathers the rest; compute scales by the bf16 rate. Without depths
    past the window, the window's layers pay copy, gather and compute in turn and the others the longer
    of transfer and compute. With them, every layer costs the longer of transfer and compute (the
    window's turns, as measured, are in the line's fixed part: with the overlapped fetch of one rank,
    none). Compute is the measured one less the all-gathers the measuring ranks made."""
    nm = max(1, machine.measured_gpus or 1)
    c = model.copies
    link = (nm / (machine.target_gpus or 1)) * (machine.h2d_gbps_measured / machine.h2d_gbps_target)
    micro = profile.training.grad_accum
    measured = replace(machine, target_gpus=nm, target_nodes=1)
    layer_gather = ZERO3_LAYER_FETCHES * micro * facts.layer_bytes
    other_gather = micro * max(0.0, facts.other_bytes - facts.layer_bytes)
    layer_move = link * c.layer_s + gather_s(layer_gather, machine)
    compute = max(0.0, model.compute_s - gather_s(layer_gather, measured)) * machine.compute_ratio
    fixed = (model.fixed - c.other_s - gather_s(other_gather, measured)) * machine.compute_ratio
    fixed += link * c.other_s + gather_s(other_gather, machine)
    if model.past is not None:
        return fixed + facts.layers * max(layer_move, compute)
    inside = min(facts.layers, c.window)
    past = max(0, facts.layers - c.window)
    return fixed + inside * (layer_move + compute) + past * max(layer_move, compute)


def statistics_tokens(done: list[DepthMeasure]) -> float | None:
    values = [m.tokens_per_step for m in done if m.tokens_per_step]
    return sum(values) / len(values) if values else None


HBM_GBPS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0}


def eval_estimate(profile: Any, facts: ModelFacts, examples: int, scaling: Scaling) -> float:
    """Seconds of evaluation: for the base model and the fine-tuned one, every example's thinking decoded
    token by token, EVAL_BATCH_SIZE examples a batch. One process, its layers in blocks over the GPUs and
    run in turn: a decode step reads every weight once at one GPU's bandwidth."""
    if not examples:
        return 0.0
    bandwidth = next((v for k, v in HBM_GBPS.items() if k in scaling.target_gpu), 3000.0) * 1e9
    per_token = facts.decode_bytes_per_token / bandwidth
    systems = 2
    return systems * math.ceil(examples / EVAL_BATCH_SIZE) * profile.eval.max_think_tokens * per_token


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
    }


LABELS = {
    "gpu_load": "GPU peak at load, GiB a GPU",
    "gpu_train": "GPU peak in training, GiB a GPU",
    "rss_load": "host RSS at load, GiB a rank",
    "rss_train": "host RSS in training, GiB a rank",
    "host_gib": "host RAM, GiB all ranks",
    "step_s": "optimizer step, s",
    "tokens_per_s": "tokens/s, all GPUs",
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
