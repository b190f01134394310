"""With no terminal, following a run prints plain lines as it goes: steps at a pace, phases, checkpoints."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console
from tui_helpers import FIXTURE, copy_until, fixture_times

from cockpit.headless import HeadlessViewer, PlainLog
from cockpit.record import read_events
from cockpit.record.view import RunView

RECORDS = Path(__file__).resolve().parent / "fixtures" / "records"


def replay(run_dir: Path, log: PlainLog) -> list[str]:
    """The lines a follower would print, fed the record one event at a time on the record's clock."""
    view, lines = RunView(), []
    for event in read_events(run_dir):
        view.apply([event])
        lines += log.update(view, event["t"])
    return lines


def test_plain_lines_every_n_steps_and_at_each_phase() -> None:
    lines = replay(FIXTURE, PlainLog(every_steps=100, every_s=1e9))
    assert lines == [
        "[00:07] phase setup: setting up",
        "[00:08] phase load: loading the model",
        "[00:09] phase train: training",
        "[00:13] first step 1/400  loss 12.5561  4,427 tok/s  ETA 2:16  peak RSS 754 MiB",
        "[03:27] step 100/400  loss 0.5211  289 tok/s  ETA 15:06  peak RSS 765 MiB",
        "[03:27] checkpoint at step 100",
        "[04:21] step 200/400  loss 0.1928  3,481 tok/s  ETA 1:29  peak RSS 779 MiB",
        "[04:21] checkpoint at step 200",
        "[05:09] step 300/400  loss 0.0671  3,488 tok/s  ETA 0:44  peak RSS 779 MiB",
        "[05:09] checkpoint at step 300",
        "[06:04] step 400/400  loss 0.0380  3,232 tok/s  ETA 0:00  peak RSS 779 MiB",
        "[06:04] checkpoint at step 400",
        "[06:04] phase save: saving the adapter",
        "[06:05] phase done: training over",
    ]


def test_plain_lines_every_s_seconds_when_steps_are_slow() -> None:
    lines = replay(FIXTURE, PlainLog(every_steps=10**6, every_s=60.0))
    steps = [line for line in lines if "step " in line and "checkpoint" not in line]
    assert steps[0].startswith("[00:13] first step 1/400")
    assert steps[1].startswith("[01:14] step 76/400")  # 60 s after the first step line
    assert steps[-1].startswith("[06:04] step 400/400")  # the last step is always said
    assert 6 <= len(steps) <= 8  # a six-minute run, a line a minute


def test_plain_lines_of_an_evaluation_and_of_gpu_memory() -> None:
    lines = replay(RECORDS / "20261130-074646-tiny-cpu-5bc8", PlainLog(every_steps=50, every_s=1e9))
    assert "[01:15] first step 1/80  loss 11.9682  614 tok/s  ETA 3:29  peak GPU 76 MiB, RSS 2.3 GiB" in lines
    assert [line[8:] for line in lines[-6:]] == [
        "phase eval: evaluating on the held-out split",
        "evaluation: base 16/200",
        "evaluation: base 200/200",
        "evaluation: finetuned 16/200",
        "evaluation: finetuned 200/200",
        "phase report: writing the evaluation report",
    ]


def test_a_resumed_attempt_says_its_first_step_again() -> None:
    lines = replay(RECORDS / "20261201-023803-tiny-cpu-729e", PlainLog(every_steps=50, every_s=1e9))
    firsts = [line[8:] for line in lines if "first step" in line]
    assert [f.split("  ")[0] for f in firsts] == ["first step 1/3", "first step 4/6"]


def test_following_without_a_terminal_prints_lines_while_the_run_goes(tmp_path: Path) -> None:
    t0, _t1 = fixture_times()
    run_dir = copy_until(tmp_path, until=t0 + 280)  # mid-run, status running, no owner alive
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, soft_wrap=True)
    viewer = HeadlessViewer(run_dir, console=console, alive=lambda: False)
    viewer.follow()
    text = out.getvalue()
    assert "\x1b" not in text
    assert "] step 240/400  loss 0.1442  3,536 tok/s  ETA 1:08  peak RSS 779 MiB" in text
    assert "checkpoint at step 200" in text
    # the lines came while the run was going, before the viewer found its owner gone
    assert text.index("step 240/400") < text.index("supervisor lost")


def test_a_long_load_says_its_layers_and_the_time_left() -> None:
    """The story's model loads one layer at a time for minutes: a line at its first layer, then one a
    `every_s` seconds, each with the time left at the pace so far."""
    view, log, lines = RunView(), PlainLog(every_steps=100, every_s=60.0), []
    t0 = 1_700_000_000.0
    events = [{"t": t0, "kind": "phase", "phase": "load", "rank": 0}]
    events += [
        {"t": t0 + 4.0 * k, "kind": "load_progress", "rank": 0, "layer": k, "layers": 94}
        for k in range(1, 95)
    ]
    for event in events:
        view.apply([event])
        lines += log.update(view, event["t"])
    load = [line for line in lines if "loading the model: layer" in line]
    assert load[0].endswith("loading the model: layer 1 of 94, about 6 min left")  # 4 s a layer, 93 to go
    assert load[1].endswith("loading the model: layer 16 of 94, about 5 min left")  # 60 s later
    assert len(load) == 7  # 372 s of load, a line a minute
    assert view.load_eta_s() == 0.0 and view.load_words() == "layer 94 of 94"


def test_the_loads_pace_leaves_out_what_came_before_its_first_layer() -> None:
    """30 s between the load's start and its first layer (the checkpoint opened, the buffers pinned), then
    2 s a layer: from the second layer on, the time left is at 2 s a layer."""
    view, t0 = RunView(), 1_700_000_000.0
    view.apply([{"t": t0, "kind": "phase", "phase": "load", "rank": 0}])
    view.apply([{"t": t0 + 30.0, "kind": "load_progress", "rank": 0, "layer": 1, "layers": 11}])
    assert view.load_eta_s() == 300.0  # one layer said: the load's start counts
    view.apply([{"t": t0 + 32.0, "kind": "load_progress", "rank": 0, "layer": 2, "layers": 11}])
    assert view.load_eta_s() == 18.0 and view.load_words() == "layer 2 of 11, about 18 s left"


def test_the_closing_lines_say_where_the_adapter_is_and_what_to_run_next(tmp_path: Path) -> None:
    from cockpit.record import RunPaths as Paths
    from cockpit.record.manifest import update_manifest

    _t0, t1 = fixture_times()
    run_dir = copy_until(tmp_path, until=t1 + 1)
    viewer = HeadlessViewer(run_dir, alive=lambda: False)
    viewer.view.apply(viewer.reader.poll())
    stopped = viewer.summary()
    assert stopped[-1] == f"next: cockpit replay {run_dir}"
    assert not any(line.startswith("adapter files:") for line in stopped)
    Paths(run_dir).adapter.mkdir(parents=True, exist_ok=True)
    update_manifest(run_dir, status="finished")
    done = viewer.summary()
    assert f"adapter files: {Paths(run_dir).adapter}" in done
    assert done[-1] == f"next: cockpit report {run_dir} · cockpit replay {run_dir}"
