"""The typed report: report.json round trips, version 1 files still read, the means are the tenant rows'
means, and every renderer shows the same numbers."""

from __future__ import annotations

import copy
import io
import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from test_report import write_own
from tui_helpers import REPORT

from cockpit.record import write_manifest
from cockpit.report import (
    METRICS,
    REPORT_VERSION,
    Delta,
    Report,
    ReportFormatError,
    Row,
    delta_cell,
    load_report,
    macro_f1_table,
    mean_metrics,
    points,
    read_report_json,
    render_markdown,
    run_report,
    signed,
    summary_line,
    usd,
    write_report,
)

RECORDS = Path(__file__).resolve().parent / "fixtures" / "records"
SERVING = {
    "t": 1.0,
    "kind": "serving",
    "system": "finetuned",
    "ttft_ms": 12.5,
    "per_token_ms": 3.25,
    "stream_tokens_per_s": 300,
    "batch_size": 4,
    "batch_tokens_per_s": 1000.0,
    "device": "cpu",
    "gpus": 0,
}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    """Three systems (one, `partial`, scored on one tenant only), a serving measurement, prices."""
    run = tmp_path_factory.mktemp("run")
    cost = {"serving_hour_usd": 2.0, "api_usd_per_mtok": 3.0, "api_name": "an API"}
    write_manifest(run, {"run_id": "r1", "profile": {"cost": cost, "model": {"name": "m"}}})
    write_own(run, "base", 0.3, seed=1)
    write_own(run, "finetuned", 0.8, seed=2)
    rows = (run / "predictions" / "base.jsonl").read_text().splitlines()
    partial = [rows[0].replace('"base"', '"partial"')] + [r for r in rows[1:] if '"acme"' in r]
    (run / "predictions" / "partial.jsonl").write_text("\n".join(partial) + "\n")
    (run / "events").mkdir(exist_ok=True)
    (run / "events" / "eval.jsonl").write_text(json.dumps(SERVING) + "\n")
    adapters = [  # rank 1's says the same as rank 0's in a real run; here it differs, and is not read
        {"t": 0.5, "kind": "adapter", "rank": 1, "path": "a", "step": 120},
        {
            "t": 0.5,
            "kind": "adapter",
            "rank": 0,
            "path": "a",
            "step": 80,
            "val_loss": 0.8123,
            "last_step": 120,
        },
    ]
    (run / "events" / "trainer-rank0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in adapters))
    return run_report(run, samples=200)


# --- report.json -----------------------------------------------------------------------------------
def test_to_dict_from_dict_round_trip(report: Report) -> None:
    data = json.loads(json.dumps(report.to_dict()))
    again = Report.from_dict(data)
    assert again == report
    assert again.to_dict() == data
    assert data["report_version"] == REPORT_VERSION
    assert set(data["mean"]["systems"]["base"]) == set(METRICS)  # every mean is written
    assert data["serving"]["gpus"] == 0 and data["serving"]["usd_per_mtok"] == report.serving.usd_per_mtok


def test_the_report_says_which_adapter_validation_chose(report: Report, tmp_path: Path) -> None:
    assert report.adapter == {"step": 80, "val_loss": 0.8123, "last_step": 120}
    assert (
        "The tuned model's adapter is step 80's, the lowest validation loss of the run (0.8123) "
        "(training ran to step 120)." in render_markdown(report).splitlines()
    )
    write_manifest(tmp_path, {"run_id": "r2", "profile": {}})  # no validation: no word of it
    write_own(tmp_path, "finetuned", 0.8, seed=2)
    (tmp_path / "events").mkdir(exist_ok=True)
    (tmp_path / "events" / "trainer-rank0.jsonl").write_text(
        json.dumps({"t": 0.5, "kind": "adapter", "rank": 0, "path": "a", "step": 120}) + "\n"
    )
    plain = run_report(tmp_path, samples=50)
    assert plain.adapter is None and "adapter" not in plain.to_dict()
    assert "validation loss" not in render_markdown(plain)


def test_write_then_read_back(report: Report, tmp_path: Path) -> None:
    json_path, md_path = write_report(tmp_path, report)
    assert read_report_json(tmp_path) == report
    assert md_path.read_text() == render_markdown(report)
    assert json.loads(json_path.read_text()) == report.to_dict()


def test_a_version_1_report_reads_and_keeps_every_stored_value() -> None:
    raw = json.loads(REPORT.read_text())
    assert raw["report_version"] == 1
    r = Report.from_dict(raw)
    upgraded = r.to_dict()
    # the same file, with the means the producer now writes filled in beside the stored macro F1
    assert upgraded["report_version"] == REPORT_VERSION
    stripped = copy.deepcopy(upgraded)
    stripped["report_version"] = 1
    for s, m in stripped["mean"]["systems"].items():
        stripped["mean"]["systems"][s] = {"macro_f1": m["macro_f1"]}
    assert stripped == raw
    assert json.dumps(stripped, indent=2) == json.dumps(raw, indent=2)  # key order too
    for metric in ("precision", "recall", "micro_f1"):
        rows = [t["systems"]["finetuned"][metric] for t in raw["tenants"]]
        assert getattr(r.mean.metrics["finetuned"], metric) == pytest.approx(np.mean(rows))
    assert Report.from_dict(upgraded) == r


def test_an_older_sparser_shape_still_reads() -> None:
    """No version, no labels, no interval, a serving entry without `measured_on`, and a mean written
    for a system that misses a tenant (not a mean the producer makes: left out). A stored mean macro F1
    is kept as written."""
    m = {"precision": 0.5, "recall": 0.5, "micro_f1": 0.5, "macro_f1": 0.4, "n": 10}
    raw = {
        "systems": ["base", "finetuned", "partial"],
        "tuned": "finetuned",
        "tenants": [
            {"tenant": "a", "n": 10, "systems": {"base": m, "finetuned": m, "partial": m}, "deltas": {}},
            {
                "tenant": "b",
                "n": 10,
                "systems": {"base": m, "finetuned": m},
                "deltas": {"base": {"macro_f1": 0}},
            },
        ],
        "mean": {"systems": {"base": {"macro_f1": 0.45}, "partial": {"macro_f1": 0.4}}, "deltas": {}},
        "serving": {"device": "cpu", "ttft_ms": 1.0},
    }
    r = Report.from_dict(raw)
    assert r.tenants[1].deltas["base"] == Delta(0.0, 0.0, 0.0)
    assert set(r.mean.metrics) == {"base", "finetuned"}
    assert r.mean.metrics["base"].macro_f1 == 0.45  # as written (the rest computed)
    assert r.mean.metrics["base"].recall == 0.5 and r.mean.metrics["finetuned"].macro_f1 == 0.4
    assert r.serving is not None and r.serving.measured_on == "cpu" and r.serving.hour_usd == 0.0
    assert r.bootstrap_samples is None and r.tenants[0].labels == ()
    assert summary_line(r) == "mean macro F1 base 45.0, finetuned 40.0"


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"report_version": REPORT_VERSION + 1, "tenants": []}, "newer than this cockpit reads"),
        ({"tenants": [{"n": 3}]}, "KeyError"),
        ({"tenants": [{"tenant": "a", "systems": {"base": {"precision": 0.1}}}]}, "recall"),
    ],
)
def test_what_is_not_a_report_is_refused(raw: dict, words: str) -> None:
    with pytest.raises(ReportFormatError, match=words):
        Report.from_dict(raw)


