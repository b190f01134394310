"""The report screen: its pure helpers (report parsing, bar scaling), and the app's `r` key under Pilot
in live, attach-on-a-finished-run and replay (the report belongs to the record once the clock passes
the supervisor's `report` event)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from test_report import write_own
from test_report_model import markdown_rows
from tui_helpers import REPORT, add_report, copy_until, fixture_times, sync, wait_for

from cockpit.app.app import CockpitApp, make_app
from cockpit.app.screens.report import ReportScreen
from cockpit.app.screens.run import RunScreen
from cockpit.app.widgets.report import delta_chart, metric_table
from cockpit.record import write_manifest
from cockpit.record.playback import Playback
from cockpit.report import Delta, Report, Scale, bar_cells, delta_scale, load_report, render_markdown

SIZE = (120, 40)
FIRST, LAST = fixture_times()
MID = FIRST + (LAST - FIRST) / 2


def offered(app: CockpitApp) -> bool:
    """`r` is in the footer's bindings (check_action said True)."""
    return any(b.binding.action == "report" and b.enabled for b in app.active_bindings.values())


# --- pure helpers ----------------------------------------------------------------------------------
def test_report_data_from_the_fixture() -> None:
    raw = json.loads(REPORT.read_text())
    r = Report.from_dict(raw)
    assert r.systems == ("base", "finetuned") and r.tuned == "finetuned" and r.reference == "base"
    assert [t.name for t in r.tenants] == ["helix", "ledger", "lexis", "northwind", "orbit"]
    assert r.examples == 200
    helix = r.tenants[0]
    assert helix.metrics["finetuned"].macro_f1 == raw["tenants"][0]["systems"]["finetuned"]["macro_f1"]
    d = helix.deltas["base"]
    assert (d.low, d.high) == tuple(raw["tenants"][0]["deltas"]["base"]["ci95"])
    assert r.mean.metrics["finetuned"].macro_f1 == raw["mean"]["systems"]["finetuned"]["macro_f1"]
    # precision, recall and micro F1 are averaged over tenants like macro F1
    recalls = [t["systems"]["base"]["recall"] for t in raw["tenants"]]
    assert r.mean.metrics["base"].recall == pytest.approx(sum(recalls) / len(recalls))
    assert r.serving is not None and r.serving.on_cpu and r.serving.api_usd_per_mtok == 3.0


def test_verdict_follows_the_interval() -> None:
    assert Delta(0.1, 0.02, 0.2).verdict == "better"
    assert Delta(-0.1, -0.2, -0.01).verdict == "worse"
    assert Delta(0.1, -0.02, 0.2).verdict == "unclear"
    assert Delta(0.0, 0.0, 0.1).verdict == "unclear"  # touching 0 is not above it


def test_delta_scale_holds_zero_and_every_interval_on_round_ticks() -> None:
    s = delta_scale([Delta(0.58, 0.40, 0.71), Delta(0.85, 0.77, 0.91)], 61)
    assert (s.lo, s.hi, s.step) == (0.0, pytest.approx(1.0), 0.2)
    assert s.col(0.0) == 0 and s.col(1.0) == 60 and s.col(0.5) == 30
    assert s.col(-5.0) == 0 and s.col(5.0) == 60  # clamped
    s = delta_scale([Delta(-0.03, -0.08, 0.02), Delta(0.05, -0.01, 0.12)], 40)
    assert (s.lo, s.hi, s.step) == (pytest.approx(-0.1), pytest.approx(0.15), 0.05)
    assert s.ticks() == pytest.approx([-0.1, -0.05, 0.0, 0.05, 0.1, 0.15])
    assert delta_scale([], 20).hi > delta_scale([], 20).lo  # nothing to show: still a range


def test_bar_cells_draw_the_bar_from_zero_and_the_whisker_over_it() -> None:
    s = Scale(0.0, 1.0, 11, 0.1)  # one column per 0.1
    cells = bar_cells(Delta(0.5, 0.3, 0.8), s)
    assert [c.bar for c in cells] == [True] * 6 + [False] * 5
    assert "".join(c.glyph for c in cells) == "│  ├────┤  "
    # a negative delta: the bar goes left of zero; an interval straddling zero crosses the axis
    s = delta_scale([Delta(-0.3, -0.5, 0.2)], 11)
    assert s.lo <= -0.5 and s.hi >= 0.2
    cells = bar_cells(Delta(-0.3, -0.5, 0.2), s)
    zero, end = s.col(0.0), s.col(-0.3)
    assert [i for i, c in enumerate(cells) if c.bar] == list(range(end, zero + 1))
    assert cells[zero].glyph == "┼" and cells[s.col(-0.5)].glyph == "├" and cells[s.col(0.2)].glyph == "┤"


