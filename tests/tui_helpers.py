"""Helpers for the TUI tests: the recorded fixture, cut at a moment or written out again over time."""

from __future__ import annotations

import asyncio
import functools
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "records" / "20261130-053002-tiny-cpu-9d58"
# report.json of a later tiny-cpu run (same profile, evaluated): the recorded run predates evaluation.
REPORT = Path(__file__).resolve().parent / "fixtures" / "reports" / "20261130-054410-tiny-cpu-903f.json"


def fixture_times(src: Path = FIXTURE) -> tuple[float, float]:
    ts = [
        json.loads(line)["t"] for p in (src / "events").glob("*.jsonl") for line in p.read_text().splitlines()
    ]
    return min(ts), max(ts)


def _cut_log(log: str, last_step: int | None) -> str:
    """output.log up to the trainer's line for `last_step` (the log has no times: steps are its clock)."""
    if last_step is None:
        return ""
    lines = log.splitlines(keepends=True)
    marker = f"step {last_step}/"
    for i, line in enumerate(lines):
        if line.startswith(marker):
            return "".join(lines[: i + 1])
    return log


def copy_until(dst_parent: Path, until: float | None = None, src: Path = FIXTURE) -> Path:
    """A copy of the fixture with only the events at or before `until`: the run as it stood then."""
    dst = dst_parent / src.name
    if until is None:
        shutil.copytree(src, dst)
        return dst
    (dst / "events").mkdir(parents=True)
    last_step = None
    for path in sorted((src / "events").glob("*.jsonl")):
        kept = [line for line in path.read_text().splitlines(keepends=True) if json.loads(line)["t"] <= until]
        for line in kept:
            e = json.loads(line)
            if e["kind"] == "step" and e.get("rank", 0) == 0:
                last_step = e["step"]
        (dst / "events" / path.name).write_text("".join(kept))
    manifest = json.loads((src / "run.json").read_text())
    manifest.update(status="running", ended_at=None, exit_code=None, diagnosis=None)
    for owner in ("supervisor_pid", "trainer_pgid"):  # no process owns this copy
        manifest.pop(owner, None)
    (dst / "run.json").write_text(json.dumps(manifest, indent=2))
    (dst / "output.log").write_text(_cut_log((src / "output.log").read_text(), last_step))
    return dst


def add_report(run_dir: Path, report: Path = REPORT) -> float:
    """Give a copied record an evaluation report as the supervisor does: `report.json` beside the record,
    and a `report` event just before its `end` (or after its last event). Returns the event's time."""
    (run_dir / "report.json").write_text(report.read_text())
    path = run_dir / "events" / "supervisor.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    ends = [i for i, line in enumerate(lines) if json.loads(line)["kind"] == "end"]
    if ends:
        at, t = ends[0], json.loads(lines[ends[0]])["t"] - 0.1
    else:
        at, t = len(lines), fixture_times(run_dir)[1] + 0.1
    event = {"t": t, "kind": "report", "path": str(run_dir / "report.json"), "summary": "from the fixture"}
    lines.insert(at, json.dumps(event) + "\n")
    path.write_text("".join(lines))
    return t


def feed(src: Path, dst: Path, speed: float) -> None:
    """Write `src`'s record into `dst` over time, as its writers did, `speed` times faster.

    Each event file is appended line by line (flushed) at its event's time; `output.log` follows the
    trainer's steps; the manifest says running until the end, then the recorded final status.
    """
    events = []
    for path in sorted((src / "events").glob("*.jsonl")):
        for line in path.read_text().splitlines(keepends=True):
            events.append((json.loads(line)["t"], path.name, line))
    events.sort(key=lambda x: x[0])
    log_lines = (src / "output.log").read_text().splitlines(keepends=True)
    manifest = json.loads((src / "run.json").read_text())
    final = dict(manifest)
    manifest.update(status="running", ended_at=None, exit_code=None, diagnosis=None)
    for owner in ("supervisor_pid", "trainer_pgid"):  # no process owns this copy
        manifest.pop(owner, None)
    (dst / "events").mkdir(parents=True, exist_ok=True)
    (dst / "run.json").write_text(json.dumps(manifest, indent=2))
    files = {name: open(dst / "events" / name, "a") for _, name, _ in events}  # noqa: SIM115
    log = open(dst / "output.log", "a")  # noqa: SIM115
    log_pos = 0
    t0, wall0 = events[0][0], time.monotonic()
    try:
        for t, name, line in events:
            delay = (t - t0) / speed - (time.monotonic() - wall0)
            if delay > 0:
                time.sleep(delay)
            files[name].write(line)
            files[name].flush()
            e = json.loads(line)
            if e["kind"] == "step" and e.get("rank", 0) == 0:
                marker = f"step {e['step']}/"
                while log_pos < len(log_lines):
                    log.write(log_lines[log_pos])
                    log_pos += 1
                    if log_lines[log_pos - 1].startswith(marker):
                        break
                log.flush()
        log.writelines(log_lines[log_pos:])
    finally:
        for f in files.values():
            f.close()
        log.close()
    (dst / "run.json").write_text(json.dumps(final, indent=2))


if __name__ == "__main__":  # python tests/tui_helpers.py SRC DST SPEED: a writer in its own process
    feed(Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]))


def sync(fn):
    """Run an async test with asyncio (no async plugin needed)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


async def wait_for(pilot, predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    """Let the app run until `predicate()` holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await pilot.pause(0.05)


def screen_text(app) -> str:
    """What the app's screen shows, as plain text, one line a row."""
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(segment.text for segment in strip) for strip in strips)


async def settle(pilot, app, timeout: float = 20.0) -> None:
    """Until the app shows a complete snapshot (the history read), and one more, bucketed to the charts'
    real widths."""
    await wait_for(
        pilot, lambda: app.last_snapshot is not None and app.last_snapshot.header.loading is None, timeout
    )
    seen = app.shown
    await wait_for(pilot, lambda: app.shown > seen, timeout)
    await pilot.pause()


def region_text(app, widget) -> list[str]:
    """The rows of `widget`'s content area as the screen shows them."""
    r = widget.content_region
    return [line[r.x : r.right] for line in screen_text(app).splitlines()[r.y : r.bottom]]
