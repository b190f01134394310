"""The app at 80 columns, as a walk through it in tmux found it (issue 27, items 28-35): the loss chart's
legend, the log pane's folding, replay's log on the replay clock, the `--no-ui` progress line, and the
time between a stop and its resume. Each test failed before its fix."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from synthetic_run import T0, TENANTS, SyntheticRun, make_run
from tui_helpers import region_text, screen_text, settle, sync, wait_for
from walk_scenes import LR_RUNS, late_warning_run, resumed_run, still_running

from cockpit.app.app import CockpitApp, make_app
from cockpit.app.compare import CompareApp
from cockpit.app.screens.report import ReportScreen
from cockpit.app.widgets.chart import BrailleChart
from cockpit.headless import HeadlessViewer, bar_fields, step_line
from cockpit.record import RunReader
from cockpit.record.manifest import update_manifest
from cockpit.record.playback import Playback
from cockpit.record.view import RunView


def live(run: SyntheticRun) -> CockpitApp:
    return make_app(run.root, live=True, now=lambda: run.now + 0.5)


def legend(app: CockpitApp) -> str:
    """The loss chart's legend rows (above its plot), as shown."""
    chart = app.run_screen.query_one("#chart-loss", BrailleChart)
    return "\n".join(row for row in region_text(app, chart) if "┤" not in row and "│" not in row[:8])


# --- 28: the validation loss in the legend ---------------------------------------------------------------
@pytest.mark.parametrize("size", [(80, 24), (100, 30)], ids=["80x24", "100x30"])
@sync
async def test_the_validation_loss_is_in_the_legend(tmp_path: Path, size: tuple[int, int]) -> None:
    """Before: `━ loss 2.5046  ━ smoothed 4.0056  +` at 80 columns (the count cut), `+1` at 100."""
    run = make_run(tmp_path, "validated")
    app = live(run)
    async with app.run_test(size=size) as pilot:
        await settle(pilot, app)
        shown = legend(app)
        assert re.search(r"━ val 0\.\d{4}", shown), shown
        assert "━ loss" in shown and "━ smoothed" in shown and not re.search(r"\+\d", shown), shown


@sync
async def test_v_names_every_tenant_at_80_columns(tmp_path: Path) -> None:
    """Before: with `v`, five more lines in the chart and `+6` in its legend."""
    run = make_run(tmp_path, "validated")
    app = live(run)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        seen = app.shown
        await pilot.press("v")
        await wait_for(pilot, lambda: app.shown > seen + 1 and app.val_tenants)
        await pilot.pause()
        shown = legend(app)
        assert all(f"━ {tenant}" in shown for tenant in TENANTS), shown
        assert re.search(r"━ val 0\.\d{4}", shown) and not re.search(r"\+\d", shown), shown
        chart = app.run_screen.query_one("#chart-loss", BrailleChart)
        plot_rows = [row for row in region_text(app, chart) if "┤" in row or row[:8].endswith("│")]
        assert len(plot_rows) >= 3  # the plot keeps its rows


# --- 29: the log pane breaks lines at spaces -----------------------------------------------------------
@sync
async def test_the_log_pane_keeps_numbers_whole(tmp_path: Path) -> None:
    """Before: `... lr 5.00e-03 2,606 tok/` / `s (0.58 s/step)` at 100 columns (and `18` / `62 tok/s`)."""
    run = make_run(tmp_path, "training")
    app = live(run)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot, app)
        log = app.run_screen.query_one("#log")
        words = {word for line in log.lines for word in line.split()}
        rows = region_text(app, log)
        for row in rows:
            for word in row.split():
                assert word in words, (word, row)
        assert len(rows) > 4 and any(row.startswith("  ") for row in rows)  # folded, the rest indented


# --- 30: replay's log pane on the replay clock ----------------------------------------------------------
def test_a_replays_log_shows_only_what_was_printed_by_its_clock(tmp_path: Path) -> None:
    """Before: at `elapsed 0:10` the log pane already showed the warning printed at 0:30 (a record's log
    followed its steps only, and there were none yet)."""
    run = late_warning_run(tmp_path)
    pb = Playback(run.root, live=False, now=lambda: 0.0)
    pb.load()
    pb.command("seek", T0 + 10.0)
    pb.tick()
    early = pb.output_tail()
    assert any("phase: setup" in line for line in early)
    assert not any("late" in line for line in early), early
    pb.command("seek", T0 + 31.0)
    pb.tick()
    assert any("late" in line for line in pb.output_tail())
    assert not any(line.startswith("step 1/") for line in pb.output_tail())
    pb.command("end")
    pb.tick()
    assert pb.output_tail()[-1].startswith("step 3/")


# --- 34: the --no-ui progress line -----------------------------------------------------------------------
def test_the_plain_step_line_writes_its_eta_as_the_app_does(tmp_path: Path) -> None:
    """Before: `ETA 01:53` where the app says `ETA 1:53`."""
    run = make_run(tmp_path, "training")
    view = RunView()
    view.apply(RunReader(run.root).poll())
    eta = view.eta_s()
    assert eta is not None and 60 < eta < 600
    line = step_line(view)
    assert f"ETA {int(eta) // 60}:{int(eta) % 60:02d} " in line and "ETA 0" not in line


