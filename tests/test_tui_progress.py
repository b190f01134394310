"""What the app says as a run goes: the load in words and numbers, one figure for tokens/s, an ETA that
counts the evaluation, a stop said one way, an ended run's whole diagnosis, a resume's own numbers; and
everything essential inside 80×24. Pilot tests on synthetic records (`tests/synthetic_run.py`)."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest
from synthetic_run import DS_WARNING, SyntheticRun, make_run
from tui_helpers import copy_until, fixture_times, region_text, screen_text, settle, sync, wait_for

from cockpit.app.app import CockpitApp, make_app
from cockpit.app.model import compact_log_line
from cockpit.app.screens.report import ReportScreen
from cockpit.app.widgets.header import diagnosis_line
from cockpit.app.widgets.panels import AuditPanel, fold_log_line
from cockpit.headless import step_line
from cockpit.record import RunReader
from cockpit.record.view import RunView

SMALL = (80, 24)


def live(run: SyntheticRun) -> CockpitApp:
    return make_app(run.root, live=True, now=lambda: run.now + 0.5)


def header(app: CockpitApp) -> str:
    """The header's rows, joined (an ended run's diagnosis wraps over several)."""
    rows = app.run_screen.query_one("#header").region.height
    return " ".join(line.strip() for line in screen_text(app).splitlines()[:rows])


# --- 3: the first seconds -----------------------------------------------------------------------------
@sync
async def test_the_load_says_what_happens_and_how_far(tmp_path: Path) -> None:
    """Before: `phase starting`, every chart `no data yet`, cut-off DeepSpeed warnings."""
    run = SyntheticRun(tmp_path).start()
    app = live(run)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, app)
        assert "starting the trainer (launcher, imports)" in header(app)
        run.setup().load(4, upto=2)
        await wait_for(pilot, lambda: "layer 2 of 4" in app.last_snapshot.header.activity)
        await pilot.pause()
        text = screen_text(app)
        assert "loading the model: layer 2 of 4" in header(app)
        assert "no data yet" not in text and text.count("no steps yet: loading the") >= 2
        log = app.run_screen.query_one("#log")
        assert log.lines[0] == compact_log_line(DS_WARNING)
        rows = fold_log_line(log.lines[0], log.content_region.width, app.console)
        assert " ".join(row.strip() for row in rows) == log.lines[0]  # the whole warning, folded over rows
        assert rows[-1].strip() in [row.strip() for row in region_text(app, log)]
        run.load(4).begin_training()
        await wait_for(
            pilot, lambda: app.last_snapshot.header.step == 0 and app.last_snapshot.audit is not None
        )
        assert "waiting for the first step" in app.last_snapshot.header.activity


def test_deepspeed_log_lines_lose_their_stamp_and_source() -> None:
    assert compact_log_line(DS_WARNING).startswith("WARNING Setting accelerator to CPU.")
    info = "[2026-12-02 10:15:01,469] [INFO] [launch.py:145:main] dist_world_size=1"
    assert compact_log_line(info) == "dist_world_size=1"
    path = (
        "/work/main/.venv/lib/python3.11/site-packages/transformers/modeling_utils.py:3204: FutureWarning: x"
    )
    assert compact_log_line(path) == "transformers/modeling_utils.py:3204: FutureWarning: x"
    assert compact_log_line("step 3/324 loss 2.1") == "step 3/324 loss 2.1"


# --- 4: 80x24 ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("moment", ["load", "training", "eval", "stopped"])
@sync
async def test_everything_essential_fits_80x24(tmp_path: Path, moment: str) -> None:
    run = make_run(tmp_path, moment)
    app = live(run)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, app)
        text = screen_text(app)
        for selector in ("#header", "#chart-loss", "#chart-host", "#audit-box", "#log", "Footer"):
            region = app.screen.query_one(selector).region
            assert region.height > 0 and region.y >= 0 and region.bottom <= 24, (selector, region)
        assert not re.search(r"━ [^━│]*\+\d", text), "a legend hides entries"
        audit = app.run_screen.query_one(AuditPanel)
        assert audit.region.height >= 4  # the audit's items, each on its own line: no scrolling
        for chart in app.last_snapshot.charts.values():
            if chart.note:
                assert chart.note in text, chart.note  # subtitles whole
        assert "…" not in "".join(line[41:] for line in text.splitlines()[-8:])  # the log pane cuts nothing


@sync
async def test_the_audit_fits_without_scrolling_at_80x24(tmp_path: Path) -> None:
    """The recorded tiny run's audit: a dropped setting, two warnings (before: it needed scrolling)."""
    first, last = fixture_times()
    mid = first + (last - first) / 2
    app = make_app(copy_until(tmp_path, mid), live=True, now=lambda: mid + 1)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, app)
        audit = app.run_screen.query_one(AuditPanel)
        body = "\n".join(region_text(app, audit))
        assert audit.compact and "✗ partitioned at load: no (asked yes)" in body
        assert "⚠ ZeRO-3 did not partition at load" in body and "⚠ experts:" in body


