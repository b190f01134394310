"""What each rehearsal depth measured, read from the run record.

The supervisor brackets every depth with `rehearse_begin` / `rehearse_end` events; between them the
trainer ranks wrote `loaded`, `load_peak`, `step` and `checkpoint` events as in any run. Per depth and
per rank: GPU peak and host RSS at load (the `load_peak` event, written once the DeepSpeed engine exists)
and in training (the largest of the step events), the load time, the median step time after the
warm-up steps, the tokens a step and the time to save a checkpoint; a validation forward of a micro-batch
after the steps (the `rehearse_validation` event; records before it have none); and where the depth timed
it, the evaluation on its slice (the `rehearse_eval` event: a scoring forward, thinking batches).
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field
from typing import Any

BEGIN, END = "rehearse_begin", "rehearse_end"
WARMUP_STEPS = 2  # steps of each depth left out of its median (allocator warm-up, first launches)
DEFAULT_LAYERS = (1, 2, 4)  # the depths `cockpit rehearse` measures unless told
DEFAULT_STEPS = 6  # optimizer steps a depth: WARMUP_STEPS, then the timed ones
# New tokens of each thinking batch evaluation is timed with after a depth's steps (`cockpit rehearse
# --eval-tokens`): enough to time a decode step, which is what the forecast reads.
DEFAULT_EVAL_TOKENS = 32
# The trainer's event of evaluation timed on a depth's slice (`trainer.evaluation.eval_timing`).
EVAL = "rehearse_eval"
VALIDATION = "rehearse_validation"  # the trainer's event of validation forwards timed after a depth's steps
MIB_PER_GIB = 1024.0


@dataclass(frozen=True)
class DepthMeasure:
    """One depth of a rehearsal. Memory in GiB, per rank; times in seconds (rank 0)."""

    layers: int
    status: str  # "ok", "failed", "stopped", "running"
    ranks: int = 1
    load_s: float | None = None
    gpu_load_gib: dict[int, float] = field(default_factory=dict)
    gpu_train_gib: dict[int, float] = field(default_factory=dict)
    rss_load_gib: dict[int, float] = field(default_factory=dict)
    rss_train_gib: dict[int, float] = field(default_factory=dict)
    step_s: float | None = None
    steps_timed: int = 0
    step_sd_s: float | None = None  # the timed steps' standard deviation (older records: none)
    load_layer_s: float | None = None  # median seconds a layer of the layer-by-layer load (its progress)
    start_s: float | None = None  # start to first step, less the load (imports, data, engine)
    tokens_per_step: float | None = None
    save_s: float | None = None
    validation_s: float | None = None  # a validation forward of a micro-batch, a rank (its VALIDATION event)
    validation_error_s: float | None = None  # its own uncertainty: the forwards' spread over root count
    data: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    eval: dict[str, Any] = field(default_factory=dict)  # evaluation timed on the slice (its EVAL event)

    @property
    def complete(self) -> bool:
        """Measured far enough to fit: it finished its steps and its memory peaks are known."""
        return (
            self.status == "ok" and self.step_s is not None and bool(self.gpu_train_gib or self.rss_train_gib)
        )

    def peak(self, what: str) -> float | None:
        """The largest rank's figure for `gpu_load`, `gpu_train`, `rss_load` or `rss_train`."""
        values = getattr(self, f"{what}_gib")
        return max(values.values()) if values else None

    @property
    def step_error_s(self) -> float | None:
        """The median step's own uncertainty: the timed steps' spread over the square root of their count."""
        if self.step_sd_s is None or self.steps_timed < 2:
            return None
        return self.step_sd_s / self.steps_timed**0.5

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        for key in ("gpu_load_gib", "gpu_train_gib", "rss_load_gib", "rss_train_gib"):
            out[key] = {str(k): round(v, 3) for k, v in out[key].items()}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DepthMeasure:
        known = set(cls.__dataclass_fields__)
        values = {k: v for k, v in data.items() if k in known}  # a newer record's extra fields are skipped
        for key in ("gpu_load_gib", "gpu_train_gib", "rss_load_gib", "rss_train_gib"):
            values[key] = {int(k): float(v) for k, v in values.get(key, {}).items()}
        return cls(**values)


def _gib(mib: Any) -> float | None:
    return None if mib is None else float(mib) / MIB_PER_GIB