def test_delta_chart_lines_and_colours() -> None:
    r = Report.from_dict(json.loads(REPORT.read_text()))
    text = delta_chart(r, 100)
    lines = text.plain.split("\n")
    assert [line.split()[0] for line in lines[:5]] == [t.name for t in r.tenants]
    assert lines[6].startswith("mean") and "+65.9 [+58.8, +71.1]" in lines[6]
    assert all(len(line) <= 100 for line in lines)
    assert "+100" in lines[-1] and " 0 " in f" {lines[-1]} "
    assert {str(span.style) for span in text.spans if "green" in str(span.style)}  # every CI above 0


def test_the_app_table_shows_the_markdown_numbers() -> None:
    r = Report.from_dict(json.loads(REPORT.read_text()))
    console = Console(file=io.StringIO(), width=160, color_system=None)
    console.print(metric_table(r, "macro_f1"))
    shown = {}
    for line in console.file.getvalue().splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] in {t.name for t in r.tenants}:
            shown[cells[0]] = cells[2:]  # after `n`
        elif cells[0] == "mean":
            shown["mean"] = cells[1:]  # the mean has no `n`
    assert shown == markdown_rows(render_markdown(r))
    assert list(shown) == [*(t.name for t in r.tenants), "mean"]


def test_read_report_builds_from_predictions_without_writing(tmp_path: Path) -> None:
    write_manifest(tmp_path, {"run_id": "r1", "profile": {"eval": {"bootstrap_samples": 50}}})
    assert not (tmp_path / "predictions").exists()
    write_own(tmp_path, "base", 0.3, seed=1)
    write_own(tmp_path, "finetuned", 0.9, seed=2)
    r = load_report(tmp_path)
    assert r is not None and r.source == "built from predictions" and r.bootstrap_samples == 50
    assert [t.name for t in r.tenants] == ["acme", "zeta"] and r.mean.deltas["base"].verdict == "better"
    assert not (tmp_path / "report.json").exists()  # the app only reads the record


# --- the app -----------------------------------------------------------------------------------------
@pytest.fixture
def finished_with_report(tmp_path: Path) -> Path:
    run = copy_until(tmp_path)
    add_report(run)
    return run


@sync
async def test_r_opens_and_closes_the_report_once_there_is_one(finished_with_report: Path) -> None:
    app = make_app(finished_with_report, live=True, now=lambda: LAST + 60)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        await pilot.pause()
        assert offered(app)
        assert isinstance(app.screen, RunScreen)  # offered, not shown
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ReportScreen))
        assert app.screen.report.tenants[0].name == "helix"
        await pilot.press("m")  # another metric: the screen stays
        assert isinstance(app.screen, ReportScreen) and app.screen.metric == "micro_f1"
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen))
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ReportScreen))
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen))


@sync
async def test_no_report_no_key(tmp_path: Path) -> None:
    run = copy_until(tmp_path, MID)
    app = make_app(run, live=True, now=lambda: MID + 1)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.shown > 1)
        await pilot.press("r")
        await pilot.pause(0.2)
        assert isinstance(app.screen, RunScreen) and app.report is None and not offered(app)


@sync
async def test_replay_offers_the_report_once_the_clock_passes_its_event(finished_with_report: Path) -> None:
    pb = Playback(finished_with_report, live=False, speed=1.0, now=lambda: 0.0)
    pb.load()
    pb.command("seek", MID)
    pb.command("pause")
    app = CockpitApp(playback=pb)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.shown > 2)
        await pilot.press("r")
        await pilot.pause(0.2)
        # report.json is on disk, but the record as of the clock has no report yet
        assert app.report is None and not offered(app) and isinstance(app.screen, RunScreen)
        await pilot.press("e")  # to the end of the record: past the `report` event
        await wait_for(pilot, lambda: app.report is not None)
        await pilot.pause()
        assert offered(app)
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ReportScreen))


@sync
async def test_finished_run_with_predictions_only_builds_the_report(tmp_path: Path) -> None:
    run = copy_until(tmp_path)  # no `report` event, no report.json: a report is built from the predictions
    write_own(run, "base", 0.3, seed=1)
    write_own(run, "finetuned", 0.9, seed=2)
    app = make_app(run, live=True, now=lambda: LAST + 60)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.report is not None, timeout=60)
        assert app.report.source == "built from predictions"
        await pilot.pause()
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ReportScreen))
    assert not (run / "report.json").exists()