@sync
async def test_the_report_table_and_its_bars_fit_80x24(tmp_path: Path) -> None:
    """The table and the delta bars without scrolling; the serving cost under them, `c` away (see
    test_tui_walk.py: before, the cost came first and the bars needed scrolling)."""
    run = make_run(tmp_path, "report")
    app = live(run)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, app)
        await wait_for(pilot, lambda: app.report is not None)
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ReportScreen))
        await pilot.pause()
        for panel in ("#report-table", "#report-deltas"):
            region = app.screen.query_one(panel).region
            assert region.bottom <= 23, (panel, region)  # above the footer, without scrolling
        assert "│ mean " in screen_text(app)


@sync
async def test_at_100x30_log_lines_and_subtitles_are_whole(tmp_path: Path) -> None:
    run = make_run(tmp_path, "training")
    app = live(run)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot, app)
        log = app.run_screen.query_one("#log")
        last = log.lines[-1]
        assert last.startswith("step 120/324") and len(last) > log.content_region.width
        shown = "".join(region_text(app, log))
        assert last.replace(" ", "") in shown.replace(" ", "")  # folded over two rows, not cut
        text = screen_text(app)
        for chart in app.last_snapshot.charts.values():
            assert not chart.note or chart.note in text


# --- 5: stopping ------------------------------------------------------------------------------------------
@sync
async def test_stopping_is_said_one_way_and_the_end_whole(tmp_path: Path) -> None:
    """Before: `RUNNING (stop requested)` beside `phase stopped`, a cut diagnosis, LIVE on a stopped run."""
    run = make_run(tmp_path, "stopping")
    app = live(run)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, app)
        text = header(app)
        assert "STOPPING" in text and "RUNNING" not in text and "stop requested" in text
        run.train(1)
        run.trainer.write("stop_ack", step=run.step)
        run.checkpoint()
        run.trainer.write("trainer_end", outcome="stopped", step=run.step)
        await wait_for(pilot, lambda: app.last_snapshot.header.phase == "stopped")
        await pilot.pause()
        text = header(app)
        assert "STOPPING" in text and "RUNNING" not in text
        assert "stopped at step 121 with a checkpoint; closing" in text
        run.wait(1.5).end("stopped", "stopped by user at step 121, checkpoint saved", exit_code=3)
        await wait_for(pilot, lambda: app.last_snapshot.header.status == "stopped")
        await pilot.pause()
        text = header(app)
        assert "STOPPED" in text and "ENDED" in text and "LIVE" not in text
        assert "stopped by user at step 121, checkpoint saved" in text
        assert f"next: cockpit resume {run.root.name}" in text  # where to go on from, whole at 80 columns
        assert app.run_screen.query_one("#header").region.height == 3  # the diagnosis on one line


@sync
async def test_a_long_diagnosis_keeps_one_line_at_80_columns(tmp_path: Path) -> None:
    """Before: the finished diagnosis wrapped onto a fourth header line. Now its parenthesised detail gives
    way (the report has it); at 120 columns it is whole."""
    run = make_run(tmp_path, "report")
    app = live(run)
    diagnosis = run.manifest["diagnosis"]
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, app)
        assert len(diagnosis) > 80 and app.run_screen.query_one("#header").region.height == 3
        assert diagnosis.split(" (")[0] in screen_text(app).splitlines()[2]
    async with live(run).run_test(size=(120, 40)) as pilot:
        await settle(pilot, pilot.app)
        assert diagnosis in header(pilot.app)


def test_a_failure_is_never_cut() -> None:
    """Why a run failed is kept whole, even where it then takes two lines; a finished run's detail goes."""
    failure = "rank 0: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.35 GiB total capacity)"
    assert diagnosis_line(failure, 80, "failed") == failure
    finished = "finished at step 324; mean macro F1 base 35.9, finetuned 84.1 (tuned vs base +48.3 points)"
    assert diagnosis_line(finished, 80) == "finished at step 324; mean macro F1 base 35.9, finetuned 84.1"
    assert diagnosis_line(finished, 120) == finished


