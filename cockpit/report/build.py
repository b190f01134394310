"""The producer: per-tenant metrics of every system, the fine-tuned model's deltas with bootstrap
intervals, the means over tenants, and the serving cost beside the API it would replace.

scikit-learn computes the metrics (imported where it is used: readers of a report never pay for it);
the bootstrap recomputes every metric from confusion counts with NumPy (the same definitions, vectorised
over resamples; a test holds the two equal).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from cockpit.predictions import Predictions, own_predictions, reference_from
from cockpit.record import RunPaths, load_manifest, read_events
from cockpit.report.model import METRICS, TUNED, Delta, Metrics, Report, Row, Serving, mean_metrics
from cockpit.report.production import Production, production_path


def tenant_metrics(gold: list[str], pred: list[str], labels: list[str]) -> Metrics:
    """Macro precision, recall and F1, and micro F1, over the tenant's label set."""
    from sklearn.metrics import f1_score, precision_recall_fscore_support

    precision, recall, macro_f1, _ = precision_recall_fscore_support(
        gold, pred, labels=labels, average="macro", zero_division=0
    )
    micro_f1 = f1_score(gold, pred, labels=labels, average="micro", zero_division=0)
    return Metrics(float(precision), float(recall), float(micro_f1), float(macro_f1), n=len(gold))


def metrics_batch(gold: np.ndarray, pred: np.ndarray, n_labels: int) -> dict[str, np.ndarray]:
    """Every metric of METRICS per row of (resamples x examples) label-index arrays, as `tenant_metrics`
    defines them: macro precision, recall and F1 over the label set (a label with no prediction, or no
    gold example, scores 0 there), and micro F1."""
    rows = gold.shape[0]
    precision, recall, f1 = np.zeros(rows), np.zeros(rows), np.zeros(rows)
    tp_all, gold_all, pred_all = np.zeros(rows), np.zeros(rows), np.zeros(rows)
    for k in range(n_labels):
        g, p = gold == k, pred == k
        tp = np.sum(g & p, axis=1)
        n_gold, n_pred = np.sum(g, axis=1), np.sum(p, axis=1)
        precision += np.where(n_pred > 0, tp / np.maximum(n_pred, 1), 0.0)
        recall += np.where(n_gold > 0, tp / np.maximum(n_gold, 1), 0.0)
        denom = n_gold + n_pred
        f1 += np.where(denom > 0, 2 * tp / np.maximum(denom, 1), 0.0)
        tp_all += tp
        gold_all += n_gold
        pred_all += n_pred
    micro_denom = gold_all + pred_all
    return {
        "macro_f1": f1 / n_labels,
        "micro_f1": np.where(micro_denom > 0, 2 * tp_all / np.maximum(micro_denom, 1), 0.0),
        "precision": precision / n_labels,
        "recall": recall / n_labels,
    }


def macro_f1_batch(gold: np.ndarray, pred: np.ndarray, n_labels: int) -> np.ndarray:
    """Macro F1 per row of (resamples x examples) label-index arrays; labels absent from both score 0."""
    return metrics_batch(gold, pred, n_labels)["macro_f1"]


def bootstrap_resamples(n: int, samples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(samples, n))


def paired_deltas(
    gold: list[str], tuned: list[str], other: list[str], labels: list[str], samples: int, seed: int
) -> dict[str, tuple[Delta, np.ndarray]]:
    """Per metric: its delta (tuned - other) with a paired-bootstrap 95% interval, and the resampled
    deltas. Every metric is drawn from the same resamples."""
    index = {label: i for i, label in enumerate(labels)}
    g = np.array([index[x] for x in gold])
    a = np.array([index[x] for x in tuned])
    b = np.array([index[x] for x in other])
    rows = bootstrap_resamples(len(g), samples, seed)
    drawn_a, drawn_b = (
        metrics_batch(g[rows], a[rows], len(labels)),
        metrics_batch(g[rows], b[rows], len(labels)),
    )
    point_a, point_b = (
        metrics_batch(g[None], a[None], len(labels)),
        metrics_batch(g[None], b[None], len(labels)),
    )
    out = {}
    for metric in METRICS:
        deltas = drawn_a[metric] - drawn_b[metric]
        low, high = np.percentile(deltas, [2.5, 97.5])
        out[metric] = Delta(float(point_a[metric][0] - point_b[metric][0]), float(low), float(high)), deltas
    return out


