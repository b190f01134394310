"""The app under Pilot: bindings, the stop dialog, replay controls, following a record being written."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tui_helpers import FIXTURE, copy_until, fixture_times, screen_text, sync, wait_for

from cockpit.app.app import CockpitApp, make_app
from cockpit.app.messages import SnapshotReady, StopSent
from cockpit.app.screens.confirm import ConfirmStop
from cockpit.record.playback import Playback

SIZE = (120, 40)


FIRST, LAST = fixture_times()
MID = FIRST + (LAST - FIRST) / 2


@pytest.fixture
def mid_run(tmp_path: Path) -> Path:
    return copy_until(tmp_path, MID)


def live_app(run: Path) -> CockpitApp:
    return make_app(run, live=True, now=lambda: MID + 1)


@sync
async def test_stop_asks_first_then_writes_the_request(mid_run: Path) -> None:
    app = live_app(mid_run)
    messages = []
    async with app.run_test(size=SIZE, message_hook=messages.append) as pilot:
        await wait_for(pilot, lambda: app.shown > 0 and app.last_snapshot.header.status == "running")
        await pilot.press("s")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmStop))
        await pilot.press("n")
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmStop))
        assert not (mid_run / "control" / "stop").exists()
        await pilot.press("s")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmStop))
        await pilot.press("y")
        await wait_for(pilot, lambda: (mid_run / "control" / "stop").exists())
        await wait_for(pilot, lambda: any(isinstance(m, StopSent) for m in messages))
    sent = [m for m in messages if isinstance(m, StopSent)]
    assert sent[0].ok and "stop requested" in sent[0].detail
    assert any(isinstance(m, SnapshotReady) for m in messages)


@sync
async def test_replay_offers_no_stop_and_no_detach() -> None:
    app = make_app(FIXTURE, live=False, speed=1.0)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.shown > 0)
        assert app.check_action("stop", ()) is False and app.check_action("detach", ()) is False
        await pilot.press("s")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, ConfirmStop)
        assert not (FIXTURE / "control").exists()


@sync
async def test_stop_and_detach_are_not_offered_once_the_run_ended(tmp_path: Path) -> None:
    app = make_app(copy_until(tmp_path), live=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.shown > 0 and app.last_snapshot.header.status == "finished")
        assert app.check_action("stop", ()) is False and app.check_action("detach", ()) is False
        assert "nothing to stop" in app.reason("stop") and "q quits" in app.reason("detach")


@pytest.mark.parametrize(("key", "result"), [("d", "detached"), ("q", "quit")])
@sync
async def test_detach_and_quit_leave_the_app(mid_run: Path, key: str, result: str) -> None:
    app = live_app(mid_run)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.shown > 0)
        await pilot.press(key)
        await pilot.pause()
    assert app.return_value == result
    assert not (mid_run / "control" / "stop").exists()  # leaving never stops the run


@sync
async def test_toggle_log_pane(mid_run: Path) -> None:
    app = live_app(mid_run)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.shown > 0)
        log = app.run_screen.query_one("#log")
        assert log.display
        await pilot.press("l")
        assert not log.display
        await pilot.press("l")
        assert log.display


@sync
async def test_replay_controls() -> None:
    pb = Playback(FIXTURE, live=False, speed=1.0)
    app = CockpitApp(playback=pb, refresh_s=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.shown > 0 and pb.loaded)
        await pilot.press("space")
        await wait_for(pilot, lambda: pb.paused and app.last_snapshot.header.paused)
        step = pb.view.step
        await pilot.pause(0.3)
        assert pb.view.step == step
        await pilot.press("plus", "plus")
        await wait_for(pilot, lambda: pb.speed == 4.0)
        await pilot.press("minus")
        await wait_for(pilot, lambda: pb.speed == 2.0)
        await pilot.press("e")
        await wait_for(pilot, lambda: app.last_snapshot.header.step == 400)
        assert app.last_snapshot.header.status == "finished"
        assert "REPLAY" in screen_text(app).splitlines()[1]


@sync
async def test_live_view_pause_and_back_to_live(mid_run: Path) -> None:
    app = live_app(mid_run)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.shown > 0)
        await pilot.press("space")
        await wait_for(pilot, lambda: not app.last_snapshot.header.following)
        await pilot.press("e")
        await wait_for(pilot, lambda: app.last_snapshot.header.following)


def _has_data(app: CockpitApp, chart: str) -> bool:
    return any(np.any(~np.isnan(t.ymax)) for t in app.last_snapshot.charts[chart].traces)


@sync
async def test_live_app_follows_a_record_written_by_another_process(tmp_path: Path) -> None:
    """Another process writes the fixture's record over ~9 s, as its writers did; the app follows."""
    run = tmp_path / FIXTURE.name
    writer = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "tui_helpers.py"), str(FIXTURE), str(run), "40"]
    )
    try:
        deadline = time.monotonic() + 20
        while not (run / "run.json").exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        app = make_app(run, live=True)
        steps_seen: list[int] = []
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.shown > 0)

            def progressed() -> bool:
                steps_seen.append(app.last_snapshot.header.step)
                return app.last_snapshot.header.status == "finished"

            await wait_for(pilot, progressed, timeout=60)
            snap = app.last_snapshot
            assert snap.header.step == 400 and snap.header.max_steps == 400
            assert all(_has_data(app, c) for c in ("loss", "throughput", "gpu", "host"))
            assert any(line.startswith("step 400/") for line in snap.log_lines)
        assert writer.wait(timeout=30) == 0
        distinct = sorted(set(steps_seen))
        assert len(distinct) >= 5 and distinct[0] < 200  # it moved while the record grew
    finally:
        writer.kill()
        writer.wait()


@sync
async def test_a_live_view_says_when_the_supervisor_is_gone(tmp_path: Path) -> None:
    import json

    run = copy_until(tmp_path, MID)
    manifest = json.loads((run / "run.json").read_text())
    manifest["supervisor_pid"] = 2**22 + 4321  # no such process
    (run / "run.json").write_text(json.dumps(manifest))
    app = live_app(run)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.shown > 0 and app.last_snapshot.header.warning is not None)
        assert "supervisor lost" in app.last_snapshot.header.warning


@sync
async def test_everything_fits_an_80x24_terminal(mid_run: Path) -> None:
    app = live_app(mid_run)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.shown > 0)
        await pilot.pause()
        for selector in ("#header", "#chart-loss", "#chart-host", "#audit-box", "#log", "Footer"):
            region = app.screen.query_one(selector).region
            assert region.height > 0 and region.y >= 0 and region.bottom <= 24, (selector, region)
        charts = app.screen.query_one("#chart-loss").region
        assert charts.height >= 7  # legend, three plot rows, axis, border
