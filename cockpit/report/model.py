"""The evaluation report as one typed shape, and its report.json form (`Report.to_dict`/`from_dict`).

The producer (`cockpit.report.build`) fills every figure a renderer shows, the means over tenants
included; readers only render. `from_dict` also reads report.json version 1, whose mean held macro F1
alone: the other means are filled in by the same rule the producer uses (`mean_metrics`); versions 1 and
2 hold macro F1's deltas only (`Row.delta` is None for the other metrics).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from cockpit.record.format import RunPaths
from cockpit.report.production import Production

TUNED = "finetuned"
REPORT_VERSION = 3  # 2: the mean holds every metric, not only macro F1; 3: so do the deltas (`metric_deltas`)
REPORT_JSON = RunPaths(Path()).report_json.name  # also the `source` of a report read from its file
METRICS = ("macro_f1", "micro_f1", "precision", "recall")  # the order the app cycles through
METRIC_NAMES = {"macro_f1": "macro F1", "micro_f1": "micro F1", "precision": "precision", "recall": "recall"}
COST_KEYS = ("hour_usd", "usd_per_mtok", "api_name", "api_usd_per_mtok", "measured_on")


class ReportFormatError(ValueError):
    """report.json does not hold a report this cockpit can read."""


@dataclass(frozen=True)
class Metrics:
    """One system on one tenant (or averaged over tenants): macro precision and recall, micro and
    macro F1, on a 0..1 scale; `n` examples (None for a mean)."""

    precision: float
    recall: float
    micro_f1: float
    macro_f1: float
    n: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "precision": self.precision,
            "recall": self.recall,
            "micro_f1": self.micro_f1,
            "macro_f1": self.macro_f1,
        }
        if self.n is not None:
            out["n"] = self.n
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Metrics:
        n = data.get("n")
        return cls(*(float(data[k]) for k in ("precision", "recall", "micro_f1", "macro_f1")), n=n)


@dataclass(frozen=True)
class Delta:
    """The tuned model's delta of one metric (macro F1 unless said) against another system (0..1 scale),
    with its 95% interval."""

    value: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        """`better` when the whole interval is above 0, `worse` when below, else `unclear`."""
        return "better" if self.low > 0 else "worse" if self.high < 0 else "unclear"

    def to_dict(self, metric: str = "macro_f1") -> dict[str, Any]:
        return {metric: self.value, "ci95": [self.low, self.high]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], metric: str = "macro_f1") -> Delta:
        value = float(data[metric])
        low, high = data.get("ci95") or (value, value)
        return cls(value, float(low), float(high))


@dataclass(frozen=True)
class Row:
    """One tenant, or the mean over tenants: each system's metrics and the tuned model's deltas."""

    name: str
    n: int | None
    metrics: Mapping[str, Metrics]  # system -> its metrics (absent: the system has no figure here)
    deltas: Mapping[str, Delta]  # other system -> the tuned model's macro-F1 delta against it
    labels: tuple[str, ...] = ()
    # metric (one of METRICS but macro F1) -> other system -> the tuned model's delta of that metric
    metric_deltas: Mapping[str, Mapping[str, Delta]] = field(default_factory=dict)
    population: int | None = None  # the tenant's held-out examples, of which `n` were scored (a sample)

    def metric(self, system: str, name: str) -> float | None:
        """`system`'s metric `name` (one of METRICS) on this row; None when it has none."""
        m = self.metrics.get(system)
        return None if m is None else getattr(m, name)

    def delta(self, other: str, metric: str = "macro_f1") -> Delta | None:
        """The tuned model's delta of `metric` against `other`; None when the report has none (a report
        written before version 3 holds macro F1's only)."""
        if metric == "macro_f1":
            return self.deltas.get(other)
        return self.metric_deltas.get(metric, {}).get(other)

    def metric_deltas_dict(self) -> dict[str, Any]:
        """`{"metric_deltas": {metric: {other: delta}}}` for report.json; nothing when there are none."""
        by_metric = {
            m: {o: d.to_dict(m) for o, d in by.items()} for m, by in self.metric_deltas.items() if by
        }
        return {"metric_deltas": by_metric} if by_metric else {}