@pytest.mark.parametrize("record", sorted(p.name for p in RECORDS.iterdir() if p.is_dir()))
def test_the_recorded_runs_still_load(record: str, tmp_path: Path) -> None:
    """The recorded runs have no predictions: no report, and nothing written; with the fixture
    report.json beside them, that report. A record kept with its own report.json loads that one."""
    run = tmp_path / record
    shutil.copytree(RECORDS / record, run)
    own = run / "report.json"
    if own.exists():  # the compare fixtures keep the report their evaluation wrote
        assert load_report(run) == Report.from_dict(json.loads(own.read_text()))
        own.unlink()
    assert load_report(run) is None and not own.exists()
    shutil.copy(REPORT, run / "report.json")
    assert load_report(run) == Report.from_dict(json.loads(REPORT.read_text()))


# --- the means --------------------------------------------------------------------------------------
def test_the_means_are_the_means_of_the_tenant_rows(report: Report) -> None:
    assert set(report.mean.metrics) == {"base", "finetuned"}  # `partial` misses a tenant: no mean
    for system, mean in report.mean.metrics.items():
        for metric in METRICS:
            rows = [t.metric(system, metric) for t in report.tenants]
            assert getattr(mean, metric) == pytest.approx(sum(rows) / len(rows), abs=1e-12)
    for other, d in report.mean.deltas.items():
        rows = [t.deltas[other].value for t in report.tenants]
        assert d.value == pytest.approx(sum(rows) / len(rows), abs=1e-12)
        assert d.low <= d.value <= d.high
    assert "partial" not in report.mean.deltas


