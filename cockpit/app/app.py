"""The cockpit app: a Playback driven by one worker thread, shown by one screen.

The follow worker (`@work(thread=True, exclusive=True)`) owns the Playback: it reads the record,
moves the clock, folds, builds a frozen `Snapshot` and posts it; it never touches a widget. The UI
thread only shows snapshots and turns keys into commands (queued on the Playback, or written as a
request file through `cockpit.record.control` by another worker). Live and replay are the same app: only
the Playback's clock differs.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from textual import work
from textual.app import App
from textual.binding import BindingType
from textual.screen import ModalScreen
from textual.worker import get_current_worker

from cockpit.app.charts import GPU_AXES
from cockpit.app.keys import KeyState, bindings, can, reason
from cockpit.app.messages import PredictionLoaded, ReportLoaded, SnapshotReady, StopSent
from cockpit.app.model import Snapshot, build_snapshot
from cockpit.app.screens.confirm import ConfirmStop
from cockpit.app.screens.prediction import PredictionScreen
from cockpit.app.screens.report import ReportScreen
from cockpit.app.screens.run import RunScreen
from cockpit.plan.store import load_plan
from cockpit.record.playback import Playback
from cockpit.report import Report, load_report

LIVE_REFRESH_S = 0.5
REPLAY_REFRESH_S = 0.25
OWNER_CHECK_S = 5.0  # how often a live view checks that the run's supervisor is still there
LOAD_SLICE_S = 0.2  # while reading a long history: show progress this often
TICK_BUDGET_S = 0.03  # a tick folds at most this long before the state is shown (a jump to the end)
CATCH_UP_FRAME_S = 0.25  # while a jump folds on, a frame of its progress this often


class CockpitApp(App[str]):
    """Watch one run: live (`cockpit run`, `cockpit attach`) or from its record (`cockpit replay`)."""

    CSS_PATH = "cockpit.tcss"
    TITLE = "cockpit"
    ENABLE_COMMAND_PALETTE = False  # its footer entry took the room of the cockpit's own keys at 80 columns
    BINDINGS: ClassVar[list[BindingType]] = bindings()

    def __init__(
        self,
        run_dir: Path | None = None,
        *,
        live: bool = True,
        speed: float = 1.0,
        now: Callable[[], float] = time.time,
        refresh_s: float | None = None,
        playback: Playback | None = None,
    ) -> None:
        super().__init__()
        if playback is None:
            if run_dir is None:
                raise ValueError("a run directory or a Playback is needed")
            playback = Playback(run_dir, live=live, speed=speed, now=now)
        self.playback = playback
        self.run_dir = playback.paths.root
        self.plan = load_plan(self.run_dir)  # the audit panel checks the trainer's audit against it
        self.refresh_s = refresh_s or (LIVE_REFRESH_S if playback.live else REPLAY_REFRESH_S)
        self.last_snapshot: Snapshot | None = None
        self.shown = 0  # snapshots shown so far
        self.timings: deque[tuple[float, float, float]] = deque(maxlen=200)  # ms: tick, build, show
        self._dots: dict[str, int] = {}
        self._wake = threading.Event()
        self._in_flight = threading.Event()
        self._status: str | None = None
        self.run_screen = RunScreen()
        self._lost: str | None = None  # set by the worker when a live run's supervisor is gone
        self._owner_checked = -math.inf
        self.report: Report | None = None  # the evaluation report, once due and read
        self._report_state: str | None = None  # None, "reading", "read", "failed"
        self.prediction: dict[str, Any] | None = None  # a rehearsal's rehearsal.json, once due and read
        self._prediction_state: str | None = None
        self.val_tenants = False  # the loss chart shows each tenant's validation loss too (`v`)
        self._stop_sent = False  # this app asked for a stop: STOPPING at once, before the record says so
        self.gpu_axis = "total"  # the GPU chart's axis: the GPU's total or the run's range (`g`)
        # Keys that changed what is shown count up `_asks` (UI thread); the worker notes what it has seen, and
        # `_owed` when a snapshot it owes could not be posted yet: the UI wakes it once the screen is free.
        self._asks = 0
        self._asks_seen = 0
        self._owed = False
        self._posted_t = -math.inf  # when the last snapshot was built (perf_counter)
        self._key_state: tuple[object, ...] | None = None  # what the footer's keys depend on, last seen

    # --- start -----------------------------------------------------------------------------------
    def on_mount(self) -> None:
        self.push_screen(self.run_screen)
        self.follow()  # at once: the first snapshot need not wait for the first layout
        self.call_after_refresh(self._update_dots)

    def _update_dots(self) -> None:
        if self.run_screen.ready:
            self._dots = self.run_screen.dot_columns() or self._dots

    def on_resize(self) -> None:
        self.call_after_refresh(self._update_dots)
        self._wake.set()

    # --- the worker --------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="follow", name="follow")
    def follow(self) -> None:
        """Read, tick, snapshot, post; until the app closes. Never touches a widget."""
        worker = get_current_worker()
        pb = self.playback
        preview: Snapshot | None = None
        if not pb.loaded and pb.live and pb.needs_preview():
            # A big record, live: a sampled first frame now, the exact one once every line is read.
            pb.preview()
            preview = build_snapshot(pb, dict(self._dots), plan=self.plan, gpu_axis=self.gpu_axis)
            self._in_flight.set()
            self.post_message(SnapshotReady(preview))
        while not worker.is_cancelled:
            if not pb.loaded:
                # Read for a while, then show what is complete so far (a replay starts playing).
                deadline = time.perf_counter() + LOAD_SLICE_S
                while pb.load_step() and time.perf_counter() < deadline:
                    pass
                if pb.loaded:
                    # The history is read once and lives as long as the app: keep the garbage
                    # collector from walking its objects again and again (a full pass stalls a refresh).
                    gc.collect()
                    gc.freeze()
                elif pb.previewing and preview is not None:
                    # The preview stays on screen until the exact fold is complete; only its progress moves.
                    if not self._in_flight.is_set():
                        header = dataclasses.replace(preview.header, loading=pb.load_fraction)
                        self._in_flight.set()
                        self.post_message(SnapshotReady(dataclasses.replace(preview, header=header)))
                    continue
            t0 = time.perf_counter()
            was_catching_up = pb.catching_up
            # Read before the tick: a key pressed from here on is seen on the next round, never lost.
            asks = self._asks
            asked = asks != self._asks_seen or self._owed
            self._asks_seen = asks
            pb.tick(budget_s=TICK_BUDGET_S if pb.loaded else None)
            self._check_owner()
            if was_catching_up and pb.catching_up and not asked and t0 - self._posted_t < CATCH_UP_FRAME_S:
                continue  # folding on: a frame of the way now and then, not one a slice
            # What a key asked for, a catch-up's first frame or its last: shown as soon as the screen is free.
            urgent = asked or was_catching_up or pb.catching_up
            self._post(tick_ms=(time.perf_counter() - t0) * 1000, urgent=urgent)
            if pb.loaded and not pb.catching_up:  # catching up (a jump to the end): the next slice now
                self._wake.wait(self.refresh_s)
                self._wake.clear()

    def _check_owner(self) -> None:
        """Live, every few seconds: is the supervisor still there? (Read only: nothing is written.)"""
        pb = self.playback
        now = time.monotonic()
        if not pb.live or now - self._owner_checked < OWNER_CHECK_S or pb.status() != "running":
            return
        self._owner_checked = now
        from cockpit.service.liveness import supervisor_alive

        alive = supervisor_alive(pb.manifest, pb.paths.root) or not pb.manifest.get("supervisor_pid")
        self._lost = None if alive else "supervisor lost: nothing will diagnose this run (see `cockpit ls`)"

    def _post(self, force: bool = False, tick_ms: float = 0.0, urgent: bool = False) -> None:
        # Hold back while the previous snapshot is still waiting to be shown: the UI thread is busy. An
        # `urgent` one (a key's) is owed, set before looking: the UI wakes the worker once it is shown.
        self._owed = urgent
        if self._in_flight.is_set() and not force:
            return
        self._owed = False
        self._posted_t = time.perf_counter()
        snapshot = build_snapshot(
            self.playback,
            dict(self._dots),
            tick_ms=tick_ms,
            lost=self._lost,
            plan=self.plan,
            gpu_axis=self.gpu_axis,
            val_tenants=self.val_tenants,
            stop_sent=self._stop_sent,
        )
        self._in_flight.set()
        self.post_message(SnapshotReady(snapshot))

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        t0 = time.perf_counter()
        snapshot = message.snapshot
        self.last_snapshot = snapshot
        # Shown while the run screen is on screen, under a dialog too; under the report or the prediction
        # it is not drawn: it shows the last snapshot when it comes back (`RunScreen.on_screen_resume`).
        if self.run_screen.ready and not isinstance(self.screen, ReportScreen | PredictionScreen):
            self.run_screen.show(snapshot)
        self.shown += 1
        self.timings.append((snapshot.tick_ms, snapshot.built_ms, (time.perf_counter() - t0) * 1000))
        self._in_flight.clear()
        if self._owed or self._asks != self._asks_seen:
            self._wake.set()
        h = snapshot.header
        self._status = h.status
        if h.ended:
            self._stop_sent = False  # the stop is done (or the run ended anyway): a resume starts afresh
        key_state = (
            h.status,
            h.stop_requested,
            h.following,
            h.paused,
            h.speed,
            snapshot.has_gpus,
            snapshot.has_val_tenants,
        )
        if key_state != self._key_state:
            self._key_state = key_state
            self.refresh_bindings()
        if snapshot.report_due and self._report_state is None:
            self._report_state = "reading"
            self.read_report()
        if snapshot.prediction_due and self._prediction_state is None:
            self._prediction_state = "reading"
            self.read_prediction()
        self._update_dots()

    # --- the report ----------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="report", name="read-report")
    def read_report(self) -> None:
        """Read report.json (or build the report from the predictions, in memory); never touches a widget."""
        try:
            report = load_report(self.run_dir)
        except Exception as exc:  # a broken or half-written file: say so, keep watching the run
            self.post_message(ReportLoaded(None, f"could not read the evaluation report: {exc}"))
            return
        self.post_message(ReportLoaded(report, None if report else "the run has no evaluation report"))

    def on_report_loaded(self, message: ReportLoaded) -> None:
        if message.report is None:
            self._report_state = "failed"
            self.notify(message.error or "no report", severity="warning")
            return
        self.report = message.report
        self._report_state = "read"
        self.refresh_bindings()
        # Offered, not shown: whoever is looking at the charts stays there until they press the key.
        self.notify("The evaluation report is ready: press [b]r[/b] to see it.", title="report", timeout=15)

    # --- a rehearsal's prediction ------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="prediction", name="read-prediction")
    def read_prediction(self) -> None:
        """Read rehearsal.json; never touches a widget."""
        from cockpit.rehearse.run import read_forecast

        data = read_forecast(self.run_dir)
        self.post_message(PredictionLoaded(data, None if data else "could not read rehearsal.json"))

    def on_prediction_loaded(self, message: PredictionLoaded) -> None:
        if message.data is None:
            self._prediction_state = "failed"
            self.notify(message.error or "no prediction", severity="warning")
            return
        self.prediction, self._prediction_state = message.data, "read"
        self.refresh_bindings()
        self.notify(
            "The rehearsal's prediction is ready: press [b]p[/b] to see it.", title="rehearsal", timeout=15
        )

    def action_prediction(self) -> None:
        """Open the prediction over the run screen (its own `p` and `escape` close it)."""
        if self.prediction is None or self.screen is not self.run_screen:
            return
        self.clear_notifications()
        run_id = self.last_snapshot.header.run_id if self.last_snapshot else self.run_dir.name
        self.push_screen(PredictionScreen(self.prediction, run_id))

    # --- commands ----------------------------------------------------------------------------------
    def _on_run_screen(self) -> bool:
        return self.screen is self.run_screen

    def key_state(self) -> KeyState:
        """What the keys depend on, as last shown (the Playback's own state belongs to the worker)."""
        snapshot, pb = self.last_snapshot, self.playback
        h = snapshot.header if snapshot else None
        return KeyState(
            live=pb.live,
            status=self._status or "running",
            on_run=self._on_run_screen(),
            following=h.following if h else pb.follow,
            paused=h.paused if h else pb.paused,
            speed=h.speed if h else pb.speed,
            stop_requested=self._stop_sent or (h is not None and h.stop_requested),
            has_report=self.report is not None,
            report_state=self._report_state,
            has_prediction=self.prediction is not None,
            has_gpus=snapshot is not None and snapshot.has_gpus,
            has_val_tenants=snapshot is not None and snapshot.has_val_tenants,
        )

    def can(self, action: str) -> bool:
        """Whether the key for `action` acts now (the footer shows it only then)."""
        return can(action, self.key_state())

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.can(action)

    def reason(self, action: str) -> str:
        """Why the key for `action` does nothing now (said when it is pressed)."""
        return reason(action, self.key_state())

    def action_why_not(self, action: str) -> None:
        if isinstance(self.screen, ModalScreen):
            return  # a dialog is asking: its own keys answer
        self.notify(self.reason(action), title="nothing to do", severity="warning", timeout=4)

    def action_stop(self) -> None:
        if not self.key_state().active:
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.send_stop()

        if not self.is_screen_installed("confirm-stop"):  # built once: asking again costs no compose
            self.install_screen(ConfirmStop(self.run_dir.name), name="confirm-stop")
        self.push_screen("confirm-stop", answered)

    @work(thread=True, exclusive=True, group="control", name="send-stop")
    def send_stop(self) -> None:
        """Write the stop request (a file in the run's control folder)."""
        from cockpit.record.control import request_stop

        try:
            first = request_stop(self.run_dir)
        except OSError as exc:
            self.post_message(StopSent(False, f"could not ask for a stop: {exc}"))
            return
        detail = (
            "stop requested: checkpoint at the next step, then exit"
            if first
            else "a stop was already requested"
        )
        self.post_message(StopSent(True, detail))

    def on_stop_sent(self, message: StopSent) -> None:
        self.notify(message.detail, severity="information" if message.ok else "error")
        if message.ok:  # the request is written: STOPPING now, not when the supervisor has read it
            self._stop_sent = True
            self.refresh_bindings()
        self._ask_snapshot()

    def action_report(self) -> None:
        """Open the report over the run screen (its own `r` and `escape` close it)."""
        if self.report is None or self.screen is not self.run_screen:
            return
        self.clear_notifications()  # the offer is taken
        if not self.is_screen_installed("report"):  # built once, kept: it opens again at once, on its metric
            run_id = self.last_snapshot.header.run_id if self.last_snapshot else self.run_dir.name
            self.install_screen(ReportScreen(self.report, run_id), name="report")
        self.push_screen("report")

    def action_detach(self) -> None:
        self.exit("detached")

    async def action_quit(self) -> None:
        self.exit("quit")

    def action_toggle_log(self) -> None:
        self.run_screen.query_one("#log").toggle_class("-hidden")

    def _ask_snapshot(self) -> None:
        """A key changed what is shown: a new snapshot now, not at the next refresh."""
        self._asks += 1
        self._wake.set()

    def _command(self, name: str, *args: Any) -> None:
        self.playback.command(name, *args)
        self._ask_snapshot()

    def action_pause(self) -> None:
        self._command("toggle_pause")

    def action_play(self) -> None:
        self._command("toggle_pause")

    def action_faster(self) -> None:
        self._command("faster")

    def action_slower(self) -> None:
        self._command("slower")

    def action_jump_end(self) -> None:
        self._command("end")

    def action_toggle_val_tenants(self) -> None:
        """The loss chart shows the validation loss of each tenant, on its own scale (or training's)."""
        self.val_tenants = not self.val_tenants
        self.run_screen.set_class(self.val_tenants, "-val-tenants")
        said = (
            "the loss chart shows each tenant's validation loss (v: back to training)"
            if self.val_tenants
            else "the loss chart shows training and validation loss (v: each tenant's)"
        )
        self.notify(said, title="loss chart", timeout=3)
        self._ask_snapshot()

    def action_gpu_axis(self) -> None:
        """Switch the GPU chart's axis between the GPU's total memory and the run's own range."""
        self.gpu_axis = GPU_AXES[(GPU_AXES.index(self.gpu_axis) + 1) % len(GPU_AXES)]
        self._ask_snapshot()

    def on_unmount(self) -> None:
        self._wake.set()


def make_app(
    run_dir: Path, *, live: bool, speed: float = 1.0, now: Callable[[], float] = time.time
) -> CockpitApp:
    """The app as the CLI builds it (tests and screenshots build it the same way)."""
    return CockpitApp(run_dir, live=live, speed=speed, now=now)


def run_app(run_dir: Path, *, live: bool, speed: float = 1.0) -> str:
    """Open the app on a run; returns how it was left (`detached`, `quit`)."""
    result = make_app(run_dir, live=live, speed=speed).run()
    return result or "quit"
