"""The run record: append-only writers, tailing readers that survive torn lines, atomic manifests."""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path

import pytest

from cockpit.profiles import load_profile
from cockpit.record import (
    EventTail,
    EventWriter,
    RecordError,
    RunReader,
    load_manifest,
    read_events,
    write_manifest,
)
from cockpit.service.runs import create_run, find_run, list_run_dirs


def test_writer_lines_are_json_with_time_kind_rank(tmp_path: Path) -> None:
    with EventWriter(tmp_path / "events" / "a.jsonl", rank=1) as w:
        written = w.write("step", step=1, loss=float("nan"), grad_norm=math.inf, learning_rate=-math.inf)
    # What it returns is what a reader gets back: the trainer prints its loss with `:.4f` (it raised on None).
    assert f"{written['loss']:.4f} {written['grad_norm']:.4f}" == "nan inf"
    text = (tmp_path / "events" / "a.jsonl").read_text()
    record = json.loads(text, parse_constant=lambda word: pytest.fail(f"{word} is not JSON"))
    assert record["kind"] == "step" and record["rank"] == 1 and record["step"] == 1
    assert isinstance(record["t"], float)
    # NaN and infinity are not JSON: written as words, read back as the floats (a diverged run stays so).
    assert (record["loss"], record["grad_norm"], record["learning_rate"]) == ("nan", "inf", "-inf")
    (event,) = read_events(tmp_path)
    assert math.isnan(event["loss"]) and (event["grad_norm"], event["learning_rate"]) == (math.inf, -math.inf)


def test_tail_waits_for_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    tail = EventTail(path)
    assert tail.poll() == []  # no file yet
    path.write_text('{"t": 1, "kind": "a"}\n{"t": 2, "ki')
    assert [e["kind"] for e in tail.poll()] == ["a"]
    with open(path, "a") as f:
        f.write('nd": "b"}\n')
    assert [e["kind"] for e in tail.poll()] == ["b"]
    assert tail.poll() == []


def test_garbage_before_the_end_of_an_event_file_is_an_error_naming_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_text('{"t": 1, "kind": "a"}\nnot json\n[1, 2]\n{"no": "kind"}\n{"t": 2, "kind": "b"}\n')
    with pytest.raises(RecordError, match=rf"^{re.escape(str(path))}: line 2: not an event"):
        EventTail(path).poll()
    lenient = EventTail(path, strict=False)  # the supervisor's: it counts them and goes on
    assert [e["kind"] for e in lenient.poll()] == ["a", "b"]
    assert lenient.bad_lines == 3


def test_reader_merges_writers_by_time_and_picks_up_new_files(tmp_path: Path) -> None:
    events = tmp_path / "events"
    events.mkdir()
    (events / "x.jsonl").write_text('{"t": 1, "kind": "x1"}\n{"t": 3, "kind": "x3"}\n')
    reader = RunReader(tmp_path)
    assert [e["kind"] for e in reader.poll()] == ["x1", "x3"]
    (events / "y.jsonl").write_text('{"t": 2, "kind": "y2"}\n{"t": 4, "kind": "y4"}\n')
    assert [e["kind"] for e in reader.poll()] == ["y2", "y4"]
    assert [e["kind"] for e in read_events(tmp_path)] == ["x1", "y2", "x3", "y4"]


def test_manifest_round_trip_is_atomic_and_versioned(tmp_path: Path) -> None:
    write_manifest(tmp_path, {"status": "running"})
    manifest = load_manifest(tmp_path)
    assert manifest["status"] == "running" and manifest["format_version"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"], "no temporary file left behind"


def test_manifest_from_a_newer_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"format_version": 99}))
    try:
        load_manifest(tmp_path)
    except ValueError as exc:
        assert "newer" in str(exc)
    else:
        raise AssertionError("a newer format must not be read silently")


def test_create_run_is_owner_only_and_planned(tmp_path: Path) -> None:
    profile, path = load_profile("tiny-cpu")
    run_dir = create_run(tmp_path, profile, path, ["cockpit", "run"])
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
    manifest = load_manifest(run_dir)
    assert manifest["status"] == "planned"
    assert manifest["profile"]["name"] == "tiny-cpu"
    assert manifest["versions"]["transformers"]
    assert manifest["argv"] == ["cockpit", "run"]
    assert find_run(tmp_path, run_dir.name[:15]) == run_dir
    assert find_run(tmp_path, "latest") == run_dir
    assert list_run_dirs(tmp_path) == [run_dir]