@dataclass(frozen=True)
class Serving:
    """Measured generation speed of the model as evaluated, and what a million tokens cost."""

    measured_on: str
    ttft_ms: float | None
    per_token_ms: float | None
    stream_tokens_per_s: float | None
    batch_tokens_per_s: float | None
    batch_size: int | None
    hour_usd: float  # 0 when the profile has no hourly price
    usd_per_mtok: float | None
    api_name: str
    api_usd_per_mtok: float | None
    recorded: Mapping[str, Any] = field(default_factory=dict)  # the serving event's fields, as written

    @property
    def on_cpu(self) -> bool:
        """Measured on a CPU: the tiny CPU model's numbers, not a production model's."""
        return self.measured_on.lower() == "cpu"

    def to_dict(self) -> dict[str, Any]:
        measured = {
            "ttft_ms": self.ttft_ms,
            "per_token_ms": self.per_token_ms,
            "stream_tokens_per_s": self.stream_tokens_per_s,
            "batch_tokens_per_s": self.batch_tokens_per_s,
            "batch_size": self.batch_size,
        }
        out = dict(self.recorded)  # the event's fields first, in their order
        out.update({k: v for k, v in measured.items() if v is not None or k in out})
        out.update(
            hour_usd=self.hour_usd,
            usd_per_mtok=self.usd_per_mtok,
            api_name=self.api_name,
            api_usd_per_mtok=self.api_usd_per_mtok,
            measured_on=self.measured_on,
        )
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Serving:
        return cls(
            measured_on=str(data.get("measured_on") or data.get("device") or "?"),
            ttft_ms=data.get("ttft_ms"),
            per_token_ms=data.get("per_token_ms"),
            stream_tokens_per_s=data.get("stream_tokens_per_s"),
            batch_tokens_per_s=data.get("batch_tokens_per_s"),
            batch_size=data.get("batch_size"),
            hour_usd=float(data.get("hour_usd") or 0.0),
            usd_per_mtok=data.get("usd_per_mtok"),
            api_name=str(data.get("api_name") or "API"),
            api_usd_per_mtok=data.get("api_usd_per_mtok"),
            recorded={k: v for k, v in data.items() if k not in COST_KEYS},
        )


def mean_metrics(tenants: Sequence[Row], system: str) -> Metrics | None:
    """`system`'s metrics averaged over tenants; None unless it has figures on every tenant (a mean over
    fewer tenants would not compare with the others)."""
    rows = [t.metrics[system] for t in tenants if system in t.metrics]
    if not rows or len(rows) != len(tenants):
        return None
    return Metrics(
        precision=float(np.mean([m.precision for m in rows])),
        recall=float(np.mean([m.recall for m in rows])),
        micro_f1=float(np.mean([m.micro_f1 for m in rows])),
        macro_f1=float(np.mean([m.macro_f1 for m in rows])),
    )