def test_the_progress_bar_shows_what_the_evaluation_has(tmp_path: Path) -> None:
    """Before: the bar kept training's loss and tokens/s through the evaluation, and wrote its elapsed
    time `0:05:06` and its ETA `00:09` where the app writes `5:06` and `0:09`."""
    run = make_run(tmp_path, "eval")
    update_manifest(run.root, status="finished")  # the viewer draws the record once and stops
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160, color_system=None)
    viewer = HeadlessViewer(run.root, console=console, alive=lambda: True)
    viewer._follow_bar()
    bar = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue()).splitlines()[-1]
    assert "eval finetuned" in bar and "96/200" in bar, bar
    assert "loss" not in bar and "tok/s" not in bar, bar
    assert re.search(r"ETA 0:\d\d\b", bar) and not re.search(r"\b0:0\d:\d\d\b|\b00:", bar), bar


def test_the_progress_bar_before_the_first_step_has_no_training_figures(tmp_path: Path) -> None:
    """Before: `loss -  - tok/s` through the setup, the load and the engine's build."""

    def fields(moment: str) -> dict[str, object]:
        run = make_run(tmp_path / moment, moment)
        view = RunView()
        view.apply(RunReader(run.root).poll())
        return bar_fields(view, run.now)

    assert fields("load")["detail"] == ""
    assert str(fields("training")["detail"]).startswith("loss 0.")


# --- 35: the time between a stop and its resume ------------------------------------------------------------
def test_elapsed_time_leaves_out_the_time_between_stop_and_resume(tmp_path: Path) -> None:
    run = resumed_run(tmp_path)
    pb = Playback(run.root, live=True, now=lambda: run.now + 0.5)
    pb.load()
    pb.tick()
    assert pb.elapsed_s() < 300  # before: over ten minutes
    stops = pb.view.pauses
    assert len(stops) == 1 and stops[0][1] - stops[0][0] == pytest.approx(600.0)
    assert pb.elapsed_s() == pytest.approx(run.now + 0.5 - T0 - 600.0)


@sync
async def test_the_charts_leave_out_the_gap_and_mark_the_resume(tmp_path: Path) -> None:
    run = resumed_run(tmp_path)
    app = live(run)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        loss = app.last_snapshot.charts["loss"]
        assert loss.x_hi < 300  # before: the axis ran over the ten minutes stopped
        assert loss.x_hi == pytest.approx(app.last_snapshot.header.elapsed_s, abs=1.0)
        assert len(loss.marks) == 1 and 0 < loss.marks[0] < loss.x_hi
        text = screen_text(app)
        assert "┊" in text and "resumed" in text


# --- 32: the report at 80x24 ---------------------------------------------------------------------------
@sync
async def test_the_reports_delta_bars_fit_80x24_and_the_cost_is_one_key_away(tmp_path: Path) -> None:
    """Before: the Δ/CI bars were below the serving cost, reachable only by scrolling (a one-cell
    scrollbar the only hint), and the title was cut (`95% CI: paired …`)."""
    run = make_run(tmp_path, "report")
    app = live(run)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await wait_for(pilot, lambda: app.report is not None)
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ReportScreen))
        await pilot.pause()
        deltas = app.screen.query_one("#report-deltas").region
        assert deltas.height > 0 and deltas.bottom <= 23, deltas  # above the footer, without scrolling
        text = screen_text(app).splitlines()
        assert not any("…" in line for line in text[:2]), text[:2]
        assert any("mean" in line and "├" in line for line in text[: deltas.bottom])  # the mean's bar
        assert any("serving cost (c)" in line for line in text[:23])  # what is below, named
        await pilot.press("c")
        await pilot.pause()
        serving = app.screen.query_one("#report-serving").region
        assert serving.y >= 2 and serving.bottom <= 23, serving
        assert "cheaper per generated token" in screen_text(app)


# --- 33: compare at 80x24 ------------------------------------------------------------------------------
async def compared(pilot, app: CompareApp) -> None:
    await wait_for(
        pilot, lambda: app.comparison is not None and all(c.data for c in app.screen.query("CompareChart"))
    )
    await pilot.pause()


@sync
async def test_compare_at_80x24_has_whole_run_ids_and_the_f1_per_tenant(tmp_path: Path) -> None:
    """Before: the title cut the second run id (`■ B 20261201-07…`) and the per-tenant F1 was dropped."""
    app = CompareApp(LR_RUNS)
    async with app.run_test(size=(80, 24)) as pilot:
        await compared(pilot, app)
        title = "\n".join(screen_text(app).splitlines()[:3])
        assert all(run.name in title for run in LR_RUNS), title
        await pilot.press("f")
        await pilot.pause()
        f1 = app.screen.query_one("#compare-f1")
        assert f1.region.height > 0 and f1.region.bottom <= 23
        shown = "\n".join(region_text(app, f1))
        assert all(tenant in shown for tenant in TENANTS) and "mean" in shown, shown
        await pilot.press("f")
        await pilot.pause()
        assert app.screen.query_one("#compare-table").region.height > 0


@sync
async def test_compare_marks_and_follows_a_run_that_is_still_going(tmp_path: Path) -> None:
    """Before: read once, a running run looked like an ended one."""
    from cockpit.record import EventWriter, RunPaths

    going = still_running(tmp_path)
    app = CompareApp([LR_RUNS[0], going], follow_s=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        await compared(pilot, app)
        text = screen_text(app)
        assert "● running" in text and "following B" in text
        assert app.comparison.summaries[1].steps == 150
        events = RunPaths(going).events("trainer-rank0")
        last_t = max(json.loads(line)["t"] for line in events.read_text().splitlines())
        with EventWriter(events, rank=0) as w:  # the run goes on: a step a second after its last event
            w.write("step", at=last_t + 1.0, step=151, max_steps=300, loss=0.5, tokens_per_s=2000.0)
        await wait_for(pilot, lambda: app.comparison.summaries[1].steps == 151)
        await pilot.pause()
        assert re.search(r"■ B lr 0\.001 ●\s+151 ", screen_text(app))
