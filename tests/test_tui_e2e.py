"""End to end: the app on a real tiny run, detached mid-run; the run goes on; replay draws the same.

The one real run of the TUI tests (30 steps: about a minute on 2 CPU cores).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from cockpit.app.app import make_app
from cockpit.app.model import build_charts
from cockpit.record import load_manifest, read_events
from cockpit.record.playback import Playback
from devtools.faults import Watch, wait_end
from tests.conftest import run_cockpit

pytestmark = pytest.mark.e2e


async def watch_then_detach(run_dir: Path) -> dict:
    app = make_app(run_dir, live=True)
    seen: dict = {}
    async with app.run_test(size=(120, 40)) as pilot:
        watch = Watch(record=run_dir)
        while True:
            snap = app.last_snapshot
            if snap is not None and snap.header.step >= 3 and app.playback.series.telemetry_samples >= 3:
                break
            assert watch.idle_s() < watch.quiet_s, f"no progress for {watch.quiet_s:.0f} s before step 3"
            await pilot.pause(0.5)
        seen["step"] = snap.header.step
        seen["eta"] = snap.header.eta_s
        seen["charts"] = {
            name: any(np.any(~np.isnan(t.ymax)) for t in chart.traces) for name, chart in snap.charts.items()
        }
        await pilot.press("d")
        await pilot.pause()
    seen["result"] = app.return_value
    return seen


def test_app_follows_a_real_run_detaches_and_replay_draws_the_same(tmp_path: Path, asset_cache: Path) -> None:
    runs = tmp_path / "runs"
    # A short real run (30 steps, no evaluation): the app's part is the same at any length.
    args = [
        "run",
        "--detach",
        "--runs-dir",
        str(runs),
        "--set",
        "training.max_steps=30",
        "--set",
        "eval.enabled=false",
    ]
    started = run_cockpit(args, asset_cache)
    assert started.returncode == 0, started.stderr[-2000:]
    run_dir = Path(started.stdout.strip().splitlines()[-1])

    seen = asyncio.run(watch_then_detach(run_dir))
    assert seen["result"] == "detached" and seen["step"] >= 3 and seen["eta"] is not None
    assert seen["charts"] == {"loss": True, "throughput": True, "gpu": True, "host": True}
    assert load_manifest(run_dir)["status"] == "running"  # leaving the app left the run going

    assert wait_end(run_dir)["status"] == "finished"
    kinds = [
        json.loads(line)["kind"] for line in (run_dir / "events" / "telemetry.jsonl").read_text().splitlines()
    ]
    assert kinds[0] == "telemetry_start" and kinds.count("telemetry") >= 3 and kinds[-1] == "telemetry_end"

    live = Playback(run_dir, live=True)
    live.load()
    live.tick()
    replay = Playback(run_dir, live=False)
    replay.load()
    replay.command("end")
    replay.tick()
    steps = [e for e in read_events(run_dir, "step") if e["rank"] == 0]
    assert live.view.step == replay.view.step == steps[-1]["step"]
    dots = dict.fromkeys(("loss", "throughput", "gpu", "host"), 120)
    a, b = build_charts(live, dots), build_charts(replay, dots)
    for name in a:
        for ta, tb in zip(a[name].traces, b[name].traces, strict=True):
            np.testing.assert_array_equal(ta.ymax, tb.ymax)
