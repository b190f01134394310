"""Keys in a user's hands: the footer offers only keys that act, one that cannot says why, `m` switches
every figure of the report to its metric, `g` the GPU chart's axis. On synthetic records."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from synthetic_run import make_run
from tui_helpers import screen_text, settle, sync, wait_for

from cockpit.app.app import CockpitApp, make_app
from cockpit.app.screens.confirm import ConfirmStop
from cockpit.app.screens.report import ReportScreen
from cockpit.record.playback import Playback

SMALL = (80, 24)
EVERY_KEY = {"s", "d", "q", "l", "r", "p", "g", "v", "space", "+", "-", "e", "m"}


def footer_keys(app: CockpitApp) -> set[str]:
    """The keys the footer shows (its last row), by their label."""
    footer = screen_text(app).splitlines()[-1]
    labels = {"Stop": "s", "Detach": "d", "Quit": "q", "Log": "l", "Report": "r", "Prediction": "p",
              "GPU axis": "g", "Val/tenant": "v", "Pause": "space", "Play": "space", "Faster": "+",
              "Slower": "-", "End": "e", "Metric": "m", "Back": "r"}  # fmt: skip
    shown = {key for label, key in labels.items() if re.search(rf"(^| )\S+ {label}( |$)", footer)}
    return shown


async def notified(pilot, app: CockpitApp, key: str) -> str:
    """Press `key` and return the notification it raised."""
    before = len(app._notifications)
    await pilot.press(key)
    await wait_for(pilot, lambda: len(app._notifications) > before)
    return list(app._notifications)[-1].message


@sync
async def test_a_live_run_in_training_offers_only_what_acts(tmp_path: Path) -> None:
    run = make_run(tmp_path, "training")
    app = make_app(run.root, live=True, now=lambda: run.now + 0.5)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, app)
        assert footer_keys(app) == {"s", "d", "q", "l", "space"}  # at 80 columns, every one of them
        assert "+ Faster" not in screen_text(app)
        reason = await notified(pilot, app, "plus")
        assert "live view runs at the run's own pace" in reason
        await pilot.press("space")  # frozen: now `e` (and `space`) go back to live
        await wait_for(pilot, lambda: app.last_snapshot.header.paused)
        await pilot.pause()
        assert footer_keys(app) == {"s", "d", "q", "l", "space", "e"}
        assert " Play " in screen_text(app).splitlines()[-1] + " "


@sync
async def test_a_finished_run_and_its_report_offer_no_stop(tmp_path: Path) -> None:
    run = make_run(tmp_path, "report")
    app = make_app(run.root, live=True, now=lambda: run.now + 0.5)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, app)
        await wait_for(pilot, lambda: app.report is not None)
        await pilot.pause()
        assert footer_keys(app) == {"q", "l", "r"}
        assert "nothing to stop" in await notified(pilot, app, "s")
        assert not isinstance(app.screen, ConfirmStop)
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ReportScreen))
        await pilot.pause()
        assert footer_keys(app) == {"r", "m", "q"}
        assert "back to the run screen" in await notified(pilot, app, "s")
        assert "back to the run screen" in await notified(pilot, app, "l")


@sync
async def test_a_replay_offers_speed_and_no_stop(tmp_path: Path) -> None:
    run = make_run(tmp_path, "training")
    pb = Playback(run.root, live=False, speed=8.0, now=lambda: 0.0)
    app = CockpitApp(playback=pb)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, app)
        assert footer_keys(app) == {"q", "l", "space", "+", "-", "e"}
        assert "a replay cannot stop a run" in await notified(pilot, app, "s")
        assert "not attached" in await notified(pilot, app, "d")


@sync
async def test_a_stop_once_asked_is_not_offered_again(tmp_path: Path) -> None:
    run = make_run(tmp_path, "stopping")
    app = make_app(run.root, live=True, now=lambda: run.now + 0.5)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, app)
        assert "s" not in footer_keys(app)
        assert "already requested" in await notified(pilot, app, "s")


@sync
async def test_a_confirmed_stop_says_stopping_at_once(tmp_path: Path) -> None:
    """Before: RUNNING and `s Stop` until the supervisor had read the request (up to 5 s on a busy
    machine). Here no supervisor reads it: the record never says so, the header must say it anyway."""
    run = make_run(tmp_path, "training")
    app = make_app(run.root, live=True, now=lambda: run.now + 0.5)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, app)
        assert "RUNNING" in screen_text(app).splitlines()[0]
        await pilot.press("s")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmStop))
        before = len(app._notifications)
        await pilot.press("y")
        await wait_for(pilot, lambda: len(app._notifications) > before)  # the request is written
        assert (run.paths.control_dir / "stop").exists()
        seen = app.shown
        await wait_for(pilot, lambda: app.shown > seen)
        await pilot.pause()
        text = screen_text(app)
        assert "STOPPING" in text.splitlines()[0] and "RUNNING" not in text
        assert "stop requested: a checkpoint after this step" in app.last_snapshot.header.activity
        assert "s" not in footer_keys(app)


@sync
async def test_v_is_in_the_footer_once_there_are_tenants_and_answers(tmp_path: Path) -> None:
    """Before: `v` was hidden from the footer and pressing it said nothing."""
    run = make_run(tmp_path, "training")
    app = make_app(run.root, live=True, now=lambda: run.now + 0.5)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, app)
        assert "v" not in footer_keys(app)
        assert "no validation loss per tenant yet" in await notified(pilot, app, "v")
        run.validate()
        await wait_for(pilot, lambda: app.last_snapshot.has_val_tenants)
        await pilot.pause()
        assert "v" in footer_keys(app)
        assert "each tenant's validation loss" in await notified(pilot, app, "v")
        await wait_for(pilot, lambda: app.last_snapshot.charts["loss"].title.startswith("validation"))


def _table_row(text: str, tenant: str) -> list[float]:
    line = next(line for line in text.splitlines() if re.search(rf"│ {tenant} ", line))
    return [float(x) for x in re.findall(r"[+-]?\d+\.\d", line)]


@sync
async def test_m_switches_the_delta_its_interval_and_the_bars_to_the_metric(tmp_path: Path) -> None:
    """Before: with micro F1 shown, a row read `22.5  75.0  +59.5` (the Δ still macro F1's)."""
    run = make_run(tmp_path, "report")
    app = make_app(run.root, live=True, now=lambda: run.now + 0.5)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await wait_for(pilot, lambda: app.report is not None)
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ReportScreen))
        for metric, name in [("micro_f1", "micro F1"), ("precision", "precision"), ("recall", "recall")]:
            await pilot.press("m")
            await wait_for(pilot, lambda metric=metric: app.screen.metric == metric)
            await pilot.pause()
            text = screen_text(app)
            assert f"Δ {name} vs base" in text and f"finetuned − base: {name} per tenant" in text
            for tenant in ("helix", "orbit", "mean"):
                base, tuned, delta, low, high = _table_row(text, tenant)[:5]
                assert delta == pytest.approx(tuned - base, abs=0.11), (metric, tenant)
                assert low <= delta <= high
                expected = (
                    app.report.mean
                    if tenant == "mean"
                    else next(t for t in app.report.tenants if t.name == tenant)
                )
                d = expected.delta("base", metric)
                assert d is not None and f"{100 * d.low:+.1f}" == f"{low:+.1f}"
            bars = [line for line in text.splitlines() if re.search(r"│ helix +│", line)]
            assert bars and f"{100 * app.report.tenants[0].delta('base', metric).value:+.1f}" in bars[0]