def paired_delta(
    gold: list[str], tuned: list[str], other: list[str], labels: list[str], samples: int, seed: int
) -> tuple[Delta, np.ndarray]:
    """Macro-F1 delta (tuned - other) with a paired-bootstrap 95% interval, and the resampled deltas."""
    return paired_deltas(gold, tuned, other, labels, samples, seed)["macro_f1"]


def build_report(
    predictions: list[Predictions],
    samples: int = 1000,
    seed: int = 0,
    serving: dict[str, Any] | None = None,
    cost: dict[str, Any] | None = None,
    sample: Mapping[str, Any] | None = None,
) -> Report:
    """The report of these systems' predictions: every tenant, the means, serving cost. `sample`: how the
    examples were chosen (a predictions file's `sample` meta), for each tenant's n of N; the intervals are
    the bootstrap's over the examples scored, so a smaller sample gives wider ones."""
    held = (sample or {}).get("tenants") or {}
    reference = reference_from(predictions)
    systems = tuple(p.system for p in predictions)
    others = [s for s in systems if s != TUNED]
    tenants: list[Row] = []
    # metric -> other system -> each tenant's resampled deltas
    mean_draws: dict[str, dict[str, list[np.ndarray]]] = {m: {o: [] for o in others} for m in METRICS}
    for t_index, tenant in enumerate(sorted(reference.labels)):
        labels = reference.labels[tenant]
        ids = reference.ids_of(tenant)
        gold = [reference.gold[i] for i in ids]
        metrics: dict[str, Metrics] = {}
        deltas: dict[str, dict[str, Delta]] = {m: {} for m in METRICS}
        preds = {}
        for system in predictions:
            if not all(i in system.rows for i in ids):
                continue
            preds[system.system] = [system.rows[i]["pred"] for i in ids]
            metrics[system.system] = tenant_metrics(gold, preds[system.system], labels)
        if TUNED in preds:
            for other in others:
                if other not in preds:
                    continue
                drawn = paired_deltas(gold, preds[TUNED], preds[other], labels, samples, seed + t_index)
                for metric, (delta, draws) in drawn.items():
                    deltas[metric][other] = delta
                    mean_draws[metric][other].append(draws)
        row = _row(tenant, len(ids), metrics, deltas, labels)
        tenants.append(replace(row, population=held[tenant][1]) if tenant in held else row)
    means = {s: m for s in systems if (m := mean_metrics(tenants, s)) is not None}
    mean_deltas: dict[str, dict[str, Delta]] = {m: {} for m in METRICS}
    for metric, by_other in mean_draws.items():
        for other, draws in by_other.items():
            if draws and len(draws) == len(tenants):  # a mean over fewer tenants would not compare
                averaged = np.mean(np.stack(draws), axis=0)
                low, high = np.percentile(averaged, [2.5, 97.5])
                value = float(np.mean([t.delta(other, metric).value for t in tenants]))  # type: ignore[union-attr]
                mean_deltas[metric][other] = Delta(value, float(low), float(high))
    return Report(
        systems=systems,
        tuned=TUNED if TUNED in systems else None,
        bootstrap_samples=samples,
        tenants=tuple(tenants),
        mean=_row("mean", None, means, mean_deltas),
        serving=serving_cost(serving, cost) if serving else None,
        sample=_sample_summary(sample),
    )