@dataclass(frozen=True)
class Report:
    """Per-tenant metrics of every system, the tuned model's deltas, their means, and serving cost."""

    systems: tuple[str, ...]
    tuned: str | None  # the fine-tuned system the deltas are of; None when there is none
    bootstrap_samples: int | None
    tenants: tuple[Row, ...]
    mean: Row
    serving: Serving | None = None
    run_id: str | None = None  # set, with `model`, on the report of a run
    model: str | None = None
    # The tuned adapter's step, its validation loss and the step training ended at, when validation
    # chose it (the run's `adapter` event); None otherwise.
    adapter: Mapping[str, Any] | None = None
    # How the examples were chosen when not all were scored (`cockpit.data.sampling.sample_meta` less its
    # tenants, which are the rows' `population`): `scored`, `population`, `by`, `seed`, `requested`,
    # `time_budget_s`; None: the whole held-out split.
    sample: Mapping[str, Any] | None = None
    production: Production | None = None  # the vLLM command that serves the tuned adapter
    source: str = field(default=REPORT_JSON, compare=False)  # or "built from predictions" (not written)

    @property
    def others(self) -> tuple[str, ...]:
        return tuple(s for s in self.systems if s != self.tuned)

    @property
    def compared(self) -> tuple[str, ...]:
        """The systems the tuned model has delta columns against (none without a tuned model)."""
        return self.others if self.tuned else ()

    @property
    def reference(self) -> str | None:
        """The system the delta chart compares against: the base model when there is one."""
        if self.tuned is None or not self.others:
            return None
        return "base" if "base" in self.others else self.others[0]

    @property
    def examples(self) -> int:
        return sum(t.n or 0 for t in self.tenants)

    @property
    def sampled(self) -> bool:
        """Whether fewer than all held-out examples were scored."""
        return any(t.population is not None and t.population != t.n for t in self.tenants)

    def to_dict(self) -> dict[str, Any]:
        """The report.json form (the current `report_version`)."""
        out: dict[str, Any] = {
            "report_version": REPORT_VERSION,
            "systems": list(self.systems),
            "tuned": self.tuned,
            "bootstrap_samples": self.bootstrap_samples,
            "tenants": [
                {
                    "tenant": t.name,
                    "n": t.n,
                    "labels": list(t.labels),
                    "systems": {s: m.to_dict() for s, m in t.metrics.items()},
                    "deltas": {o: d.to_dict() for o, d in t.deltas.items()},
                    **t.metric_deltas_dict(),
                    **({"population": t.population} if t.population is not None else {}),
                }
                for t in self.tenants
            ],
            "mean": {
                "systems": {s: m.to_dict() for s, m in self.mean.metrics.items()},
                "deltas": {o: d.to_dict() for o, d in self.mean.deltas.items()},
                **self.mean.metric_deltas_dict(),
            },
            "serving": self.serving.to_dict() if self.serving else None,
        }
        if self.run_id is not None:
            out["run_id"] = self.run_id
            out["model"] = self.model
        if self.adapter is not None:
            out["adapter"] = dict(self.adapter)
        if self.sample is not None:
            out["sample"] = dict(self.sample)
        if self.production is not None:
            out["production"] = self.production.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        """A report from its report.json form, version 1 to 3."""
        try:
            return _from_dict(data)
        except ReportFormatError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ReportFormatError(f"not a readable report: {type(exc).__name__}: {exc}") from exc


def _metric_deltas(data: Mapping[str, Any] | None) -> dict[str, dict[str, Delta]]:
    return {m: {o: Delta.from_dict(d, m) for o, d in by.items()} for m, by in (data or {}).items()}


def _from_dict(data: Mapping[str, Any]) -> Report:
    version = int(data.get("report_version", 1))
    if version > REPORT_VERSION:
        raise ReportFormatError(
            f"report_version {version} is newer than this cockpit reads ({REPORT_VERSION}): upgrade cockpit"
        )
    systems = tuple(data.get("systems") or ())
    tenants = tuple(
        Row(
            name=str(t["tenant"]),
            n=t.get("n"),
            metrics={s: Metrics.from_dict(m) for s, m in (t.get("systems") or {}).items()},
            deltas={o: Delta.from_dict(d) for o, d in (t.get("deltas") or {}).items()},
            labels=tuple(t.get("labels") or ()),
            metric_deltas=_metric_deltas(t.get("metric_deltas")),
            population=t.get("population"),
        )
        for t in data.get("tenants") or ()
    )
    raw_mean = data.get("mean") or {}
    stored = raw_mean.get("systems") or {}
    if version >= 2:
        means = {s: Metrics.from_dict(m) for s, m in stored.items()}
    else:  # version 1 wrote macro F1 alone: the rest by the producer's rule, the stored value kept
        means = {}
        for s in systems:
            m = mean_metrics(tenants, s)
            if m is not None:
                kept = (stored.get(s) or {}).get("macro_f1")
                means[s] = m if kept is None else replace(m, macro_f1=float(kept))
    deltas = {o: Delta.from_dict(d) for o, d in (raw_mean.get("deltas") or {}).items()}
    serving, production = data.get("serving"), data.get("production")
    return Report(
        systems=systems,
        tuned=data.get("tuned"),
        bootstrap_samples=data.get("bootstrap_samples"),
        tenants=tenants,
        mean=Row("mean", None, means, deltas, metric_deltas=_metric_deltas(raw_mean.get("metric_deltas"))),
        serving=Serving.from_dict(serving) if serving else None,
        run_id=data.get("run_id"),
        model=data.get("model"),
        adapter=data.get("adapter"),
        sample=data.get("sample"),
        production=Production.from_dict(production) if production else None,
    )