def test_mean_metrics_needs_every_tenant(report: Report) -> None:
    assert mean_metrics(report.tenants, "partial") is None
    assert mean_metrics((), "base") is None
    only = report.tenants[0].metrics["base"]
    assert mean_metrics((Row("x", 1, {"base": only}, {}),), "base") == replace(only, n=None)


# --- rendering --------------------------------------------------------------------------------------
def test_format_helpers() -> None:
    assert points(None) == "-" and points(0.12345) == "12.3" and points(1.0) == "100.0"
    assert signed(0.052) == "+5.2" and signed(-0.05) == "-5.0"
    d = Delta(0.052, 0.01, 0.093)
    assert delta_cell(d) == "+5.2 [+1.0, +9.3]" and delta_cell(d, bold=True) == "**+5.2** [+1.0, +9.3]"
    assert delta_cell(None) == "-"
    assert usd(1234.5) == "$1,234.50" and usd(0.0031) == "$0.0031"


def markdown_rows(md: str) -> dict[str, list[str]]:
    """The first table of the Markdown report: row name -> cells after `n` (bold marks removed)."""
    lines = md.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("| tenant |"))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip().replace("**", "") for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[2:]
    return rows


def terminal_rows(report: Report) -> dict[str, list[str]]:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(macro_f1_table(report))
    rows = {}
    for line in console.file.getvalue().splitlines():
        if line.startswith("│"):
            cells = [c.strip() for c in line.strip("│").split("│")]
            rows[cells[0]] = cells[1:]
    return rows


def test_markdown_and_terminal_show_the_same_numbers(report: Report) -> None:
    md, term = markdown_rows(render_markdown(report)), terminal_rows(report)
    assert list(md) == list(term) == ["acme", "zeta", "mean"]
    assert md == term
    # and they are the report's numbers
    for row in (*report.tenants, report.mean):
        expected = [points(row.metric(s, "macro_f1")) for s in report.systems]
        expected += [delta_cell(row.deltas.get(o)) for o in report.compared]
        assert md[row.name] == expected


def test_reading_a_report_does_not_import_sklearn() -> None:
    """The app reads reports at startup: scikit-learn (a second and a half to import) is the producer's."""
    code = (
        "import json, sys\n"
        "from cockpit.report import Report, load_report, macro_f1_table, render_markdown\n"
        f"r = Report.from_dict(json.loads(open({str(REPORT)!r}).read()))\n"
        "render_markdown(r); macro_f1_table(r)\n"
        "sys.exit(1 if 'sklearn' in sys.modules else 0)\n"
    )
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- every metric's delta (report version 3) -------------------------------------------------------------
def test_the_bootstrap_metrics_are_scikit_learns() -> None:
    """The vectorised metrics the bootstrap draws from equal `tenant_metrics` (scikit-learn) on any sample,
    labels missing from gold or predictions included."""
    from cockpit.report import metrics_batch, tenant_metrics

    labels = ["A", "B", "C", "D"]
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(3, 30))
        gold = rng.integers(0, 3, size=n)  # D never gold
        pred = rng.integers(0, 4, size=n)
        batch = metrics_batch(gold[None], pred[None], len(labels))
        expected = tenant_metrics([labels[i] for i in gold], [labels[i] for i in pred], labels)
        for metric in METRICS:
            assert batch[metric][0] == pytest.approx(getattr(expected, metric), abs=1e-12), metric


def test_every_metric_has_its_delta_and_interval(report: Report) -> None:
    """Before version 3 the deltas were macro F1's only: the app's `m` left Δ and the bars on macro F1."""
    for row in [*report.tenants, report.mean]:
        for metric in METRICS:
            d = row.delta("base", metric)
            assert d is not None and d.low <= d.value <= d.high, (row.name, metric)
            if row.n is not None:  # a tenant: the delta is the difference of the two systems' figures
                diff = row.metric("finetuned", metric) - row.metric("base", metric)
                assert d.value == pytest.approx(diff, abs=1e-12)
        assert row.delta("base", "macro_f1") == row.deltas["base"]
    for metric in METRICS:
        rows = [t.delta("base", metric).value for t in report.tenants]
        assert report.mean.delta("base", metric).value == pytest.approx(np.mean(rows), abs=1e-12)
    data = report.to_dict()
    assert data["report_version"] == 3 and set(data["mean"]["metric_deltas"]) == {
        "micro_f1",
        "precision",
        "recall",
    }
    assert Report.from_dict(json.loads(json.dumps(data))) == report


def test_a_version_2_report_has_macro_deltas_only() -> None:
    r = Report.from_dict(json.loads(REPORT.read_text()))
    assert r.tenants[0].delta("base") is not None and r.tenants[0].delta("base", "micro_f1") is None
