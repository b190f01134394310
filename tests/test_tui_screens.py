"""Snapshots of every moment of a run, at 80×24 (a laptop's SSH window) and 120×40, from synthetic records.

The records are written through the record's own writer at fixed times (`tests/synthetic_run.py`), so
each picture is the same on every machine and costs no training. Update after an intended change with
`pytest tests/test_tui_screens.py --snapshot-update`, and look at the pictures before committing them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from synthetic_run import make_run
from tui_helpers import settle, wait_for
from walk_scenes import SCENES, SMALL, build

from cockpit.app.app import make_app
from cockpit.report import METRICS

SIZES = {"80x24": (80, 24), "120x40": (120, 40)}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("moment", ["load", "training", "eval", "stopped"])
def test_run_screen(snap_compare, tmp_path: Path, moment: str, size: str) -> None:
    """The run screen while the model loads, in training, during the evaluation, and once stopped."""
    run = make_run(tmp_path, moment)
    app = make_app(run.root, live=True, now=lambda: run.now + 0.5)

    async def run_before(pilot) -> None:
        await settle(pilot, app)

    assert snap_compare(app, terminal_size=SIZES[size], run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("metric", METRICS)
def test_report_screen(snap_compare, tmp_path: Path, metric: str, size: str) -> None:
    """The report screen (`r`), `m` pressed until `metric` is shown: its column, its Δ, its bars."""
    run = make_run(tmp_path, "report")
    app = make_app(run.root, live=True, now=lambda: run.now + 0.5)

    async def run_before(pilot) -> None:
        await settle(pilot, app)
        await wait_for(pilot, lambda: app.report is not None)
        await pilot.press("r")
        for _ in range(METRICS.index(metric)):
            await pilot.press("m")
        await wait_for(pilot, lambda: getattr(app.screen, "metric", None) == metric)
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZES[size], run_before=run_before)


@pytest.mark.parametrize("scene", SCENES)
def test_walk_at_80x24(snap_compare, tmp_path: Path, scene: str) -> None:
    """What the walk through the app at 80x24 found wrong, each fixed (issue 27, items 28-35; see
    `tests/walk_scenes.py`): the same scenes are `docs/app.md`'s `screenshots/*-80x24.svg`."""
    app, before = build(scene, tmp_path)
    assert snap_compare(app, terminal_size=SMALL, run_before=before)
