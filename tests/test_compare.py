"""`cockpit compare`: two runs with different learning rates in one screen, and their table.

The runs are synthetic records written with the record's writer (`compare_helpers.lr_run`): what is
checked is read back from their event files and report.json, never restated.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest
from compare_helpers import lr_run
from tui_helpers import sync, wait_for

from cockpit import cli
from cockpit.app.compare import CompareApp, make_compare_app
from cockpit.app.widgets.compare_chart import CompareChart
from cockpit.compare import compare_runs, differences
from cockpit.record import read_events

SIZE = (120, 40)


@pytest.fixture
def two_rates(tmp_path: Path) -> list[Path]:
    """Learning rate 5e-3 (evaluated) and 1e-3 (evaluated, lower F1): the same profile otherwise."""
    return [
        lr_run(tmp_path, 0.005, name="20261130-100000-tiny-cpu-aaaa", seed=1, report_scale=1.0),
        lr_run(tmp_path, 0.001, name="20261130-110000-tiny-cpu-bbbb", seed=2, report_scale=0.8),
    ]


def test_the_table_holds_what_each_record_says(two_rates: list[Path]) -> None:
    comparison = compare_runs(two_rates)
    for run_dir, summary in zip(two_rates, comparison.summaries, strict=True):
        steps = read_events(run_dir, "step")
        vals = read_events(run_dir, "val_loss")
        assert summary.final_loss == steps[-1]["loss"]
        assert summary.final_val_loss == vals[-1]["loss"]
        assert summary.median_tokens_per_s == statistics.median(e["tokens_per_s"] for e in steps)
        rss = [e["rss_mib"] for e in steps] + [e["run_rss_mib"] for e in read_events(run_dir, "telemetry")]
        assert summary.rss_peak_mib == max(rss)
        report = json.loads((run_dir / "report.json").read_text())
        assert summary.tenant_f1 == {
            t["tenant"]: t["systems"]["finetuned"]["macro_f1"] for t in report["tenants"]
        }
        assert summary.cuda_peak_mib is None  # a CPU run: no CUDA figure, none made up
    assert [s.label for s in comparison.summaries] == ["lr 0.005", "lr 0.001"]


def test_labels_name_only_the_fields_that_differ() -> None:
    a = {"name": "a", "training": {"learning_rate": 0.001, "seed": 0}, "lora": {"r": 16}}
    b = {"name": "b", "training": {"learning_rate": 0.005, "seed": 0}, "lora": {"r": 32}}
    assert differences([a, b]) == ["lora.r", "training.learning_rate"]
    assert differences([a, None]) == []
    assert differences([a, {**b, "eval": {"enabled": True}}]) == ["lora.r", "training.learning_rate"]


def test_format_md_and_json_without_a_terminal(two_rates: list[Path], capsys) -> None:
    assert cli.main(["compare", *map(str, two_rates), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["label"] for r in data["runs"]] == ["lr 0.005", "lr 0.001"]
    assert data["tenants"] == ["helix", "ledger", "lexis", "northwind", "orbit"]
    assert cli.main(["compare", *map(str, two_rates), "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("# Runs compared") and "| A 20261130-100000-tiny-cpu-aaaa | lr 0.005 |" in md
    assert "## Macro F1 of the tuned model per tenant (points)" in md


def test_compare_refuses_one_run_the_same_run_twice_and_no_terminal(two_rates: list[Path], capsys) -> None:
    a = str(two_rates[0])
    for args, words in (
        ([a], "from 2 to"),
        ([a, a], "are the same run"),
        ([a, str(two_rates[1])], "needs a terminal"),  # pytest's stdin is not a terminal
    ):
        assert cli.main(["compare", *args]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err


@sync
async def test_x_switches_the_charts_between_step_and_time(two_rates: list[Path]) -> None:
    app = make_compare_app(two_rates)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.comparison is not None)
        chart = app.screen.query_one("#compare-loss", CompareChart)
        await wait_for(pilot, lambda: chart.data is not None)
        assert chart.data.title == "loss vs step" and chart.data.x_hi == 200
        await pilot.press("x")
        await wait_for(pilot, lambda: chart.data.title == "loss vs elapsed time")
        last = max(e["t"] for e in read_events(two_rates[0], "step") + read_events(two_rates[1], "step"))
        assert chart.data.x_hi == pytest.approx(last - min(e["t"] for e in read_events(two_rates[0], "step")))
        assert [t.label for t in chart.data.traces] == ["A lr 0.005", "B lr 0.001"]


def shown(app: CompareApp):
    async def run_before(pilot) -> None:
        deadline = time.monotonic() + 20
        while app.comparison is None:
            if time.monotonic() > deadline:
                raise AssertionError("the runs were not read")
            await pilot.pause(0.05)
        charts = list(app.screen.query(CompareChart))
        while not all(c.data is not None for c in charts):  # drawn after the first layout, at their widths
            if time.monotonic() > deadline:
                raise AssertionError("the charts were not drawn")
            await pilot.pause(0.05)
        await pilot.pause()

    return run_before


def test_compare_screen_snapshot(snap_compare, two_rates: list[Path]) -> None:
    app = make_compare_app(two_rates)
    assert snap_compare(app, terminal_size=SIZE, run_before=shown(app))
