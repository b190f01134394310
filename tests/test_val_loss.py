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
from cockpit.headless import step_line
from cockpit.record import EventWriter, RunPaths, write_manifest
from cockpit.record.playback import Playback
from cockpit.record.series import RunSeries
from cockpit.record.view import RunView
from cockpit.service.diagnosis import EndFacts, diagnose

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
    assert chart.note == ""  # `v` is in the footer
    with_tenants = build_charts(pb, {"loss": 100}, val_tenants=True)["loss"]
    # `v`: the validation loss alone, its mean and each tenant's, on their own scale
    assert [t.label for t in with_tenants.traces] == ["val", *sorted(TENANTS)]
    assert with_tenants.title == "validation loss per tenant"
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
        await wait_for(pilot, lambda: len(app.last_snapshot.charts["loss"].traces) == 1 + len(TENANTS))
        await pilot.press("v")
        await wait_for(pilot, lambda: len(app.last_snapshot.charts["loss"].traces) == 3)


BEST_LOSSES = {0: 3.0, 40: 1.0, 80: 0.8, 120: 0.9}  # lowest at 80; training ends at 120


def write_best_record(run: Path, until: int = 120) -> Path:
    """A run whose validation loss is lowest before its last step: the trainer's `best_adapter` events at
    40 and 80, then its `adapter` event (step 80's, the last step's kept beside it) a second after 120;
    or the same run still training at step `until`."""
    run.mkdir(parents=True)
    write_manifest(run, {"run_id": run.name, "status": "finished", "profile_name": "tiny-cpu", "profile": {}})
    with EventWriter(RunPaths(run).events("trainer-rank0"), rank=0) as w:
        w.write("phase", t=T0, phase="train")
        w.write("train_begin", t=T0, max_steps=120, start_step=0)
        best = math.inf
        for step in range(0, until + 1):
            if step:
                w.write("step", t=T0 + step, step=step, max_steps=120, loss=round(train_loss(step), 4),
                        tokens_per_s=2800.0, step_time_s=0.9)  # fmt: skip
            if step in BEST_LOSSES:
                loss = BEST_LOSSES[step]
                w.write("val_loss", t=T0 + step + 0.5, step=step, loss=loss, tenant_loss={"a": loss})
                if step and loss < best:
                    best = loss
                    w.write("best_adapter", t=T0 + step + 0.6, step=step, val_loss=loss,
                            path=str(run / "adapter-best" / f"step-{step:06d}"), save_s=0.1)  # fmt: skip
        if until < 120:
            return run
        w.write("phase", t=T0 + 121, phase="save")
        w.write("adapter", t=T0 + 122, path=str(run / "adapter"), step=80, val_loss=0.8, last_step=120,
                last_path=str(run / "adapter-last"))  # fmt: skip
        w.write("trainer_end", t=T0 + 123, outcome="finished", step=120)
    return run


def _at(run: Path, now: float) -> Playback:
    pb = Playback(run, live=True, now=lambda: now)
    pb.load()
    pb.tick()
    return pb


def test_the_best_adapter_is_folded_and_shown_while_training_and_at_the_end(tmp_path: Path) -> None:
    """Mid-run (step 100): the best so far is step 80's, beside the last validation; once saved, the
    run's adapter is step 80's and the last step's is said to be beside it: in the step line, the plain
    log, the closing summary and the loss chart's note."""
    from cockpit.headless import HeadlessViewer, PlainLog

    mid = _at(write_best_record(tmp_path / "mid", until=100), T0 + 100.9)
    assert (mid.view.best_step, mid.view.best_val_loss, mid.view.adapter) == (80, 0.8, None)
    assert mid.view.adapter_words() == "best so far: step 80's (validation loss 0.8000, the lowest)"
    note = build_charts(mid, {"loss": 100})["loss"].note
    assert note == "best val 0.8000 at 80"

    run = write_best_record(tmp_path / "r")
    end = _at(run, T0 + 200)
    view = end.view
    assert view.adapter is not None and (view.best_step, view.val_step) == (80, 120)
    assert "  val 0.9000 (best 0.8000 at 80)  " in step_line(view)
    words = (
        f"step 80's (validation loss 0.8000, the lowest; the last step's, 120, is in {run / 'adapter-last'})"
    )
    assert view.adapter_words() == words
    lines = PlainLog().update(view, now=T0 + 200)
    assert any(line.endswith(f"adapter: {words}") for line in lines), lines
    assert not any("adapter:" in line for line in PlainLog().update(mid.view, now=T0 + 100.9))
    assert build_charts(end, {"loss": 100})["loss"].note == "adapter: val 0.8000 at 80 of 120"
    with_tenants = build_charts(end, {"loss": 100}, val_tenants=True)["loss"]
    assert with_tenants.note == "adapter: val 0.8000 at 80 of 120", "shown with each tenant's curve (`v`) too"
    viewer = HeadlessViewer(run, alive=lambda: False)
    viewer.view = view
    assert f"adapter: {words}" in viewer.summary()


def test_without_a_best_adapter_nothing_is_said(record: Path) -> None:
    """A record with validation but no `best_adapter` or validated `adapter` (an older run): as before."""
    view = _playback(record).view
    assert view.best_step is None and view.adapter_words() is None
    assert "best" not in step_line(view)
