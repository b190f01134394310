"""One reader for every viewer: a run record, a clock, and the fold of everything up to the clock.

Live is replay with the clock at now. `Playback(live=True)` follows the record as it grows (the
clock is pinned to the end); `Playback(live=False)` starts the clock at the record's first event
and moves it at `speed` times real time, on the record's own timestamps. Pause, faster, slower and
jump-to-end are the same calls in both. Nothing here imports Textual: the TUI drives a Playback
from a worker thread and sends it commands through `command`, which is thread-safe.
"""

from __future__ import annotations

import json
import math
import queue
import re
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cockpit.record.bulk import Block, FileChunk, merge_blocks, read_file, sample_record
from cockpit.record.fold import split
from cockpit.record.format import TERMINAL_STATUSES, RunPaths
from cockpit.record.reader import Event, RunReader
from cockpit.record.series import RunSeries
from cockpit.record.view import RunView

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)
PREVIEW_MIN_BYTES = 8 * 2**20  # records smaller than this are read whole before the first frame
PREVIEW_SAMPLES = 400  # lines sampled across each big file for the first frame
PREVIEW_EDGE_BYTES = 32 * 1024  # read whole at each end of each file for the first frame
OUTPUT_TAIL_BYTES = 64 * 1024
SLICE_ROWS = 4096  # rows of one block folded at a time when a fold has a deadline (see `Playback.tick`)
_STEP_LINE = re.compile(rb"^step \d+/[^\n]*\n", re.MULTILINE)


@dataclass
class _Pending:
    block: Block
    pos: int = 0


