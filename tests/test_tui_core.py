"""The TUI's core half (no Textual): downsampling, the column fast path, the playback clock."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tui_helpers import FIXTURE, copy_until, fixture_times

from cockpit.record import RunReader
from cockpit.record.bulk import parse_lines, read_file, read_record
from cockpit.record.columns import parse_uniform
from cockpit.record.downsample import Series, bucketize, ema, minmax_points
from cockpit.record.playback import Playback
from cockpit.record.view import RunView


def test_core_imports_no_textual() -> None:
    """Every cockpit module outside cockpit.app (the report among them), and the snapshot builder (it runs
    on a worker thread), import without pulling Textual in."""
    code = (
        "import importlib, pkgutil, sys\n"
        "import cockpit\n"
        "names = [m.name for m in pkgutil.walk_packages(cockpit.__path__, 'cockpit.')\n"
        "         if not m.name.startswith('cockpit.app') and m.name != 'cockpit.__main__']\n"
        "names += ['cockpit.app.model', 'cockpit.app.charts']\n"
        "for name in names: importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m == 'textual' or m.startswith('textual.'))\n"
        "print(len(names), 'modules;', bad[:5]); sys.exit(1 if bad or len(names) < 15 else 0)\n"
    )
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- downsampling -----------------------------------------------------------------------------------
def test_bucketize_matches_a_plain_loop() -> None:
    rng = np.random.default_rng(0)
    x = np.sort(rng.uniform(0, 100, 5000))
    y = rng.normal(size=5000)
    b = bucketize(x, y, 0.0, 100.0, 37)
    edges = np.linspace(0, 100, 38)
    for i in range(37):
        sel = (x >= edges[i]) & ((x < edges[i + 1]) if i < 36 else (x <= edges[i + 1]))
        assert b.count[i] == sel.sum()
        assert b.ymin[i] == pytest.approx(y[sel].min())
        assert b.ymax[i] == pytest.approx(y[sel].max())
        assert b.ymean[i] == pytest.approx(y[sel].mean())
        assert b.ylast[i] == y[sel][-1]


def test_bucketize_empty_buckets_and_ranges() -> None:
    b = bucketize(np.array([1.0, 9.0]), np.array([5.0, 7.0]), 0.0, 10.0, 10)
    assert b.count.tolist() == [0, 1, 0, 0, 0, 0, 0, 0, 0, 1]
    assert np.isnan(b.ymin[0]) and b.ymin[1] == 5.0
    assert bucketize(np.array([]), np.array([]), 0, 1, 4).count.sum() == 0


def test_minmax_points_keep_every_extreme() -> None:
    y = np.zeros(10_000)
    y[1234], y[8765] = 50.0, -50.0
    xs, ys = minmax_points(np.arange(10_000.0), y, 100)
    assert len(xs) <= 200
    assert 50.0 in ys and -50.0 in ys and np.all(np.diff(xs) > 0)


def test_series_memory_is_bounded_and_keeps_the_envelope() -> None:
    s = Series(capacity=1024)
    rng = np.random.default_rng(1)
    y = rng.normal(size=100_000)
    y[77_777] = 99.0
    for chunk in np.array_split(np.arange(100_000), 37):
        s.extend(chunk.astype(float), y[chunk])
    assert len(s) <= 1024 and s.total == 100_000
    assert s.y.max() == 99.0 and s.y.min() == y.min()
    assert np.all(np.diff(s.x) >= 0)
    one = Series(capacity=16)
    for i in range(1000):
        one.append(float(i), float(i % 7))
    assert len(one) <= 16 and one.y.max() == 6.0 and one.y.min() == 0.0


def test_series_mean_mode_and_missing_values() -> None:
    s = Series(capacity=64, mode="mean")
    s.extend(np.arange(1000.0), np.full(1000, 3.0))
    assert len(s) <= 64 and np.allclose(s.y, 3.0)
    s.append(1000.0, None)
    s.append(1001.0, float("nan"))
    assert s.total == 1000


def test_ema_in_pieces_equals_at_once() -> None:
    v = np.random.default_rng(2).normal(size=300)
    whole, _ = ema(v, 0.9)
    a, state = ema(v[:100], 0.9)
    b, _ = ema(v[100:], 0.9, state)
    assert np.allclose(whole, np.r_[a, b])
    assert whole[0] == pytest.approx(v[0])  # debiased: the first value is itself


# --- the column fast path -----------------------------------------------------------------------------
def _lines(events: list[dict]) -> list[bytes]:
    return [json.dumps(e, separators=(",", ":")).encode() for e in events]


def test_parse_uniform_equals_json() -> None:
    rng = random.Random(3)
    events = [
        {"t": 1e9 + i * 0.5, "kind": "step", "rank": 0, "step": i, "loss": rng.random() * 1e-7,
         "lr": None if i % 5 else 3e-5, "big": rng.random() * 1e20, "neg": -rng.random(),
         "g": [rng.random(), None, 7]}
        for i in range(500)
    ]  # fmt: skip
    cols = parse_uniform(_lines(events))
    assert cols is not None
    for key in ("t", "step", "loss", "big", "neg"):
        assert cols[key].tolist() == [e[key] for e in events]
    assert [None if np.isnan(v) else v for v in cols["lr"].tolist()] == [e["lr"] for e in events]
    assert cols["g[0]"].tolist() == [e["g"][0] for e in events] and np.isnan(cols["g[1]"]).all()


@pytest.mark.parametrize(
    "odd",
    [
        {"t": 5.0, "kind": "step", "step": 1, "loss": 1.0},  # a missing key
        {"t": 5.0, "kind": "step", "loss": 1.0, "step": 1, "x": 2},  # another order
        {"t": 5.0, "kind": "step", "step": 1, "loss": 1.0, "x": "a2"},  # a string with a digit
        {"t": 5.0, "kind": "step", "step": 1, "loss": [1.0], "x": 2},  # a list where a number was
    ],
)
def test_parse_uniform_refuses_mixed_layouts(odd: dict) -> None:
    events = [{"t": float(i), "kind": "step", "step": i, "loss": 1.0, "x": 2} for i in range(100)]
    assert parse_uniform(_lines(events)) is not None
    assert parse_uniform(_lines([*events, odd])) is None


def test_parse_lines_isolates_odd_lines_and_keeps_rare_events() -> None:
    events = [
        {"t": float(i), "kind": "step", "rank": 0, "step": i, "loss": 1.0 / (i + 1)} for i in range(1000)
    ]
    events[500] = {"t": 500.0, "kind": "step", "rank": 0, "step": 500, "loss": None, "extra": 1}
    events.insert(10, {"t": 10.5, "kind": "phase", "rank": 0, "phase": "train"})
    lines = [*_lines(events), b"{not json", b""]
    blocks, rare, bad = parse_lines(lines)
    assert bad == 1
    assert sum(len(b) for b in blocks) + sum(e["kind"] == "step" for e in rare) == 1000
    assert {"phase"} <= {e["kind"] for e in rare}
    assert any(e.get("extra") == 1 for e in rare)  # the odd line came back through json


def test_read_file_leaves_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    whole = b"".join(
        line + b"\n" for line in _lines([{"t": float(i), "kind": "k", "v": i} for i in range(10)])
    )
    path.write_bytes(whole + b'{"t":99,"ki')
    chunks = list(read_file(path, chunk_bytes=37))
    assert chunks[-1].offset == len(whole)
    assert sum(len(c.events) for c in chunks) == 10


def test_bulk_read_folds_like_the_event_reader() -> None:
    """The fast path gives RunView exactly what the line-by-line reader gives it."""
    slow = RunView()
    slow.apply(RunReader(FIXTURE).poll())
    pb = Playback(FIXTURE, live=True)
    pb.load()
    pb.tick()
    fast = pb.view
    blocks, _, _, _ = read_record(FIXTURE / "events")
    assert {b.kind for b in blocks} == {"step", "telemetry"}  # the fixture took the fast path
    for name in ("phase", "max_steps", "start_step", "first_t", "last_t", "audit", "load_peaks", "memory",
                 "checkpoints", "trainer_outcome", "supervisor_notes", "events_seen"):  # fmt: skip
        assert getattr(fast, name) == getattr(slow, name), name
    assert fast.steps == slow.steps
    assert fast.eta_s() == slow.eta_s() and fast.tokens_per_s == slow.tokens_per_s


def test_bulk_read_draws_like_the_event_reader() -> None:
    """The curves too: the block fold over columns and the event reader's events give the same series."""
    from cockpit.record.series import RunSeries

    slow = RunSeries()
    slow.apply(RunReader(FIXTURE).poll())
    pb = Playback(FIXTURE, live=True)
    pb.load()
    pb.tick()
    fast = pb.series
    for name in ("loss", "loss_smooth", "tokens_per_s", "ram_used", "ram_total", "run_rss", "swap_used"):
        a, b = getattr(slow, name), getattr(fast, name)
        assert np.array_equal(a.x, b.x) and np.allclose(a.y, b.y), name
    assert slow.rank_rss.keys() == fast.rank_rss.keys() and slow.last_host == fast.last_host
    assert slow.telemetry_samples == fast.telemetry_samples and slow.status == fast.status