def _sample_summary(sample: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The report's `sample`: how many of how many and why, without the tenants (the rows hold them);
    None for the whole held-out split."""
    if not sample or (not sample.get("by") and sample.get("scored") == sample.get("population")):
        return None
    return {k: v for k, v in sample.items() if k != "tenants"}


def sample_of(predictions: list[Predictions]) -> dict[str, Any] | None:
    """How the cockpit's own predictions chose their examples (the tuned model's file first; every system
    of one evaluation scores the same ones); None when no file says."""
    ordered = sorted(predictions, key=lambda p: p.system != TUNED)
    return next((p.meta["sample"] for p in ordered if isinstance(p.meta.get("sample"), dict)), None)


def production_of(
    run_dir: Path, profile: Mapping[str, Any], predictions: list[Predictions], name: str
) -> Production | None:
    """The vLLM command for the tuned adapter the evaluation scored (its predictions' meta names the base
    and the adapter), on the run's profile; None without a tuned model or a profile."""
    tuned = next((p for p in predictions if p.system == TUNED), None)
    if tuned is None or not profile:
        return None
    base = tuned.meta.get("model") or (profile.get("model") or {}).get("path") or "?"
    adapter = tuned.meta.get("adapter") or str(RunPaths(run_dir).adapter)
    return production_path(profile, str(base), str(adapter), name)


def _row(
    name: str,
    n: int | None,
    metrics: dict[str, Metrics],
    deltas: dict[str, dict[str, Delta]],
    labels: list[str] | None = None,
) -> Row:
    """A row from its deltas by metric: macro F1's in `deltas`, the others' in `metric_deltas`."""
    others = {m: by for m, by in deltas.items() if m != "macro_f1" and by}
    return Row(name, n, metrics, deltas["macro_f1"], labels=tuple(labels or ()), metric_deltas=others)


def serving_cost(serving: dict[str, Any], cost: dict[str, Any] | None) -> Serving:
    """Cost per million generated tokens from measured throughput (the `serving` event) and an hourly
    price (the profile's `cost`)."""
    cost = cost or {}
    hour_usd = float(cost.get("serving_hour_usd") or 0.0)
    tps = serving.get("batch_tokens_per_s") or 0.0
    per_mtok = hour_usd / (tps * 3600) * 1e6 if tps and hour_usd else None
    return Serving.from_dict(
        {
            **serving,
            "hour_usd": hour_usd,
            "usd_per_mtok": per_mtok,
            "api_name": cost.get("api_name") or "API",
            "api_usd_per_mtok": cost.get("api_usd_per_mtok"),
            "measured_on": serving.get("device", "?"),
        }
    )


def run_report(run_dir: Path, samples: int | None = None) -> Report:
    """The report of a run from its record: predictions files, the serving event, the profile's prices."""
    run_dir = Path(run_dir)
    manifest = load_manifest(run_dir)
    profile = manifest.get("profile") or {}  # an imported log has none
    serving = list(read_events(run_dir, "serving"))
    predictions = own_predictions(run_dir)
    report = build_report(
        predictions,
        samples=samples or int(profile.get("eval", {}).get("bootstrap_samples", 1000)),
        serving=serving[-1] if serving else None,
        cost=profile.get("cost"),
        sample=sample_of(predictions),
    )
    model = profile.get("model", {})
    run_id = manifest.get("run_id", run_dir.name)
    return replace(
        report,
        run_id=run_id,
        model=model.get("name") or model.get("path"),
        adapter=chosen_adapter(run_dir),
        production=production_of(run_dir, profile, predictions, run_id),
    )


def chosen_adapter(run_dir: Path) -> dict[str, Any] | None:
    """The adapter validation chose (rank 0's last `adapter` event with a validation loss): its `step`,
    `val_loss` and the `last_step` training ended at; None when validation did not choose."""
    saved = [e for e in read_events(run_dir, "adapter") if e.get("rank", 0) == 0]
    if not saved or saved[-1].get("val_loss") is None:
        return None
    e = saved[-1]
    return {"step": e.get("step"), "val_loss": e.get("val_loss"), "last_step": e.get("last_step")}
