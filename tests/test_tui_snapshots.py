"""Snapshots of each screen at 120×40, built from the recorded fixture through the CLI's factory.

Update after an intended change with `pytest tests/test_tui_snapshots.py --snapshot-update`, and look
at the report it writes before committing the new pictures.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from tui_helpers import FIXTURE, add_report, copy_until, fixture_times

from cockpit.app.app import CockpitApp, make_app
from cockpit.record.playback import Playback

SIZE = (120, 40)
FIRST, LAST = fixture_times()
MID = FIRST + (LAST - FIRST) / 2


def shown(app: CockpitApp, loaded: bool = True):
    async def run_before(pilot) -> None:
        deadline = time.monotonic() + 20

        def ready() -> bool:
            snap = app.last_snapshot
            return snap is not None and (not loaded or snap.header.loading is None)

        while not ready():
            if time.monotonic() > deadline:
                raise AssertionError("the app showed no complete snapshot")
            await pilot.pause(0.05)
        seen = app.shown
        while app.shown < seen + 1:  # one more: the charts have been bucketed to their real widths
            await pilot.pause(0.05)
        await pilot.pause()

    return run_before


@pytest.fixture
def mid_run(tmp_path: Path) -> Path:
    return copy_until(tmp_path, MID)


def test_run_screen_live_mid_run(snap_compare, mid_run: Path) -> None:
    app = make_app(mid_run, live=True, now=lambda: MID + 1.0)
    assert snap_compare(app, terminal_size=SIZE, run_before=shown(app))


def test_run_screen_in_an_80x24_terminal(snap_compare, mid_run: Path) -> None:
    app = make_app(mid_run, live=True, now=lambda: MID + 1.0)
    assert snap_compare(app, terminal_size=(80, 24), run_before=shown(app))


def test_run_screen_live_finished(snap_compare, tmp_path: Path) -> None:
    app = make_app(copy_until(tmp_path), live=True, now=lambda: LAST + 60.0)
    assert snap_compare(app, terminal_size=SIZE, run_before=shown(app))


def test_replay_screen_paused_mid_run(snap_compare) -> None:
    pb = Playback(FIXTURE, live=False, speed=8.0, now=lambda: 0.0)
    pb.load()
    pb.command("seek", MID)
    pb.command("pause")
    app = CockpitApp(playback=pb)
    assert snap_compare(app, terminal_size=SIZE, run_before=shown(app))


def test_confirm_stop_dialog(snap_compare, mid_run: Path) -> None:
    app = make_app(mid_run, live=True, now=lambda: MID + 1.0)
    before = shown(app)

    async def run_before(pilot) -> None:
        await before(pilot)
        await pilot.press("s")
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_log_pane_hidden(snap_compare, mid_run: Path) -> None:
    app = make_app(mid_run, live=True, now=lambda: MID + 1.0)
    before = shown(app)

    async def run_before(pilot) -> None:
        await before(pilot)
        await pilot.press("l")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_report_screen(snap_compare, tmp_path: Path) -> None:
    """The finished run with the fixture's report.json, `r` pressed: table, delta bars, serving cost."""
    run = copy_until(tmp_path)
    add_report(run)
    app = make_app(run, live=True, now=lambda: LAST + 60.0)
    before = shown(app)

    async def run_before(pilot) -> None:
        await before(pilot)
        deadline = time.monotonic() + 20
        while app.report is None:
            if time.monotonic() > deadline:
                raise AssertionError("the report was not read")
            await pilot.pause(0.05)
        await pilot.press("r")
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