def test_bad_lines_count_the_bulk_read_and_what_came_after(tmp_path: Path) -> None:
    run = copy_until(tmp_path)
    with open(run / "events" / "supervisor.jsonl", "a") as f:
        f.write("not json\n")
    pb = Playback(run, live=True)
    pb.load()
    pb.tick()
    assert pb.bad_lines == 1
    with open(run / "events" / "supervisor.jsonl", "a") as f:
        f.write('{"no": "kind"}\n')
    pb.tick()
    assert pb.bad_lines == 2


# --- the playback clock -------------------------------------------------------------------------------
class FakeClock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_replay_moves_on_its_own_timestamps() -> None:
    first, _ = fixture_times()
    wall = FakeClock(1000.0)
    pb = Playback(FIXTURE, live=False, speed=10.0, now=wall)
    pb.load()
    pb.tick()
    assert pb.view.step == 0 and pb.status() in ("running", "planned")
    wall.t += 10.0  # 10 s of wall time at 10x: 100 s of the record
    pb.tick()
    assert pb.clock == pytest.approx(first + 100.0)
    step_at_100 = pb.view.step
    assert 0 < step_at_100 < 400 and all(s.t <= first + 100.0 for s in pb.view.steps)
    pb.command("toggle_pause")
    wall.t += 50.0
    pb.tick()
    assert pb.view.step == step_at_100  # paused: the clock stands
    pb.command("toggle_pause")
    pb.command("faster")
    pb.tick()
    assert pb.speed == 16.0
    pb.command("slower")
    pb.command("slower")
    pb.tick()
    assert pb.speed == 4.0  # 16 -> 8 -> 4
    pb.command("end")
    pb.tick()
    assert pb.view.step == 400 and pb.status() == "finished" and pb.at_end
    assert pb.elapsed_s() == pytest.approx(pb.series.end_t - first)


