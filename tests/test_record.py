"""The run record: append-only writers, tailing readers that survive torn lines, atomic manifests."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

from cockpit.profiles import load_profile
from cockpit.record import EventTail, EventWriter, RunReader, load_manifest, read_events, write_manifest
from cockpit.runs import create_run, find_run, list_run_dirs


def test_writer_lines_are_json_with_time_kind_rank(tmp_path: Path) -> None:
    with EventWriter(tmp_path / "a.jsonl", rank=1) as w:
        w.write("step", step=1, loss=float("nan"), grad_norm=math.inf)
    record = json.loads((tmp_path / "a.jsonl").read_text())
    assert record["kind"] == "step" and record["rank"] == 1 and record["step"] == 1
    assert isinstance(record["t"], float)
    assert record["loss"] is None and record["grad_norm"] is None, "NaN and inf are not JSON: written as null"


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


def test_tail_skips_garbage_lines_and_counts_them(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_text('{"t": 1, "kind": "a"}\nnot json\n[1, 2]\n{"no": "kind"}\n{"t": 2, "kind": "b"}\n')
    tail = EventTail(path)
    assert [e["kind"] for e in tail.poll()] == ["a", "b"]
    assert tail.bad_lines == 3


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