class Playback:
    """The record, a clock over it, and the state (`view`, `series`) of everything up to the clock."""

    def __init__(
        self,
        run_dir: Path,
        *,
        live: bool = True,
        speed: float = 1.0,
        now: Callable[[], float] = time.time,
        capacity: int | None = None,
    ) -> None:
        self.paths = RunPaths(Path(run_dir))
        self.live = live
        self.speed = float(speed)
        self.now = now
        self.paused = False
        self.catching_up = False  # the last tick ran out of its budget with more due (see `tick`)
        self.follow = live  # the clock is pinned to the newest event
        self.view = RunView()
        self.series = RunSeries() if capacity is None else RunSeries(capacity)
        self.manifest: dict[str, Any] = {}
        self.clock: float | None = None  # record time shown (replay); None until the record has a first event
        self.loaded = False
        self.previewing = False
        self.load_fraction = 0.0
        # Lenient: a viewer counts damaged lines (`bad_lines`) and goes on; the commands that open one
        # refuse a damaged record first (`cockpit.record.check_record`), so what is counted here came later.
        self.reader = RunReader(self.paths.root, strict=False)  # new lines, once the bulk read passed them
        self._bulk_bad_lines = 0
        self._manifest_mtime: float | None = None
        self._pending: list[_Pending] = []
        self._events: deque[Event] = deque()
        self._first_t: float | None = None
        self._last_t: float | None = None
        self._wall: float | None = None
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._readers: dict[Path, Iterator[FileChunk]] | None = None  # the bulk read, while it lasts
        self._reached: dict[Path, float] = {}  # per file: the time its lines are read up to
        self._offsets: dict[Path, int] = {}
        self._lines: dict[Path, int] = {}  # per file: the line number at its offset
        self._load_total = self._load_done = 0
        self._log_scanned = 0
        self._log_first_step: int | None = None  # where the first `step N/` line starts
        self._log_offsets: list[int] = []

    # --- loading ----------------------------------------------------------------------------------
    def record_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.paths.event_files())

    def needs_preview(self) -> bool:
        """Whether the record is big enough that a sampled first frame should come before `load`."""
        return self.record_bytes() >= PREVIEW_MIN_BYTES

    def preview(self) -> None:
        """A first look at a big record in a fraction of a second: both ends of each event file read
        whole, lines sampled in between. `view` and `series` are approximate until `load` replaces them."""
        self._read_manifest()
        events = sample_record(self.paths.events_dir, PREVIEW_SAMPLES, PREVIEW_EDGE_BYTES)
        self._fold_events(events)
        if events:
            self._note_times(events[0]["t"], events[-1]["t"])
            self.clock = events[0]["t"] if not self.follow else events[-1]["t"]
        self.previewing = True

    def start_load(self) -> None:
        """Begin reading everything written so far (fast bulk path), one chunk per `load_step`.

        Files are read side by side, the one furthest behind in time first, so the record is
        complete up to `horizon` at every moment: a replay can start before the last file is read.
        """
        self._read_manifest()
        if self.previewing:  # the exact fold replaces the sampled one
            self.view, self.series = RunView(), RunSeries(self.series.capacity)
            self._first_t = self._last_t = None
            self.clock = None
        paths = self.paths.event_files()
        self._load_total = sum(p.stat().st_size for p in paths)
        self._load_done = 0
        self._readers = {p: read_file(p, strict=False) for p in paths}
        self._reached = dict.fromkeys(paths, -math.inf)
        self._offsets = dict.fromkeys(paths, 0)
        self._lines = dict.fromkeys(paths, 1)

    def load_step(self) -> bool:
        """Read one chunk; False once everything is read (then `loaded` is True)."""
        if self.loaded:
            return False
        if self._readers is None:
            self.start_load()
        assert self._readers is not None
        if self._readers:
            path = min(self._readers, key=lambda p: self._reached[p])
            chunk = next(self._readers[path], None)
            if chunk is None:
                del self._readers[path]
                self._reached[path] = math.inf
                self.reader.follow(path, self._offsets[path], self._lines[path])
            else:
                self._bulk_bad_lines += chunk.bad_lines
                self._load_done += chunk.offset - self._offsets[path]
                self._offsets[path] = chunk.offset
                self._lines[path] = chunk.next_line
                blocks = merge_blocks(chunk.blocks)
                self._add(blocks, chunk.events)
                ends = [float(b.t[-1]) for b in blocks if len(b)] + [e["t"] for e in chunk.events[-1:]]
                self._reached[path] = max([self._reached[path], *ends])
                self.load_fraction = self._load_done / self._load_total if self._load_total else 1.0
            if self.clock is None and self._first_t is not None and self.horizon > -math.inf:
                self.clock = self._first_t
            if self.follow:  # everything read is due: fold now and keep no columns around
                self._advance(math.inf)
            return True
        self.loaded = True
        self.previewing = False
        self.load_fraction = 1.0
        if self.clock is None and self._first_t is not None:
            self.clock = self._first_t
        self._wall = self.now()
        return False

    def load(self, progress: Callable[[float], None] | None = None) -> None:
        """Read everything written so far; later lines come through `poll`."""
        self.start_load()
        while self.load_step():
            if progress is not None:
                progress(self.load_fraction)

    @property
    def horizon(self) -> float:
        """Record time up to which every file has been read (infinite once loaded)."""
        if self.loaded:
            return math.inf
        return min(self._reached.values()) if self._reached else -math.inf

    def _add(self, blocks: list[Block], events: list[Event]) -> None:
        for b in blocks:
            if len(b):
                self._pending.append(_Pending(b))
                self._note_times(float(b.t[0]), float(b.t[-1]))
        if events:
            merged = sorted([*self._events, *events], key=lambda e: e["t"]) if self._events else events
            self._events = deque(merged)
            self._note_times(events[0]["t"], max(e["t"] for e in events))

    def _note_times(self, lo: float, hi: float) -> None:
        self._first_t = lo if self._first_t is None else min(self._first_t, lo)
        self._last_t = hi if self._last_t is None else max(self._last_t, hi)

    def _read_manifest(self) -> None:
        try:
            mtime = self.paths.manifest.stat().st_mtime
            if mtime != self._manifest_mtime:
                self.manifest = json.loads(self.paths.manifest.read_text(encoding="utf-8"))
                self._manifest_mtime = mtime
        except (OSError, ValueError):
            pass

    def poll(self) -> int:
        """Read the lines written since the last call (and new writers); returns how many events came."""
        self._read_manifest()
        new = self.reader.poll()
        if new:
            self._add([], new)
            if self.clock is None:
                self.clock = self._first_t
        return len(new)

    @property
    def bad_lines(self) -> int:
        """Lines that were not events, in the bulk read and since."""
        return self._bulk_bad_lines + self.reader.bad_lines

    # --- the clock --------------------------------------------------------------------------------
    def command(self, name: str, arg: Any = None) -> None:
        """Queue a control from any thread: pause, resume, toggle_pause, faster, slower, end, seek."""
        self._commands.put((name, arg))

    def _run_commands(self) -> None:
        while True:
            try:
                name, arg = self._commands.get_nowait()
            except queue.Empty:
                return
            if name in ("toggle_pause", "pause") and self.follow:
                # Pausing a live view stops its clock where it stands; `end` goes back to now.
                self.follow, self.paused, self.clock = False, True, self.view.last_t or self._last_t
            elif name in ("toggle_pause", "resume") and self.live and self.paused:
                self.follow, self.paused = True, False  # unpausing a live view goes back to now
            elif name == "toggle_pause":
                self.paused = not self.paused
            elif name == "pause":
                self.paused = True
            elif name == "resume":
                self.paused = False
            elif name == "faster":
                self.speed = next((s for s in SPEEDS if s > self.speed), self.speed)
            elif name == "slower":
                self.speed = next((s for s in reversed(SPEEDS) if s < self.speed), self.speed)
            elif name == "end":
                self.follow, self.paused = True, False
            elif name == "seek":  # forward only: the fold does not run backwards
                self.follow = False
                self.clock = max(float(arg), self.clock if self.clock is not None else -math.inf)

    def tick(self, budget_s: float | None = None) -> bool:
        """Read new lines, move the clock, fold what is due. True when the state changed.

        With `budget_s`, stop folding after about that long: the state stands at an earlier time, and
        `catching_up` says that more is due (a jump to the end of a long replay folds in slices, each
        shown, instead of going quiet for a second)."""
        self._run_commands()
        if self.loaded:  # until then the bulk reader owns the files
            self.poll()
        wall = self.now()
        if self._wall is None:
            self._wall = wall
        if self.follow:
            if self._last_t is not None:
                self.clock = self._last_t if self.clock is None else max(self.clock, self._last_t)
        elif self.clock is not None and not self.paused:
            self.clock += (wall - self._wall) * self.speed
            if not self.loaded:  # the record is read up to the horizon only: wait there
                self.clock = min(self.clock, max(self.horizon, self._first_t or -math.inf))
            elif self._last_t is not None and self.clock >= self._last_t:
                # Caught up with the record: from here on follow it (for a live run, that is live).
                self.clock, self.follow = self._last_t, True
        self._wall = wall
        deadline = None if budget_s is None else time.perf_counter() + budget_s
        return self._advance(
            math.inf if self.follow else (self.clock if self.clock is not None else -math.inf), deadline
        )

    def _due(self, until: float) -> bool:
        """Whether any pending row or event has t <= until."""
        if self._events and self._events[0]["t"] <= until:
            return True
        return any(p.pos < len(p.block) and p.block.t[p.pos] <= until for p in self._pending)

    def _advance(self, until: float, deadline: float | None = None) -> bool:
        """Fold every pending event and block row with t <= until, in time order; with a `deadline`
        (`time.perf_counter()`), in slices of at most SLICE_ROWS rows a block until it has passed."""
        until = min(until, self.horizon)
        changed = False
        events = self._events
        self.catching_up = False
        first = True
        while True:
            if deadline is not None and not first and time.perf_counter() > deadline:
                self.catching_up = self._due(until)  # each call folds one round at least: it ends
                break
            first = False
            t_next = events[0]["t"] if events and events[0]["t"] <= until else None
            limit = until if t_next is None else t_next
            side = "right" if t_next is None else "left"
            capped = False  # a block was folded only part of the way to `limit`
            for p in self._pending:
                if p.pos >= len(p.block):
                    continue
                j = int(np.searchsorted(p.block.t, limit, side=side))
                if deadline is not None and j - p.pos > SLICE_ROWS:
                    j, capped = p.pos + SLICE_ROWS, True
                if j > p.pos:
                    self._fold_block(p.block, p.pos, j)
                    p.pos = j
                    changed = True
            if capped:
                continue
            if t_next is None:
                break
            # Every due event up to the next unfolded block row (rows at an event's time come after it)
            # goes in one batch, so `split` can gather its step and telemetry events into blocks.
            rows = (float(p.block.t[p.pos]) for p in self._pending if p.pos < len(p.block))
            batch_until = min(until, min(rows, default=math.inf))  # never before t_next
            batch = [events.popleft()]
            while events and events[0]["t"] <= batch_until:
                batch.append(events.popleft())
            self._fold_events(batch)
            changed = True
        self._pending = [p for p in self._pending if p.pos < len(p.block)]
        return changed

    def _fold_block(self, block: Block, lo: int, hi: int) -> None:
        self.view.apply_block(block, lo, hi)
        self.series.apply_block(block, lo, hi)

    def _fold_events(self, events: list[Event]) -> None:
        for item in split(events):  # gathered into blocks once for both folds
            self.view.fold(item)
            self.series.fold(item)

    # --- what a viewer shows ----------------------------------------------------------------------
    @property
    def first_t(self) -> float | None:
        return self._first_t

    @property
    def last_t(self) -> float | None:
        return self._last_t

    @property
    def shown_t(self) -> float | None:
        """The record time the state stands at: the clock, or the newest folded event when following."""
        if self.follow:
            return self.view.last_t
        return self.clock

    @property
    def at_end(self) -> bool:
        return self.follow or (
            self.clock is not None and self._last_t is not None and self.clock >= self._last_t
        )

    def status(self) -> str:
        """The run's status as of the clock: from the supervisor's events, else the manifest."""
        if self.series.status is not None:
            return self.series.status
        if not self.live and not self.follow:
            return "running" if self.view.events_seen else "planned"
        return str(self.manifest.get("status", "planned"))

    def elapsed_s(self) -> float:
        """Seconds from the first event to the clock (live: to now, until the run ends), less the time
        between a stop and its resume (`RunView.pauses`)."""
        first = self._first_t
        if first is None:
            return 0.0
        if self.series.end_t is not None:
            end = self.series.end_t
        elif self.live and self.follow and self.status() not in TERMINAL_STATUSES:
            end = self.now()
        else:
            end = self.shown_t or first
        return max(0.0, end - first - self.view.paused_s(end))

    def output_tail(self, max_lines: int = 200) -> list[str]:
        """The last lines of `output.log` printed by the clock (`printed_bytes`)."""
        path = self.paths.output_log
        try:
            with open(path, "rb") as f:
                f.seek(0, 2)
                size = f.tell()
                limit = self.printed_bytes(f, size)
                f.seek(max(0, limit - OUTPUT_TAIL_BYTES))
                data = f.read(limit - max(0, limit - OUTPUT_TAIL_BYTES))
        except OSError:
            return []
        lines = data.decode("utf-8", errors="replace").replace("\r", "\n").split("\n")
        if limit > OUTPUT_TAIL_BYTES:
            lines = lines[1:]
        return [line for line in lines if line.strip()][-max_lines:]

    def printed_bytes(self, f: Any, size: int) -> int:
        """How much of `output.log` (open as `f`, `size` bytes) had been printed by the clock: all of it at
        the end; else its size at the last telemetry sample (`output_log_bytes`); in an older record
        without it, up to the step shown (`_log_offset_after`), nothing before the sampler started."""
        if self.at_end:
            return size
        if self.series.output_log_bytes is not None:
            return min(size, self.series.output_log_bytes)
        if self.series.telemetry_info is None and not self.view.step_events:
            return 0  # the sampler starts before the trainer: nothing was printed yet
        return self._log_offset_after(f, self.view.step_events, size)

    def _log_offset_after(self, f: Any, steps: int, size: int) -> int:
        """Byte offset just past the trainer's `steps`-th `step N/` line; before the first, its start.

        The log has no times: the trainer prints one such line a step, so the count of rank 0's step
        events folded so far is the clock (a resumed run prints its repeated steps again, in order).
        """
        if self._log_scanned < size:
            f.seek(self._log_scanned)
            data = f.read(size - self._log_scanned)
            cut = data.rfind(b"\n") + 1
            for m in _STEP_LINE.finditer(data, 0, cut):
                if self._log_first_step is None:
                    self._log_first_step = self._log_scanned + m.start()
                self._log_offsets.append(self._log_scanned + m.end())
            self._log_scanned += cut
        if steps == 0:
            return size if self._log_first_step is None else self._log_first_step
        return self._log_offsets[min(steps, len(self._log_offsets)) - 1] if self._log_offsets else size