# --- 7: the ETA ------------------------------------------------------------------------------------------
@sync
async def test_the_eta_counts_the_evaluation(tmp_path: Path) -> None:
    """Before: ETA 0:00 through the whole evaluation."""
    run = make_run(tmp_path, "training")
    app = live(run)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, app)
        h = app.last_snapshot.header
        assert h.eta_s > 60 and h.eta_note == "+ eval" and "+ eval" in header(app)
        run.train(204).finish_training()
        await wait_for(pilot, lambda: app.last_snapshot.header.phase == "done")
        assert "eval next" in header(app)
        run.evaluate(done=96)  # 0.09 s an example: 104 of 200 left of the second (and last) system
        await wait_for(pilot, lambda: app.last_snapshot.header.eval_progress == "finetuned 96/200")
        h = app.last_snapshot.header
        assert h.eta_s == pytest.approx(104 * 0.09, rel=0.05)
        assert "ETA 0:09" in header(app) and "evaluating finetuned 96/200 (2 of 2)" in header(app)


def test_the_eta_of_the_first_system_counts_the_second() -> None:
    view = RunView()
    view.apply([
        {"t": 0.0, "kind": "eval_begin", "systems": ["base", "finetuned"], "examples": 200},
        {"t": 10.0, "kind": "eval_progress", "system": "base", "done": 8, "total": 200},
        {"t": 20.0, "kind": "eval_progress", "system": "base", "done": 108, "total": 200},
    ])  # fmt: skip
    assert view.eta_s() == pytest.approx((92 + 200) * 0.1)


# --- 8: one figure for tokens/s, a mean with its value, a resume's own numbers --------------------------
@sync
async def test_the_header_and_the_legend_give_the_same_tokens_per_s(tmp_path: Path) -> None:
    run = make_run(tmp_path, "training")
    app = live(run)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, app)
        steps = [e for e in RunReader(run.root).poll() if e["kind"] == "step"]
        median = statistics.median(e["tokens_per_s"] for e in steps[-20:])
        mean = statistics.fmean(e["tokens_per_s"] for e in steps)
        text = screen_text(app)
        assert f"{median:,.0f} tok/s" in header(app)
        assert f"━ tokens/s {median:,.0f}" in text and f"━ mean {mean:,.0f}" in text
        assert "median of last 20" in text


@sync
async def test_a_resume_shows_its_own_numbers_while_the_model_reloads(tmp_path: Path) -> None:
    """Before: the previous attempt's loss, tokens/s and ETA while the model reloaded."""
    run = make_run(tmp_path, "stopped")
    run.resume().setup().load(4, upto=1)
    app = live(run)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, app)
        h = app.last_snapshot.header
        assert h.loss is None and h.tokens_per_s is None and h.eta_s is None
        assert "resuming from step 121: loading the model: layer 1 of 4" in header(app)
        assert "tok/s" not in header(app) and "loss" not in header(app)
        run.load(4).begin_training().train(3)
        await wait_for(pilot, lambda: app.last_snapshot.header.step == 124)
        h = app.last_snapshot.header
        assert h.loss is not None and h.tokens_per_s is not None and h.eta_s is not None
        assert "resuming" not in header(app)


def test_the_headless_line_of_a_resume_waits_for_its_first_step(tmp_path: Path) -> None:
    run = make_run(tmp_path, "stopped")
    view = RunView()
    reader = RunReader(run.root)
    view.apply(reader.poll())
    assert "loss 0.2" in step_line(view) or "loss -" not in step_line(view)
    run.resume().setup().load(4, upto=1)
    view.apply(reader.poll())
    line = step_line(view)
    assert "loss -" in line and "- tok/s" in line and "ETA --:--" in line and "step 121/324" in line


# --- a jump to the end of a long replay answers at once, then folds in slices -----------------------------
def test_a_fold_in_slices_ends_where_a_fold_in_one_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tick(budget_s=...)` stops after its budget with `catching_up`; slice after slice it reaches the
    same state as one unbudgeted tick (the app shows each slice's state instead of freezing)."""
    import numpy as np

    from cockpit.record import playback

    run = make_run(tmp_path, "report")
    monkeypatch.setattr(playback, "SLICE_ROWS", 16)
    whole, sliced = (playback.Playback(run.root, live=False, now=lambda: 0.0) for _ in range(2))
    for pb in (whole, sliced):
        pb.load()
        pb.tick()
        pb.command("end")
    whole.tick()
    slices = 0
    while True:
        sliced.tick(budget_s=0.0)
        slices += 1
        if not sliced.catching_up:
            break
        assert sliced.view.step <= whole.view.step
    assert slices > 10 and not whole.catching_up
    assert sliced.view.steps == whole.view.steps and sliced.view.report == whole.view.report
    assert sliced.status() == whole.status() == "finished"
    for name in ("loss", "loss_smooth", "tokens_per_s", "ram_used", "run_rss"):
        a, b = getattr(sliced.series, name), getattr(whole.series, name)
        assert np.array_equal(a.x, b.x) and np.allclose(a.y, b.y), name
