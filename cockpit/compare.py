"""Several runs side by side: their curves against step or elapsed time, and a table of what they reached.

Each run is read whole (`cockpit.record.scalars`), so the figures are exact: the last loss as logged
(a diverged run's `nan` or `inf`), the last finite validation loss, the median of the step events'
tokens/s, the highest CUDA peak (the trainer's, over every rank), GPU memory used (NVML telemetry),
process RSS, and, where the run has a report.json, the tuned model's macro F1 per tenant. Runs are
tagged A, B, C... in the order given; each label adds the profile fields in which the runs differ
(`learning_rate 0.0002`), or the source of an imported log.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cockpit.record import load_manifest
from cockpit.record.scalars import RunScalars, load_scalars
from cockpit.units import clock, memory

TAGS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
MAX_RUNS = len(TAGS)
LABEL_FIELDS = 2  # profile differences shown in a label
SKIP_FIELDS = ("name", "description")
SHORT_NAMES = {
    "learning_rate": "lr",
    "micro_batch_size": "batch",
    "grad_accum": "accum",
    "max_steps": "steps",
    "weight_decay": "wd",
    "lr_scheduler": "schedule",
}


@dataclass(frozen=True)
class Curve:
    """One run's values against step and against elapsed seconds (NaN where a value is absent)."""

    step: np.ndarray
    elapsed: np.ndarray | None  # None when the record has no clock but the step count
    value: np.ndarray

    def x(self, axis: str) -> np.ndarray | None:
        return self.step if axis == "step" else self.elapsed

    def __len__(self) -> int:
        return len(self.value)


@dataclass(frozen=True)
class RunSummary:
    """What one run reached; None where the record does not say."""

    tag: str
    run: str
    label: str
    status: str
    source: str  # "cockpit" or the imported format
    steps: int
    final_loss: float | None
    final_val_loss: float | None
    median_tokens_per_s: float | None
    cuda_peak_mib: float | None
    gpu_used_mib: float | None
    rss_peak_mib: float | None
    elapsed_s: float | None
    memory_kind: str  # what the memory curve is: "CUDA peak", "GPU used", "RSS" or ""
    tenant_f1: dict[str, float] = field(default_factory=dict)  # tuned model's macro F1 per tenant, 0..1
    mean_f1: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ComparedRun:
    summary: RunSummary
    loss: Curve
    val_loss: Curve
    tokens_per_s: Curve
    memory: Curve


@dataclass(frozen=True)
class Comparison:
    runs: tuple[ComparedRun, ...]

    @property
    def summaries(self) -> list[RunSummary]:
        return [r.summary for r in self.runs]

    @property
    def tenants(self) -> list[str]:
        seen: list[str] = []
        for s in self.summaries:
            seen += [t for t in s.tenant_f1 if t not in seen]
        return seen

    def to_dict(self) -> dict[str, Any]:
        return {"runs": [s.to_dict() for s in self.summaries], "tenants": self.tenants}


def _last(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)] if len(values) else values
    return float(finite[-1]) if len(finite) else None


def _last_logged(values: np.ndarray) -> float | None:
    """The last value as logged: a diverged run's NaN or infinity stays (every step has a loss)."""
    return float(values[-1]) if len(values) else None


def _max(values: np.ndarray | None) -> float | None:
    if values is None or not len(values) or not np.any(np.isfinite(values)):
        return None
    return float(np.nanmax(values))


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: data}


def differences(profiles: list[dict[str, Any] | None]) -> list[str]:
    """Dotted profile fields whose values differ between the runs that have a profile (fields some of
    them lack, from an older cockpit, are not compared)."""
    flat = [_flatten(p) for p in profiles if p]
    if len(flat) < 2:
        return []
    keys = sorted(set.intersection(*(set(f) for f in flat)))
    return [k for k in keys if k.split(".")[-1] not in SKIP_FIELDS and len({repr(f[k]) for f in flat}) > 1]


