"""Per-tenant metrics, deltas with bootstrap intervals, imported predictions refused line by line."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import f1_score, precision_score, recall_score

from cockpit.predictions import PredictionsError, import_predictions, own_predictions
from cockpit.record import write_manifest
from cockpit.report import Delta, build_report, macro_f1_batch, render_markdown, run_report

LABELS = {"acme": ["A", "B", "C"], "zeta": ["X", "Y", "Z", "W"]}


def write_own(run_dir: Path, system: str, accuracy: float, seed: int, shared_ids: bool = False) -> None:
    """A predictions file as the cockpit writes it, with per-label scores (`shared_ids`: every tenant
    numbers its examples 0, 1, 2, ...)."""
    rng = random.Random(seed)
    folder = run_dir / "predictions"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{system}.jsonl", "w") as f:
        f.write(json.dumps({"meta": {"system": system}}) + "\n")
        for tenant, labels in LABELS.items():
            for i in range(30):
                gold = labels[i % len(labels)]
                pred = gold if rng.random() < accuracy else rng.choice(labels)
                scores = {label: (0.0 if label == pred else -1.0) for label in labels}
                f.write(
                    json.dumps(
                        {
                            "tenant": tenant,
                            "id": str(i) if shared_ids else f"{tenant}-{i}",
                            "gold": gold,
                            "pred": pred,
                            "scores": scores,
                        }
                    )
                )
                f.write("\n")


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    write_manifest(tmp_path, {"run_id": "r1", "profile": {"cost": {"serving_hour_usd": 1.0}}})
    write_own(tmp_path, "base", 0.3, seed=1)
    write_own(tmp_path, "finetuned", 0.8, seed=2)
    return tmp_path


def test_report_equals_sklearn_recomputed_from_the_files(run_dir: Path) -> None:
    typed = run_report(run_dir, samples=200)
    report = typed.to_dict()
    assert [t["tenant"] for t in report["tenants"]] == ["acme", "zeta"]
    rows = {}
    for line in (run_dir / "predictions" / "finetuned.jsonl").read_text().splitlines()[1:]:
        row = json.loads(line)
        rows.setdefault(row["tenant"], []).append(row)
    for t in report["tenants"]:
        gold = [r["gold"] for r in rows[t["tenant"]]]
        pred = [r["pred"] for r in rows[t["tenant"]]]
        labels = LABELS[t["tenant"]]
        metrics = t["systems"]["finetuned"]
        assert metrics["macro_f1"] == pytest.approx(f1_score(gold, pred, labels=labels, average="macro"))
        assert metrics["micro_f1"] == pytest.approx(f1_score(gold, pred, labels=labels, average="micro"))
        assert metrics["precision"] == pytest.approx(
            precision_score(gold, pred, labels=labels, average="macro", zero_division=0)
        )
        assert metrics["recall"] == pytest.approx(recall_score(gold, pred, labels=labels, average="macro"))
        delta = t["deltas"]["base"]
        assert delta["macro_f1"] == pytest.approx(metrics["macro_f1"] - t["systems"]["base"]["macro_f1"])
        assert delta["ci95"][0] <= delta["macro_f1"] <= delta["ci95"][1]
    mean = report["mean"]
    assert mean["systems"]["finetuned"]["macro_f1"] == pytest.approx(
        np.mean([t["systems"]["finetuned"]["macro_f1"] for t in report["tenants"]])
    )
    assert "acme" in render_markdown(typed) and "Δ vs base" in render_markdown(typed)


def test_vectorised_bootstrap_f1_matches_sklearn() -> None:
    rng = np.random.default_rng(3)
    gold = rng.integers(0, 4, size=(50, 25))
    pred = rng.integers(0, 4, size=(50, 25))
    ours = macro_f1_batch(gold, pred, 4)
    for i in range(50):
        expected = f1_score(gold[i], pred[i], labels=[0, 1, 2, 3], average="macro", zero_division=0)
        assert ours[i] == pytest.approx(expected)


def test_identical_systems_have_zero_delta_and_a_degenerate_interval(run_dir: Path) -> None:
    preds = own_predictions(run_dir)
    twin = preds[1]
    twin_copy = type(twin)("base", dict(twin.rows), {})
    report = build_report([twin_copy, twin], samples=100)
    for t in report.tenants:
        assert t.deltas["base"] == Delta(0.0, 0.0, 0.0)


def write_import(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def good_rows() -> list[dict]:
    return [
        {"tenant": tenant, "id": f"{tenant}-{i}", "pred": labels[0]}
        for tenant, labels in LABELS.items()
        for i in range(30)
    ]


def test_good_import_joins_the_comparison(run_dir: Path, tmp_path: Path) -> None:
    stored = import_predictions(run_dir, "api", write_import(tmp_path / "api.jsonl", good_rows()))
    assert stored.name == "api.jsonl"
    report = run_report(run_dir, samples=50)
    assert report.systems == ("api", "base", "finetuned")
    assert "api" in report.tenants[0].deltas


@pytest.mark.parametrize(
    ("mutate", "words"),
    [
        (lambda rows: rows.__setitem__(4, '{"tenant": "acme", "id": '), ":5: broken line"),
        (lambda rows: rows[2].__setitem__("pred", "Q"), ":3: unknown label 'Q'"),
        (lambda rows: rows[0].pop("tenant"), ":1: missing field 'tenant'"),
        (lambda rows: rows[7].__setitem__("tenant", "nobody"), ":8: unknown tenant 'nobody'"),
        (lambda rows: rows[9].__setitem__("id", "acme-0"), ":10: duplicate id 'acme-0' (first at line 1)"),
        (lambda rows: rows[3].__setitem__("id", "acme-999"), ":4: id 'acme-999' is not a held-out example"),
        (lambda rows: rows[5].__setitem__("gold", "A"), ":6: gold 'A' differs from the record's 'C'"),
        (lambda rows: rows.__delitem__(slice(30, 60)), "missing tenant 'zeta'"),
        (lambda rows: rows.__delitem__(11), "1 held-out example(s) of tenant 'acme' have no prediction"),
    ],
)
def test_bad_import_is_refused_naming_the_line(run_dir: Path, tmp_path: Path, mutate, words: str) -> None:
    rows: list = good_rows()
    mutate(rows)
    path = write_import(tmp_path / "bad.jsonl", rows)
    with pytest.raises(PredictionsError) as info:
        import_predictions(run_dir, "api", path)
    assert words in str(info.value)
    assert not (run_dir / "predictions" / "api.jsonl").exists(), "nothing half-imported"


def test_cli_import_error_is_one_line_exit_2(run_dir: Path, tmp_path: Path) -> None:
    rows: list = good_rows()
    rows[2]["pred"] = "NOPE"
    path = write_import(tmp_path / "bad.jsonl", rows)
    result = subprocess.run(
        [sys.executable, "-m", "cockpit", "import", str(run_dir), "--predictions", f"api={path}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert f"{path}:3: unknown label 'NOPE'" in result.stderr


def test_cli_report_json_has_tenants_and_deltas(run_dir: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cockpit", "report", str(run_dir), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert {t["tenant"] for t in report["tenants"]} == set(LABELS)
    assert all("finetuned" in t["systems"] and "base" in t["deltas"] for t in report["tenants"])
    assert (run_dir / "report.md").is_file() and (run_dir / "report.json").is_file()


def test_ids_repeated_across_tenants_keep_every_tenant(tmp_path: Path) -> None:
    write_manifest(tmp_path, {"run_id": "r2", "profile": {}})
    write_own(tmp_path, "base", 0.3, seed=1, shared_ids=True)
    write_own(tmp_path, "finetuned", 0.8, seed=2, shared_ids=True)
    report = run_report(tmp_path, samples=50)
    assert [t.name for t in report.tenants] == ["acme", "zeta"]
    assert all(t.n == 30 for t in report.tenants)
    api = tmp_path / "api.jsonl"
    lines = [
        json.dumps({"tenant": t, "id": str(i), "pred": labels[0], "note": "a\u2028b"}, ensure_ascii=False)
        for t, labels in LABELS.items()
        for i in range(30)
    ]
    api.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert "\u2028" in api.read_text(encoding="utf-8")  # unescaped, as ensure_ascii=False writes it
    import_predictions(tmp_path, "api", api)
    systems = run_report(tmp_path, samples=50).tenants[1].metrics
    assert set(systems) == {"base", "finetuned", "api"}
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join([*lines[:2], "{oops"]) + "\n", encoding="utf-8")
    with pytest.raises(PredictionsError, match=r"broken.jsonl:3: broken line"):
        import_predictions(tmp_path, "broken", broken)


def test_a_system_missing_for_a_tenant_gets_no_mean(run_dir: Path) -> None:
    rows = (run_dir / "predictions" / "base.jsonl").read_text().splitlines()
    partial = [rows[0].replace('"base"', '"partial"')] + [r for r in rows[1:] if '"acme"' in r]
    (run_dir / "predictions" / "partial.jsonl").write_text("\n".join(partial) + "\n")
    report = run_report(run_dir, samples=50)
    acme, zeta = report.tenants
    assert "partial" in acme.metrics and "partial" not in zeta.metrics
    assert "partial" not in report.mean.metrics and "base" in report.mean.metrics