def test_replay_catching_up_becomes_following() -> None:
    wall = FakeClock(0.0)
    pb = Playback(FIXTURE, live=False, speed=1000.0, now=wall)
    pb.load()
    pb.tick()
    wall.t += 10.0
    pb.tick()
    assert pb.follow and pb.view.step == 400


def test_live_follows_a_growing_record(tmp_path: Path) -> None:
    first, last = fixture_times()
    mid = first + (last - first) / 2
    run = copy_until(tmp_path, mid)
    wall = FakeClock(mid + 1)
    pb = Playback(run, live=True, now=wall)
    pb.load()
    pb.tick()
    step_mid = pb.view.step
    assert 0 < step_mid < 400 and pb.status() == "running"
    assert pb.elapsed_s() == pytest.approx(mid + 1 - first)
    # the writers go on: append the rest of the fixture
    for path in sorted((FIXTURE / "events").glob("*.jsonl")):
        rest = [line for line in path.read_text().splitlines(keepends=True) if json.loads(line)["t"] > mid]
        with open(run / "events" / path.name, "a") as f:
            f.writelines(rest)
    pb.tick()
    assert pb.view.step == 400 and pb.series.status == "finished"
    assert len(pb.series.loss) == 400


def test_preview_then_exact(tmp_path: Path) -> None:
    pb = Playback(FIXTURE, live=True)
    pb.preview()
    assert pb.previewing and pb.view.step == 400  # the tail is read whole: the header is right
    pb.load()
    pb.tick()
    assert not pb.previewing and len(pb.view.steps) == 400


def test_output_tail_follows_the_replayed_step() -> None:
    """A record from before `output_log_bytes` (the fixture): its log follows the step shown."""
    wall = FakeClock(0.0)
    pb = Playback(FIXTURE, live=False, speed=1.0, now=wall)
    pb.load()
    first, _ = fixture_times()
    pb.tick()  # the first frame: the supervisor starts, the trainer has printed nothing yet
    assert pb.series.telemetry_info is None and pb.output_tail(200) == []
    pb.command("seek", first + 5.0)
    pb.tick()  # setup and load, no step yet
    early = pb.output_tail(200)
    assert pb.view.step == 0 and early and not any(line.startswith("step ") for line in early)
    pb.command("seek", first + 120.0)
    pb.tick()
    step = pb.view.step
    tail = pb.output_tail(20)
    assert any(line.startswith(f"step {step}/") for line in tail)
    assert not any(line.startswith(f"step {step + 1}/") for line in tail)
    pb.command("end")
    pb.tick()
    assert any(line.startswith("step 400/") for line in pb.output_tail(40))