def _measure(
    layers: int, status: str, message: str, events: list[dict[str, Any]], begin_t: float | None = None
) -> DepthMeasure:
    gpu_load: dict[int, float] = {}
    rss_load: dict[int, float] = {}
    gpu_train: dict[int, float] = {}
    rss_train: dict[int, float] = {}
    steps: list[dict[str, Any]] = []
    load_s = save_s = validation_s = validation_error_s = None
    data: dict[str, Any] = {}
    timing: dict[str, Any] = {}
    ranks = 1
    first_step: int | None = None
    progress: list[float] = []
    train_t: float | None = None
    for e in events:
        rank, kind = int(e.get("rank", 0) or 0), e["kind"]
        if kind == "load_peak":
            if (g := _gib(e.get("cuda_peak_alloc_mib"))) is not None:
                gpu_load[rank] = g
            if (r := _gib(e.get("rss_peak_mib"))) is not None:
                rss_load[rank] = r
        elif kind == "step":
            if (g := _gib(e.get("cuda_peak_alloc_mib"))) is not None:
                gpu_train[rank] = max(gpu_train.get(rank, 0.0), g)
            if (r := _gib(e.get("rss_mib"))) is not None:
                rss_train[rank] = max(rss_train.get(rank, 0.0), r)
            if rank == 0:
                steps.append(e)
        elif kind == "train_begin" and rank == 0:
            ranks = int(e.get("world_size") or 1)
            first_step = int(e.get("start_step", 0))
            train_t = float(e["t"])
        elif kind == "load_progress" and rank == 0:
            progress.append(float(e["t"]))
        elif kind == "loaded" and rank == 0:
            load_s = e.get("load_s")
        elif kind == "checkpoint" and rank == 0:
            save_s = e.get("save_s")
        elif kind == VALIDATION and rank == 0:
            validation_s = e.get("forward_s")
            if e.get("forward_sd_s") is not None and (e.get("forwards") or 0) >= 2:
                validation_error_s = float(e["forward_sd_s"]) / float(e["forwards"]) ** 0.5
        elif kind == EVAL and rank == 0:
            timing = {k: v for k, v in e.items() if k not in ("t", "kind", "rank")}
        elif kind == "data" and rank == 0:
            data = {k: e.get(k) for k in ("source", "examples", "tokens", "rows", "fill", "target_fraction")}
    start = first_step or 0
    timed = [s for s in steps if s["step"] > start + WARMUP_STEPS and s.get("step_time_s")]
    times = [float(s["step_time_s"]) for s in timed]
    gaps = [b - a for a, b in itertools.pairwise(progress) if b > a]
    start_s = None
    if begin_t is not None and train_t is not None:
        start_s = max(0.0, train_t - begin_t - float(load_s or 0.0))
    return DepthMeasure(
        layers=layers,
        status=status,
        ranks=ranks,
        load_s=load_s,
        gpu_load_gib=gpu_load,
        gpu_train_gib=gpu_train,
        rss_load_gib=rss_load,
        rss_train_gib=rss_train,
        step_s=statistics.median(s["step_time_s"] for s in timed) if timed else None,
        steps_timed=len(timed),
        step_sd_s=statistics.stdev(times) if len(times) >= 2 else None,
        load_layer_s=statistics.median(gaps) if gaps else None,
        start_s=start_s,
        tokens_per_step=statistics.median(s["tokens"] for s in timed if s.get("tokens")) if timed else None,
        save_s=save_s,
        validation_s=validation_s,
        validation_error_s=validation_error_s,
        data=data,
        message=message,
        eval=timing,
    )


def depth_measures(events: list[dict[str, Any]]) -> list[DepthMeasure]:
    """Every depth the record has begun, in order, measured from the events between its brackets."""
    out: list[DepthMeasure] = []
    current: dict[str, Any] | None = None
    inside: list[dict[str, Any]] = []
    for e in events:
        kind = e.get("kind")
        if kind == BEGIN:
            if current is not None:  # a depth that never ended (the supervisor died)
                out.append(
                    _measure(int(current["layers"]), "failed", "no end recorded", inside, current.get("t"))
                )
            current, inside = e, []
        elif kind == END and current is not None:
            status, message = e.get("status", "failed"), e.get("message", "")
            out.append(_measure(int(current["layers"]), status, message, inside, current.get("t")))
            current, inside = None, []
        elif current is not None and kind not in (BEGIN, END):
            inside.append(e)
    if current is not None:
        out.append(_measure(int(current["layers"]), "running", "", inside, current.get("t")))
    return out
