"""Per-tenant metrics of every system, the fine-tuned model's deltas with bootstrap intervals, and
the serving cost beside the API it would replace.

scikit-learn computes the metrics; the bootstrap recomputes macro F1 from confusion counts with
NumPy (the same definition, vectorised over resamples; a test holds the two equal).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import f1_score, precision_recall_fscore_support

from cockpit.predictions import Predictions, own_predictions, reference_from
from cockpit.record import RunPaths, load_manifest, read_events
from cockpit.record.atomic import write_json_atomic, write_text_atomic

TUNED = "finetuned"
REPORT_VERSION = 1


def tenant_metrics(gold: list[str], pred: list[str], labels: list[str]) -> dict[str, float]:
    """Macro precision, recall and F1, and micro F1, over the tenant's label set."""
    precision, recall, macro_f1, _ = precision_recall_fscore_support(
        gold, pred, labels=labels, average="macro", zero_division=0
    )
    micro_f1 = f1_score(gold, pred, labels=labels, average="micro", zero_division=0)
    return {
        "precision": float(precision),
        "recall": float(recall),
        "micro_f1": float(micro_f1),
        "macro_f1": float(macro_f1),
        "n": len(gold),
    }


def macro_f1_batch(gold: np.ndarray, pred: np.ndarray, n_labels: int) -> np.ndarray:
    """Macro F1 per row of (resamples x examples) label-index arrays; labels absent from both score 0."""
    f1s = np.zeros(gold.shape[0])
    for k in range(n_labels):
        g, p = gold == k, pred == k
        tp = np.sum(g & p, axis=1)
        denom = np.sum(g, axis=1) + np.sum(p, axis=1)
        f1s += np.where(denom > 0, 2 * tp / np.maximum(denom, 1), 0.0)
    return f1s / n_labels


def bootstrap_resamples(n: int, samples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(samples, n))


@dataclass(frozen=True)
class DeltaCI:
    delta: float
    low: float
    high: float


def paired_delta(
    gold: list[str], tuned: list[str], other: list[str], labels: list[str], samples: int, seed: int
) -> tuple[DeltaCI, np.ndarray]:
    """Macro-F1 delta (tuned - other) with a paired-bootstrap 95% interval, and the resampled deltas."""
    index = {label: i for i, label in enumerate(labels)}
    g = np.array([index[x] for x in gold])
    a = np.array([index[x] for x in tuned])
    b = np.array([index[x] for x in other])
    rows = bootstrap_resamples(len(g), samples, seed)
    deltas = macro_f1_batch(g[rows], a[rows], len(labels)) - macro_f1_batch(g[rows], b[rows], len(labels))
    point = (
        macro_f1_batch(g[None], a[None], len(labels))[0] - macro_f1_batch(g[None], b[None], len(labels))[0]
    )
    low, high = np.percentile(deltas, [2.5, 97.5])
    return DeltaCI(float(point), float(low), float(high)), deltas


