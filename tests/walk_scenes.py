"""The app at 80x24 as the walk through it found it (issue 27, items 28-35), one scene an item: the same
scenes are the snapshot tests' (`tests/test_tui_screens.py`) and the pictures of `docs/app.md`
(`screenshots/make_screenshots.py`). Each is built from a synthetic record (`synthetic_run.py`) or the
recorded fixtures, so every picture is the same on every machine.

    app, before = build("run-val-tenants-80x24", tmp_path)
    ... app.run_test(size=SMALL) ... await before(pilot)
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from synthetic_run import T0, SyntheticRun, make_run
from tui_helpers import settle, wait_for

from cockpit.app.app import CockpitApp, make_app
from cockpit.app.compare import CompareApp, make_compare_app
from cockpit.app.screens.confirm import ConfirmStop
from cockpit.record.playback import Playback

SMALL = (80, 24)
RECORDS = Path(__file__).resolve().parent / "fixtures" / "records"
# Two tiny-cpu runs, 150 steps, learning rates 5e-3 and 1e-3, each evaluated.
LR_RUNS = [RECORDS / "20261201-071535-tiny-cpu-1e29", RECORDS / "20261201-071844-tiny-cpu-5986"]

Before = Callable[[Any], Awaitable[None]]


def live(run: SyntheticRun) -> CockpitApp:
    return make_app(run.root, live=True, now=lambda: run.now + 0.5)


def late_warning_run(parent: Path) -> SyntheticRun:
    """A run that prints a warning 30 s in, long before its first step."""
    run = SyntheticRun(parent).start().setup()
    run.wait(22.0)
    run.say("WARNING late: printed 30 s in")
    run.wait(5.0)
    run.load(4).begin_training().train(3)
    return run


def resumed_run(parent: Path) -> SyntheticRun:
    """Stopped at step 121 a minute and three quarters in; resumed ten minutes later; 40 more steps."""
    run = make_run(parent, "stopped")
    run.resume(after_s=600.0).setup()
    run.load(4).begin_training().train(40)
    return run


def still_running(parent: Path, src: Path = LR_RUNS[1]) -> Path:
    """A copy of a recorded run whose record says it is still running."""
    dst = parent / src.name
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "run.json").read_text())
    manifest.update(status="running", ended_at=None, exit_code=None, diagnosis=None)
    (dst / "run.json").write_text(json.dumps(manifest, indent=2))
    return dst


def shown(app: CockpitApp, keys: tuple[str, ...] = ()) -> Before:
    """Until the app shows a settled snapshot; then `keys`, and until a snapshot after them is shown."""

    async def before(pilot: Any) -> None:
        await settle(pilot, app)
        if keys:
            await pilot.press(*keys)
            seen = app.shown
            await wait_for(pilot, lambda: app.shown > seen + 1)
            app.clear_notifications()  # what the key said would hide a corner of the picture
            await pilot.pause(0.1)

    return before


def stop_confirmed(app: CockpitApp) -> Before:
    """`s`, then `y`: the request written, the header as it is the moment after."""

    async def before(pilot: Any) -> None:
        await settle(pilot, app)
        await pilot.press("s")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmStop))
        await pilot.press("y")
        await wait_for(pilot, lambda: app.last_snapshot is not None and app.last_snapshot.header.stopping)
        app.clear_notifications()  # the toast would hide the header's corner of the picture
        seen = app.shown
        await wait_for(pilot, lambda: app.shown > seen)
        await pilot.pause(0.1)

    return before


def compared(app: CompareApp, keys: tuple[str, ...] = ()) -> Before:
    async def before(pilot: Any) -> None:
        await wait_for(
            pilot,
            lambda: app.comparison is not None and all(c.data for c in app.screen.query("CompareChart")),
        )
        if keys:
            await pilot.press(*keys)
        await pilot.pause(0.2)

    return before


def build(name: str, tmp: Path) -> tuple[Any, Before]:
    """Scene `name` of SCENES over records made under `tmp`: the app and what to do before the picture."""
    tmp.mkdir(parents=True, exist_ok=True)
    if name in ("run-val-80x24", "run-val-tenants-80x24"):  # 28
        app = live(make_run(tmp, "validated"))
        return app, shown(app, ("v",) if "tenants" in name else ())
    if name == "replay-log-clock-80x24":  # 30: paused 10 s in, the warning of 0:30 not yet printed
        run = late_warning_run(tmp)
        pb = Playback(run.root, live=False, now=lambda: 0.0)
        pb.load()
        pb.command("seek", T0 + 10.0)
        pb.command("pause")
        app = CockpitApp(playback=pb)
        return app, shown(app)
    if name == "run-stopping-80x24":  # 31
        app = live(make_run(tmp, "training"))
        return app, stop_confirmed(app)
    if name in ("compare-80x24", "compare-f1-80x24"):  # 33
        app = make_compare_app([LR_RUNS[0], still_running(tmp)])
        return app, compared(app, ("f",) if "f1" in name else ())
    if name == "run-resumed-80x24":  # 35: the gap left out, a mark where it resumed
        app = live(resumed_run(tmp))
        return app, shown(app)
    if name == "run-finished-80x24":  # 35: the diagnosis on one line
        app = live(make_run(tmp, "report"))
        return app, shown(app)
    raise KeyError(name)


SCENES = (
    "run-val-80x24",
    "run-val-tenants-80x24",
    "replay-log-clock-80x24",
    "run-stopping-80x24",
    "compare-80x24",
    "compare-f1-80x24",
    "run-resumed-80x24",
    "run-finished-80x24",
)