def _label(manifest: dict[str, Any], fields: list[str]) -> str:
    imported = manifest.get("imported")
    if imported:
        return f"{Path(str(imported.get('source', '?'))).name} ({imported.get('format')})"
    flat = _flatten(manifest.get("profile") or {})
    parts = [f"{_short(k)} {_fmt_value(flat.get(k))}" for k in fields[:LABEL_FIELDS]]
    if len(fields) > LABEL_FIELDS:
        parts.append(f"+{len(fields) - LABEL_FIELDS} more")
    return ", ".join(parts) or str(manifest.get("profile_name") or "")


def _short(key: str) -> str:
    name = key.split(".")[-1]
    return SHORT_NAMES.get(name, name)


def _fmt_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _memory(scalars: RunScalars, steps: np.ndarray, t: np.ndarray) -> tuple[str, np.ndarray, np.ndarray]:
    """The run's memory curve as (kind, step, value): the trainer's CUDA peak, else NVML, else RSS."""
    mem = scalars.memory
    if "cuda_peak_alloc_mib" in mem and np.any(np.isfinite(mem["cuda_peak_alloc_mib"])):
        return "CUDA peak", steps, mem["cuda_peak_alloc_mib"]
    tel = scalars.telemetry
    gpu = [tel[k] for k in tel if k.startswith("gpu_mem_used_mib[")]
    if gpu and len(steps):
        used = np.nanmax(np.vstack(gpu), axis=0) if len(gpu) > 1 else gpu[0]
        order = np.argsort(t, kind="stable")
        at = np.searchsorted(t[order], tel["t"], side="right") - 1
        step_of = np.where(at >= 0, steps[order][np.clip(at, 0, None)], 0.0)
        return "GPU used", step_of, used
    if "rss_mib" in mem:
        return "RSS", steps, mem["rss_mib"]
    return "", np.zeros(0), np.zeros(0)


def load_run(run_dir: Path, tag: str, label_fields: list[str]) -> ComparedRun:
    """One run's curves and summary (`RecordError` for a damaged record)."""
    manifest = load_manifest(run_dir)
    scalars = load_scalars(run_dir)
    imported = manifest.get("imported") or {}
    timed = imported.get("clock", "wall") != "step"
    first = scalars.first_t or 0.0
    steps, t = scalars.column("step"), scalars.column("t")

    def curve(step: np.ndarray, times: np.ndarray, value: np.ndarray) -> Curve:
        return Curve(step, times - first if timed else None, value)

    vals = scalars.val_loss
    val_curve = curve(
        vals.get("step", np.zeros(0)), vals.get("t", np.zeros(0)), vals.get("loss", np.zeros(0))
    )
    kind, mem_steps, mem_values = _memory(scalars, steps, t)
    mem_times = scalars.telemetry["t"] if kind == "GPU used" else t
    tps = scalars.column("tokens_per_s")
    finite_tps = [float(v) for v in tps if math.isfinite(v) and v > 0]
    tel = scalars.telemetry
    gpu_cols = [tel[k] for k in tel if k.startswith("gpu_mem_used_mib[")]
    rss = [_max(scalars.memory.get("rss_mib")), _max(tel.get("run_rss_mib"))]
    last_t = max((float(c["t"][-1]) for c in (scalars.steps, vals) if len(c.get("t", []))), default=None)
    f1, mean_f1 = _tenant_f1(run_dir)
    summary = RunSummary(
        tag=tag,
        run=str(manifest.get("run_id") or Path(run_dir).name),
        label=_label(manifest, label_fields),
        status=str(manifest.get("status", "?")),
        source=str(imported.get("format") or "cockpit"),
        steps=len(steps),
        final_loss=_last_logged(scalars.column("loss")),
        final_val_loss=_last(vals.get("loss", np.zeros(0))),
        median_tokens_per_s=statistics.median(finite_tps) if finite_tps else None,
        cuda_peak_mib=_max(scalars.memory.get("cuda_peak_alloc_mib")),
        gpu_used_mib=max((v for v in (_max(c) for c in gpu_cols) if v is not None), default=None),
        rss_peak_mib=max((v for v in rss if v is not None), default=None),
        elapsed_s=(last_t - first) if timed and last_t is not None else None,
        memory_kind=kind,
        tenant_f1=f1,
        mean_f1=mean_f1,
    )
    return ComparedRun(
        summary,
        loss=curve(steps, t, scalars.column("loss")),
        val_loss=val_curve,
        tokens_per_s=curve(steps, t, tps),
        memory=Curve(mem_steps, (mem_times - first) if timed and len(mem_times) else None, mem_values),
    )


