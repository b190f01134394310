"""The prediction screen (p) over a real rehearsal record, and the prediction rendered as text."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console
from tui_helpers import sync, wait_for

from cockpit.app.app import make_app
from cockpit.app.screens.prediction import PredictionScreen
from cockpit.app.screens.run import RunScreen
from cockpit.rehearse.render import render

RECORD = Path(__file__).parent / "fixtures" / "records" / "20261201-023803-tiny-cpu-729e"


@pytest.fixture
def rehearsal(tmp_path: Path) -> Path:
    return Path(shutil.copytree(RECORD, tmp_path / RECORD.name))


def test_the_prediction_renders_measured_predicted_and_assumptions() -> None:
    data = json.loads((RECORD / "rehearsal.json").read_text())
    console = Console(file=io.StringIO(), width=160, color_system=None)
    console.print(render(data))
    text = console.file.getvalue()
    assert "measured (random weights" in text and f"predicted at {data['layers']} layers" in text
    assert "host-to-device" in text and "wall clock on the profile's machine" in text
    assert data["summary"] in text


@sync
async def test_p_opens_the_prediction_once_the_rehearsal_has_one(rehearsal: Path) -> None:
    app = make_app(rehearsal, live=True, now=lambda: 2e9)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.prediction is not None)
        assert isinstance(app.screen, RunScreen)  # offered, not shown
        await pilot.press("p")
        await wait_for(pilot, lambda: isinstance(app.screen, PredictionScreen))
        assert app.screen.data["summary"].startswith("predicted on")
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen))