def build_report(
    predictions: list[Predictions],
    samples: int = 1000,
    seed: int = 0,
    serving: dict[str, Any] | None = None,
    cost: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The report as plain data: `tenants`, `mean`, `systems`, `serving`."""
    reference = reference_from(predictions)
    systems = [p.system for p in predictions]
    others = [s for s in systems if s != TUNED]
    tenants = []
    mean_draws: dict[str, list[np.ndarray]] = {o: [] for o in others}
    for t_index, tenant in enumerate(sorted(reference.labels)):
        labels = reference.labels[tenant]
        ids = reference.ids_of(tenant)
        gold = [reference.gold[i] for i in ids]
        entry: dict[str, Any] = {
            "tenant": tenant,
            "n": len(ids),
            "labels": labels,
            "systems": {},
            "deltas": {},
        }
        preds = {}
        for system in predictions:
            if not all(i in system.rows for i in ids):
                continue
            preds[system.system] = [system.rows[i]["pred"] for i in ids]
            entry["systems"][system.system] = tenant_metrics(gold, preds[system.system], labels)
        if TUNED in preds:
            for other in others:
                if other not in preds:
                    continue
                ci, draws = paired_delta(gold, preds[TUNED], preds[other], labels, samples, seed + t_index)
                entry["deltas"][other] = {"macro_f1": ci.delta, "ci95": [ci.low, ci.high]}
                mean_draws[other].append(draws)
        tenants.append(entry)
    mean: dict[str, Any] = {"systems": {}, "deltas": {}}
    for system in systems:
        values = [t["systems"][system]["macro_f1"] for t in tenants if system in t["systems"]]
        if values and len(values) == len(tenants):  # a mean over fewer tenants would not compare
            mean["systems"][system] = {"macro_f1": float(np.mean(values))}
    for other, draws in mean_draws.items():
        if draws and len(draws) == len(tenants):
            deltas = [t["deltas"][other]["macro_f1"] for t in tenants]
            averaged = np.mean(np.stack(draws), axis=0)
            low, high = np.percentile(averaged, [2.5, 97.5])
            mean["deltas"][other] = {"macro_f1": float(np.mean(deltas)), "ci95": [float(low), float(high)]}
    return {
        "report_version": REPORT_VERSION,
        "systems": systems,
        "tuned": TUNED if TUNED in systems else None,
        "bootstrap_samples": samples,
        "tenants": tenants,
        "mean": mean,
        "serving": serving_cost(serving, cost) if serving else None,
    }


def serving_cost(serving: dict[str, Any], cost: dict[str, Any] | None) -> dict[str, Any]:
    """Cost per million generated tokens from measured throughput and an hourly price."""
    cost = cost or {}
    hour_usd = float(cost.get("serving_hour_usd") or 0.0)
    tps = serving.get("batch_tokens_per_s") or 0.0
    per_mtok = hour_usd / (tps * 3600) * 1e6 if tps and hour_usd else None
    return {
        **serving,
        "hour_usd": hour_usd,
        "usd_per_mtok": per_mtok,
        "api_name": cost.get("api_name") or "API",
        "api_usd_per_mtok": cost.get("api_usd_per_mtok"),
        "measured_on": serving.get("device", "?"),
    }


def run_report(run_dir: Path, samples: int | None = None) -> dict[str, Any]:
    """The report of a run from its record: predictions files, the serving event, the profile's prices."""
    run_dir = Path(run_dir)
    manifest = load_manifest(run_dir)
    profile = manifest.get("profile", {})
    serving = [e for e in read_events(run_dir, "serving")]
    report = build_report(
        own_predictions(run_dir),
        samples=samples or int(profile.get("eval", {}).get("bootstrap_samples", 1000)),
        serving=serving[-1] if serving else None,
        cost=profile.get("cost"),
    )
    report["run_id"] = manifest.get("run_id", run_dir.name)
    report["model"] = profile.get("model", {}).get("name") or profile.get("model", {}).get("path")
    return report


def write_report(run_dir: Path, report: dict[str, Any]) -> tuple[Path, Path]:
    """`report.json` and `report.md` beside the run's predictions."""
    paths = RunPaths(Path(run_dir))
    json_path = write_json_atomic(paths.report_json, report)
    return json_path, write_text_atomic(paths.report_md, to_markdown(report))


def summary_line(report: dict[str, Any]) -> str:
    """One line: mean macro F1 of every system, and the tuned model's mean delta against the base."""
    mean = report["mean"]
    parts = [f"{s} {_pct(m['macro_f1'])}" for s, m in mean["systems"].items()]
    line = "mean macro F1 " + ", ".join(parts)
    delta = mean["deltas"].get("base")
    if delta:
        line += f" (finetuned vs base {_signed(delta['macro_f1'])} points)"
    return line


# --- rendering ---------------------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _signed(x: float) -> str:
    return f"{100 * x:+.1f}"


def _delta_cell(d: dict[str, Any] | None, bold: bool = False) -> str:
    """`+5.2 [+1.0, +9.3]` for a delta and its 95% interval; `-` when there is none."""
    if not d:
        return "-"
    value = _signed(d["macro_f1"])
    return f"{'**' + value + '**' if bold else value} [{_signed(d['ci95'][0])}, {_signed(d['ci95'][1])}]"


def to_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: one table per metric view, the mean, and serving cost."""
    systems = report["systems"]
    others = [s for s in systems if s != TUNED]
    lines = [f"# Evaluation report: {report.get('run_id', '')}", ""]
    if report.get("model"):
        lines += [f"Model: {report['model']}. Held-out split, macro F1 in points (0-100).", ""]
    header = ["tenant", "n", *[f"{s} macro F1" for s in systems]]
    if report["tuned"]:
        header += [f"Δ vs {o} [95% CI]" for o in others]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for t in report["tenants"]:
        row = [t["tenant"], str(t["n"])]
        row += [_pct(t["systems"].get(s, {}).get("macro_f1")) for s in systems]
        if report["tuned"]:
            row += [_delta_cell(t["deltas"].get(o)) for o in others]
        lines.append("| " + " | ".join(row) + " |")
    mean = report["mean"]
    row = ["**mean**", ""] + [_pct(mean["systems"].get(s, {}).get("macro_f1")) for s in systems]
    if report["tuned"]:
        row += [_delta_cell(mean["deltas"].get(o), bold=True) for o in others]
    lines += ["| " + " | ".join(row) + " |", ""]
    lines += ["## Precision, recall, micro F1 per system", ""]
    lines += ["| tenant | system | precision | recall | micro F1 | macro F1 |", "|---|---|---|---|---|---|"]
    for t in report["tenants"]:
        for s, m in t["systems"].items():
            lines.append(
                f"| {t['tenant']} | {s} | {_pct(m['precision'])} | {_pct(m['recall'])} | "
                f"{_pct(m['micro_f1'])} | {_pct(m['macro_f1'])} |"
            )
    serving = report.get("serving")
    if serving:
        lines += ["", "## Serving cost", ""]
        lines += serving_lines(serving)
    return "\n".join(lines) + "\n"


def serving_lines(serving: dict[str, Any]) -> list[str]:
    """Plain sentences for the serving section (Markdown and terminal alike)."""
    ours = serving.get("usd_per_mtok")
    api = serving.get("api_usd_per_mtok")
    lines = [
        f"Measured on {serving['measured_on']} (the model as evaluated: 4-bit base + LoRA adapter): "
        f"time to first token {serving['ttft_ms']:.1f} ms, {serving['per_token_ms']:.2f} ms per token "
        f"({serving['stream_tokens_per_s']} tok/s single stream), {serving['batch_tokens_per_s']} tok/s "
        f"at batch {serving['batch_size']}.",
    ]
    if serving["measured_on"] == "cpu":
        lines.append("These are real measurements of the tiny CPU model, not of a production model.")
    price = f"${serving['hour_usd']:.2f} per machine-hour"
    ours_text = (
        f"${ours:,.2f} per million tokens at {price}"
        if ours is not None
        else "no hourly price in the profile"
    )
    api_text = (
        f"${api:,.2f} per million tokens ({serving['api_name']})" if api else "no API price in the profile"
    )
    lines.append(f"Self-hosted: {ours_text}; API: {api_text}.")
    return lines