def test_series_follow_the_fixture() -> None:
    pb = Playback(FIXTURE, live=True)
    pb.load()
    pb.tick()
    s = pb.series
    assert len(s.loss) == 400 and len(s.loss_smooth) == 400
    assert s.telemetry_samples > 300 and len(s.ram_used) == s.telemetry_samples
    assert not s.has_gpus and 0 in s.rank_rss  # a CPU run: per-rank RSS stands in for GPU memory
    assert s.run_rss.y.max() > 500  # the trainer's process tree, in MiB


def test_live_and_replay_show_the_same_curves(tmp_path: Path) -> None:
    """Live is replay with the clock at now: the record cut at a moment, followed live, draws exactly
    what the whole record replayed to that moment draws."""
    from cockpit.app.model import build_charts

    first, last = fixture_times()
    mid = first + (last - first) / 2
    live = Playback(copy_until(tmp_path, mid), live=True, now=lambda: mid)
    live.load()
    live.tick()
    replay = Playback(FIXTURE, live=False, now=lambda: 0.0)
    replay.load()
    replay.command("seek", live.view.last_t)
    replay.tick()
    dots = {"loss": 98, "throughput": 98, "gpu": 98, "host": 98}
    a, b = build_charts(live, dots), build_charts(replay, dots)
    for name in a:
        assert (a[name].x_hi, a[name].y_lo, a[name].y_hi) == (b[name].x_hi, b[name].y_lo, b[name].y_hi), name
        for ta, tb in zip(a[name].traces, b[name].traces, strict=True):
            assert ta.label == tb.label and ta.value == tb.value
            np.testing.assert_array_equal(ta.ymin, tb.ymin)
            np.testing.assert_array_equal(ta.ymax, tb.ymax)