def _tenant_f1(run_dir: Path) -> tuple[dict[str, float], float | None]:
    """The tuned model's macro F1 per tenant from report.json (nothing when it is missing or unreadable)."""
    from cockpit.report.store import read_report_json

    try:
        report = read_report_json(run_dir)
    except (OSError, ValueError):
        return {}, None
    if report is None:
        return {}, None
    system = report.tuned or (report.systems[-1] if report.systems else None)
    if system is None:
        return {}, None
    f1 = {row.name: v for row in report.tenants if (v := row.metric(system, "macro_f1")) is not None}
    return f1, report.mean.metric(system, "macro_f1")


def compare_runs(run_dirs: list[Path]) -> Comparison:
    """Read every run (in order) and label each by how its profile differs from the others'."""
    manifests = [load_manifest(d) for d in run_dirs]
    fields = differences([m.get("profile") for m in manifests])
    return Comparison(tuple(load_run(d, TAGS[i], fields) for i, d in enumerate(run_dirs)))


# --- text -------------------------------------------------------------------------------------------
def fmt(value: float | None, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)


SUMMARY_HEADER = (
    "run", "label", "steps", "final loss", "final val loss", "median tok/s", "CUDA peak", "GPU used",
    "RSS peak", "elapsed",
)  # fmt: skip


def summary_rows(comparison: Comparison) -> list[list[str]]:
    """The table's rows as text, in SUMMARY_HEADER's order."""
    return [
        [
            f"{s.tag} {s.run}",
            s.label,
            str(s.steps),
            fmt(s.final_loss),
            fmt(s.final_val_loss),
            fmt(s.median_tokens_per_s, ",.0f"),
            memory(s.cuda_peak_mib, digits=2),
            memory(s.gpu_used_mib, digits=2),
            memory(s.rss_peak_mib, digits=2),
            clock(s.elapsed_s, unknown="-"),
        ]
        for s in comparison.summaries
    ]


def f1_rows(comparison: Comparison) -> list[list[str]]:
    """Per tenant, each run's tuned macro F1 in points ("-" where a run has no report), then the mean."""
    runs = comparison.summaries
    rows = [
        [t, *(fmt(s.tenant_f1[t] * 100, ".1f") if t in s.tenant_f1 else "-" for s in runs)]
        for t in comparison.tenants
    ]
    if rows:
        rows.append(["mean", *(fmt(s.mean_f1 * 100 if s.mean_f1 is not None else None, ".1f") for s in runs)])
    return rows


def render_markdown(comparison: Comparison) -> str:
    """The comparison as Markdown tables (for `--format md`)."""

    def table(header: list[str], rows: list[list[str]]) -> list[str]:
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return out + ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]

    lines = ["# Runs compared", ""]
    lines += table(list(SUMMARY_HEADER), summary_rows(comparison))
    lines += [
        "",
        "Final loss: the last logged value (nan or inf: the run diverged); final val loss: the last "
        "finite one. Median tok/s: over the step events. CUDA "
        "peak: the trainer's peak allocation, highest over ranks; GPU used: NVML; RSS peak: the highest "
        "process RSS. `-`: the record does not hold it.",
    ]
    f1 = f1_rows(comparison)
    if f1:
        lines += ["", "## Macro F1 of the tuned model per tenant (points)", ""]
        lines += table(["tenant", *(s.tag for s in comparison.summaries)], f1)
    return "\n".join(lines) + "\n"
