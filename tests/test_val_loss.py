"""Validation loss in the record: folded into curves and state, drawn beside the training loss, in the
diagnosis when early stopping ended the run. The record is synthetic, written with the record writer."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from textual.app import App, ComposeResult
from tui_helpers import sync, wait_for

from cockpit.app.app import make_app
from cockpit.app.model import build_charts
from cockpit.app.widgets.chart import BrailleChart
from cockpit.diagnosis import EndFacts, diagnose
from cockpit.headless import step_line
from cockpit.record import EventWriter, RunPaths, write_manifest
from cockpit.record.playback import Playback
from cockpit.record.series import RunSeries
from cockpit.record.view import RunView

T0 = 1_000_000.0
STEPS = 320
EVERY = 40
TENANTS = ("northwind", "helix", "ledger", "lexis", "orbit")


def train_loss(step: int) -> float:
    return 0.15 + 5.0 * math.exp(-step / 45) + 0.08 * math.sin(step * 1.7)


def val_loss(step: int, tenant: int = -1) -> float:
    base = 0.35 + 5.2 * math.exp(-step / 55)
    return base if tenant < 0 else base * (0.8 + 0.1 * tenant)


def write_record(run: Path, early_stop: bool = False) -> Path:
    """A finished tiny-like run: a step a second, a validation every 40 steps from step 0."""
    run.mkdir(parents=True)
    write_manifest(run, {"run_id": run.name, "status": "finished", "profile_name": "tiny-cpu", "profile": {}})
    paths = RunPaths(run)
    with EventWriter(paths.events("trainer-rank0"), rank=0) as w:
        w.write("phase", t=T0, phase="train")
        w.write("train_begin", t=T0, max_steps=STEPS, start_step=0)
        for step in range(0, STEPS + 1):
            t = T0 + step
            if step % EVERY == 0:
                tenants = {name: round(val_loss(step, i), 5) for i, name in enumerate(TENANTS)}
                mean = round(sum(tenants.values()) / 5, 5)
                w.write("val_loss", t=t + 0.5, step=step, loss=mean, tenant_loss=tenants, examples=30,
                        target_tokens=750, eval_s=0.3, split="eval")  # fmt: skip
            if step:
                w.write("step", t=t, step=step, max_steps=STEPS, loss=round(train_loss(step), 4),
                        tokens_per_s=2800.0, step_time_s=0.9)  # fmt: skip
        if early_stop:
            w.write("early_stop", t=T0 + STEPS + 1, step=STEPS, best_step=280, best_loss=0.4, patience=1,
                    min_delta=0.01, reason="validation loss 0.41 has not improved (patience 1)")  # fmt: skip
        w.write("trainer_end", t=T0 + STEPS + 2, outcome="finished", step=STEPS)
    return run


@pytest.fixture
def record(tmp_path: Path) -> Path:
    return write_record(tmp_path / "20261201-000000-tiny-cpu-val1")


def _playback(run: Path) -> Playback:
    pb = Playback(run, live=True, now=lambda: T0 + STEPS + 60)
    pb.load()
    pb.tick()
    return pb


def test_val_loss_events_fold_into_curves_and_state(record: Path) -> None:
    pb = _playback(record)
    s: RunSeries = pb.series
    assert len(s.val_loss) == STEPS // EVERY + 1
    assert s.val_loss.y.tolist() == pytest.approx([val_loss(k * EVERY) for k in range(9)], rel=1e-3)
    assert sorted(s.val_tenant_loss) == sorted(TENANTS)
    assert s.val_tenant_loss["lexis"].last == pytest.approx(val_loss(STEPS, 3), rel=1e-4)
    view: RunView = pb.view
    assert (view.val_step, view.val_loss) == (STEPS, pytest.approx(val_loss(STEPS), rel=1e-3))
    assert "  val 0." in step_line(view)


def test_the_loss_chart_has_validation_beside_training(record: Path) -> None:
    pb = _playback(record)
    chart = build_charts(pb, {"loss": 100})["loss"]
    assert [t.label for t in chart.traces] == ["loss", "smoothed", "val"]
    assert chart.note == "v: validation loss per tenant"
    with_tenants = build_charts(pb, {"loss": 100}, val_tenants=True)["loss"]
    assert [t.label for t in with_tenants.traces][3:] == [f"val {t}" for t in sorted(TENANTS)]
    assert with_tenants.y_hi >= max(val_loss(0, i) for i in range(5))


def test_the_diagnosis_says_why_the_run_stopped_early(tmp_path: Path) -> None:
    run = write_record(tmp_path / "r", early_stop=True)
    view = _playback(run).view
    assert view.early_stop is not None
    status, words = diagnose(EndFacts(0, "", trainer_outcome="finished", last_step=STEPS,
                                      early_stop=view.early_stop))  # fmt: skip
    assert status == "finished"
    assert (
        words
        == f"finished at step {STEPS}: stopped early, validation loss 0.41 has not improved (patience 1)"
    )
    assert diagnose(EndFacts(0, "", trainer_outcome="finished", last_step=STEPS)) == (
        "finished", f"finished at step {STEPS}",
    )  # fmt: skip


class LossChartApp(App[None]):
    """The run screen's loss chart alone, fed the same chart data the app builds."""

    def __init__(self, pb: Playback, val_tenants: bool) -> None:
        super().__init__()
        self.pb, self.val_tenants, self.filled = pb, val_tenants, False

    def compose(self) -> ComposeResult:
        yield BrailleChart("loss", id="chart")

    def on_mount(self) -> None:
        self.call_after_refresh(self.fill)

    def fill(self) -> None:
        chart = self.query_one(BrailleChart)
        chart.set_data(
            build_charts(self.pb, {"loss": chart.dot_columns}, val_tenants=self.val_tenants)["loss"]
        )
        self.filled = True


@pytest.mark.parametrize("val_tenants", [False, True], ids=["mean", "per-tenant"])
def test_loss_chart_snapshot(snap_compare, record: Path, val_tenants: bool) -> None:
    app = LossChartApp(_playback(record), val_tenants)

    async def run_before(pilot) -> None:
        while not app.filled:
            await pilot.pause(0.05)
        await pilot.pause()

    assert snap_compare(app, terminal_size=(90, 22), run_before=run_before)


@sync
async def test_v_shows_each_tenants_validation_loss(record: Path) -> None:
    app = make_app(record, live=True, now=lambda: T0 + STEPS + 60)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.shown > 0 and app.last_snapshot.header.loading is None)
        assert len(app.last_snapshot.charts["loss"].traces) == 3
        await pilot.press("v")
        await wait_for(pilot, lambda: len(app.last_snapshot.charts["loss"].traces) == 3 + len(TENANTS))
        await pilot.press("v")
        await wait_for(pilot, lambda: len(app.last_snapshot.charts["loss"].traces) == 3)