# --- one atomic writer --------------------------------------------------------------------------------
def test_atomic_writes_replace_whole_files(tmp_path: Path) -> None:
    from cockpit.record.atomic import write_json_atomic, write_jsonl_atomic, write_text_atomic

    path = tmp_path / "a.json"
    assert write_json_atomic(path, {"a": 1}) == path
    assert json.loads(path.read_text()) == {"a": 1} and path.read_text().endswith("}\n")
    write_json_atomic(path, {"b": [1, 2]}, indent=1)
    assert path.read_text() == '{\n "b": [\n  1,\n  2\n ]\n}\n'
    write_text_atomic(tmp_path / "r.md", "# hi\n")
    assert (tmp_path / "r.md").read_text() == "# hi\n"
    write_jsonl_atomic(tmp_path / "p.jsonl", ({"i": i} for i in range(3)))
    assert (tmp_path / "p.jsonl").read_text() == '{"i": 0}\n{"i": 1}\n{"i": 2}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "p.jsonl", "r.md"]


def test_a_failed_atomic_write_leaves_the_old_file_and_no_partial_one(tmp_path: Path) -> None:
    from cockpit.record.atomic import atomic_writer, write_json_atomic, write_jsonl_atomic

    path = tmp_path / "p.jsonl"
    path.write_text("old\n")

    def rows():
        yield {"i": 0}
        raise RuntimeError("the scorer died halfway")

    try:
        write_jsonl_atomic(path, rows())
    except RuntimeError:
        pass
    else:
        raise AssertionError("the failure must reach the caller")
    try:
        write_json_atomic(tmp_path / "new.json", {"x": object()})  # not JSON: fails mid-write
    except TypeError:
        pass
    else:
        raise AssertionError("an object is not JSON")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["p.jsonl"], "no temporary or half-written file left"

    with atomic_writer(path) as f:  # while it is written, globs over the folder do not see it
        f.write("new\n")
        assert list(tmp_path.glob("*.jsonl")) == [path] and path.read_text() == "old\n"
    assert path.read_text() == "new\n"


# --- every name of a run, in RunPaths -----------------------------------------------------------------
def test_run_paths_name_every_file_of_a_run(tmp_path: Path) -> None:
    from cockpit.record import RunPaths

    paths = RunPaths(tmp_path)
    names = {
        "manifest": "run.json",
        "plan": "plan.json",
        "output_log": "output.log",
        "supervisor_log": "supervisor.log",
        "telemetry_log": "telemetry.log",
        "reserve": ".reserve",
        "report_json": "report.json",
        "report_md": "report.md",
        "stop_request": "control/stop",
        "kill_request": "control/kill",
    }
    for attr, name in names.items():
        assert getattr(paths, attr) == tmp_path / name, attr
    assert paths.prediction("api") == tmp_path / "predictions" / "api.jsonl"
    assert paths.events("telemetry") == tmp_path / "events" / "telemetry.jsonl"
    assert paths.event_files() == [] and paths.prediction_files() == []  # no folders yet
    for name in ("b.jsonl", "a.jsonl", "notes.txt"):
        (paths.predictions).mkdir(exist_ok=True)
        (paths.predictions / name).write_text("")
    assert paths.prediction_files() == [paths.prediction("a"), paths.prediction("b")]


def test_writers_put_files_where_run_paths_say(tmp_path: Path) -> None:
    from cockpit.plan.store import load_plan, save_plan
    from cockpit.record import RunPaths
    from cockpit.report import Report, write_report

    paths = RunPaths(tmp_path)
    assert save_plan(tmp_path, {"plan_version": 1, "configured": {}}) == paths.plan
    assert load_plan(tmp_path) == {"plan_version": 1, "configured": {}}
    save_plan(tmp_path, {"plan_version": 1, "error": "ValueError: odd config"})
    assert load_plan(tmp_path) is None  # a plan that could not be made is no plan
    fixture = Path(__file__).parent / "fixtures" / "reports" / "20261130-054410-tiny-cpu-903f.json"
    report = Report.from_dict(json.loads(fixture.read_text()))
    assert write_report(tmp_path, report) == (paths.report_json, paths.report_md)
    assert Report.from_dict(json.loads(paths.report_json.read_text())) == report
    assert paths.report_md.read_text().strip()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "report.json", "report.md"]


def test_the_plan_store_is_file_io_only() -> None:
    """plan.json is read and written without the planner: whoever wants a fresh plan builds it."""
    import ast

    import cockpit.plan.store as store

    tree = ast.parse(Path(store.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(m and m.startswith(("cockpit.plan", "cockpit.profiles")) for m in imported), imported


def test_the_record_imports_nothing_of_plan_report_or_app() -> None:
    """The record is the ground floor: every module of it, lazy imports included."""
    import ast

    import cockpit.record

    folder = Path(cockpit.record.__file__).parent
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        above = sorted(m for m in imported if m.startswith(("cockpit.plan", "cockpit.report", "cockpit.app")))
        assert above == [], f"{path.name} imports {above}"


def test_reader_follows_a_file_from_an_offset(tmp_path: Path) -> None:
    events = tmp_path / "events"
    events.mkdir()
    head = '{"t": 1, "kind": "read-in-bulk"}\n'
    (events / "x.jsonl").write_text(head + '{"t": 2, "kind": "new"}\n')
    reader = RunReader(tmp_path)
    reader.follow(events / "x.jsonl", len(head))
    assert [e["kind"] for e in reader.poll()] == ["new"]