@sync
async def test_g_switches_the_gpu_axis_between_the_total_and_the_runs_range(tmp_path: Path) -> None:
    """A run using 1 GiB of a 140 GiB GPU: on the total it is a flat line at the bottom; `g` fits it."""
    run = make_run(tmp_path, "training", gpus=1)
    app = make_app(run.root, live=True, now=lambda: run.now + 0.5)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, app)
        gpu = app.last_snapshot.charts["gpu"]
        assert gpu.y_hi > 140_000 and "g" in footer_keys(app)
        used = max(float(max(t.ymax)) for t in gpu.traces if t.label == "GPU0")
        await pilot.press("g")
        await wait_for(pilot, lambda: app.last_snapshot.gpu_axis == "run")
        fitted = app.last_snapshot.charts["gpu"]
        assert used < fitted.y_hi < 1.5 * used and fitted.y_lo > 0
        assert "to the GPU's total" in fitted.note
        await pilot.press("g")
        await wait_for(pilot, lambda: app.last_snapshot.gpu_axis == "total")
        assert app.last_snapshot.charts["gpu"].y_hi > 140_000


@sync
async def test_g_says_why_without_gpus(tmp_path: Path) -> None:
    run = make_run(tmp_path, "training")
    app = make_app(run.root, live=True, now=lambda: run.now + 0.5)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, app)
        assert "g" not in footer_keys(app)
        assert "no GPU telemetry" in await notified(pilot, app, "g")