def test_replay_plays_while_the_history_is_still_being_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files are read side by side in time order: the state is exact up to the horizon at every step."""
    from cockpit.record import bulk

    monkeypatch.setattr(bulk, "CHUNK_BYTES", 8192)
    full = Playback(FIXTURE, live=True)
    full.load()
    full.tick()
    wall = FakeClock(0.0)
    pb = Playback(FIXTURE, live=False, speed=1e6, now=wall)
    pb.start_load()
    steps = 0
    while pb.load_step():
        steps += 1
        wall.t += 1.0
        pb.tick()
        assert pb.clock is None or pb.clock <= max(pb.horizon, pb.first_t)
        assert all(s.t <= pb.horizon for s in pb.view.steps)
    assert steps > 20 and pb.loaded
    pb.command("end")
    pb.tick()
    assert pb.view.steps == full.view.steps and pb.view.memory == full.view.memory
    assert np.array_equal(pb.series.loss.y, full.series.loss.y)
    assert np.array_equal(pb.series.ram_used.y, full.series.ram_used.y)


def test_chart_legend_says_how_many_entries_did_not_fit():
    """Values go before names; only names that do not fit are counted, `+N`, whole at the end."""
    import numpy as np

    from cockpit.app.charts import ChartData, Trace
    from cockpit.app.widgets.chart import BrailleChart

    empty = np.zeros(0)
    traces = tuple(Trace(f"GPU{i}", "#ffffff", empty, empty, value="61.8G") for i in range(16))
    data = ChartData("GPU memory", 0.0, 1.0, 0.0, 1.0, "mib", traces)
    strips = BrailleChart("gpu")._legend(data, 40, max_lines=2)
    lines = ["".join(seg.text for seg in strip) for strip in strips]
    shown = sum(line.count("GPU") for line in lines)
    assert len(lines) == 2 and all(len(line) == 40 for line in lines)
    assert 0 < shown < 16 and lines[-1].rstrip().endswith(f" +{16 - shown}") and "61.8G" not in lines[0]
    eight = BrailleChart("gpu")._legend(ChartData("GPU memory", 0, 1, 0, 1, "mib", traces[:8]), 40, 2)
    assert sum("".join(seg.text for seg in strip).count("GPU") for strip in eight) == 8  # names, no values
    wide = BrailleChart("gpu")._legend(data, 400, max_lines=2)
    assert "+" not in "".join(seg.text for seg in wide[0]) and "GPU15 61.8G" in "".join(
        s.text for s in wide[0]
    )


def test_a_clock_that_steps_back_or_an_infinite_value_keeps_the_series_drawable():
    s = Series(capacity=64)
    s.append(30.0, 1.0)
    s.append(29.01, 2.0)  # NTP stepped the clock back
    s.append(30.01, float("inf"))  # not a reading: left out
    s.extend(np.array([29.5, 31.0, 30.5]), np.array([3.0, 4.0, float("-inf")]))
    assert list(s.x) == [30.0, 30.0, 30.0, 31.0] and list(s.y) == [1.0, 2.0, 3.0, 4.0]
    buckets = bucketize(s.x, s.y, 29.0, 31.0, 4)
    assert buckets.count.sum() == 4 and np.nanmax(buckets.ymax) == 4.0


def test_the_live_view_survives_a_clock_step_back_and_infinity(tmp_path: Path):
    from cockpit.record.series import RunSeries

    t0 = 1_700_000_000.0
    lines = [
        {"kind": "telemetry", "t": t0 + 30, "gpu_mem_used_mib": [100.0], "ram_used_mib": 5.0},
        {"kind": "telemetry", "t": t0 + 29.01, "gpu_mem_used_mib": [101.0], "ram_used_mib": 6.0},
        {"kind": "step", "t": t0 + 31, "rank": 0, "step": 1, "loss": float("inf"), "tokens_per_s": 9.0},
        {"kind": "step", "t": t0 + 32, "rank": 0, "step": 2, "loss": 2.0, "tokens_per_s": 9.0},
    ]
    series = RunSeries()
    for line in lines:
        series.apply([json.loads(json.dumps(line))])  # json writes inf as Infinity and reads it back
    assert list(series.loss.y) == [2.0]
    assert np.all(np.diff(series.gpu_used[0].x) >= 0)


def test_unpausing_a_live_view_goes_back_to_now(tmp_path: Path) -> None:
    first, last = fixture_times()
    mid = first + (last - first) / 2
    run = copy_until(tmp_path, mid)
    pb = Playback(run, live=True, now=FakeClock(mid + 1))
    pb.load()
    pb.tick()
    pb.command("toggle_pause")
    pb.tick()
    assert pb.paused and not pb.follow
    held = pb.view.step
    for path in sorted((FIXTURE / "events").glob("*.jsonl")):  # the run goes on meanwhile
        rest = [line for line in path.read_text().splitlines(keepends=True) if json.loads(line)["t"] > mid]
        with open(run / "events" / path.name, "a") as f:
            f.writelines(rest)
    pb.tick()
    assert pb.view.step == held  # paused: the clock stands
    pb.command("toggle_pause")
    pb.tick()
    assert pb.follow and not pb.paused and pb.view.step == 400


def test_output_tail_of_a_resumed_run_follows_the_second_attempt(tmp_path: Path) -> None:
    from cockpit.record import write_manifest

    write_manifest(tmp_path, {"run_id": "r", "status": "finished", "profile": {}})
    events, log, t = [], ["loading\n"], 1000.0
    for attempt, steps in enumerate(([1, 2, 3], [3, 4])):  # stopped after 3, resumed from checkpoint 2
        t += 1
        events.append({"kind": "train_begin", "t": t, "rank": 0, "max_steps": 4, "start_step": steps[0] - 1})
        for step in steps:
            t += 1
            events.append({"kind": "step", "t": t, "rank": 0, "step": step, "loss": 1.0})
            log.append(f"step {step}/4 loss 1.0 (attempt {attempt})\n")
    last_step_t = t
    events.append({"kind": "trainer_end", "t": t + 5, "rank": 0, "outcome": "finished"})
    log.append("saving the adapter\n")
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "trainer-rank0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (tmp_path / "output.log").write_text("".join(log))
    pb = Playback(tmp_path, live=False, speed=1.0, now=FakeClock(0.0))
    pb.load()
    pb.command("seek", 1004.0)  # the first attempt's step 3
    pb.tick()
    assert pb.view.step == 3 and pb.output_tail(10)[-1] == "step 3/4 loss 1.0 (attempt 0)"
    pb.command("seek", last_step_t)
    pb.tick()
    assert not pb.at_end and pb.view.step == 4 and pb.view.step_events == 5
    assert pb.output_tail(10)[-1] == "step 4/4 loss 1.0 (attempt 1)"
