"""A damaged record: one line naming the file (and line or field), exit 2, never a traceback.

A torn last line of an event file (a crash mid-write) is not damage; garbage before the end is.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from cockpit import cli
from cockpit.record import EventWriter, RecordError, RunReader, check_record, load_manifest
from cockpit.record.bulk import read_file
from cockpit.record.playback import Playback

FIXTURE = Path(__file__).parent / "fixtures" / "records" / "20261130-053002-tiny-cpu-9d58"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A copy of a real tiny-cpu record under `tmp_path/runs`."""
    return Path(shutil.copytree(FIXTURE, tmp_path / "runs" / FIXTURE.name))


def trainer_file(run_dir: Path) -> Path:
    return run_dir / "events" / "trainer-rank0.jsonl"


def tear_last_line(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 20])  # the last line cut short: no newline


def garble_line(path: Path, line_no: int) -> None:
    lines = path.read_bytes().split(b"\n")
    lines[line_no - 1] = lines[line_no - 1][:25]  # cut mid-line, yet followed by more lines
    path.write_bytes(b"\n".join(lines))


# --- the record layer ----------------------------------------------------------------------------
def test_a_corrupt_manifest_names_the_file(run_dir: Path) -> None:
    (run_dir / "run.json").write_text('{"status": "runn')
    with pytest.raises(RecordError, match=rf"^{re.escape(str(run_dir / 'run.json'))}: not valid JSON"):
        load_manifest(run_dir)


@pytest.mark.parametrize("version", [99, 0, "1", None])
def test_an_unknown_format_version_names_the_field(run_dir: Path, version: object) -> None:
    manifest = json.loads((run_dir / "run.json").read_text())
    manifest["format_version"] = version
    (run_dir / "run.json").write_text(json.dumps(manifest))
    if version is None:  # a record from before versions: read as version 1
        assert load_manifest(run_dir)["format_version"] is None
        return
    with pytest.raises(RecordError, match=r"run\.json: format_version .* is unknown"):
        load_manifest(run_dir)


def test_a_torn_last_line_is_tolerated_by_every_reader(run_dir: Path) -> None:
    whole = len(RunReader(run_dir).poll())
    tear_last_line(trainer_file(run_dir))
    check_record(run_dir)
    assert len(RunReader(run_dir).poll()) == whole - 1
    chunks = list(read_file(trainer_file(run_dir)))
    assert chunks[-1].next_line == 414, "413 whole lines read, the torn 414th left"
    playback = Playback(run_dir, live=False)
    playback.load()
    assert playback.view.step is not None


def test_garbage_before_the_end_is_an_error_naming_file_and_line(run_dir: Path) -> None:
    path = trainer_file(run_dir)
    garble_line(path, 7)
    expected = rf"^{re.escape(str(path))}: line 7: not an event"
    with pytest.raises(RecordError, match=expected):
        check_record(run_dir)
    with pytest.raises(RecordError, match=expected):
        RunReader(run_dir).poll()
    with pytest.raises(RecordError, match=expected):
        list(read_file(path))
    # A viewer counts the line and goes on (the commands refused the record before opening one).
    pb = Playback(run_dir, live=False)
    pb.load()
    assert pb.bad_lines == 1


def test_a_writer_reopening_a_torn_file_drops_the_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_bytes(b'{"t": 1, "kind": "a"}\n{"t": 2, "ki')  # the last owner crashed mid-write
    with EventWriter(path) as writer:  # a resumed process appends to the same file
        writer.write("b")
    lines = path.read_bytes().split(b"\n")
    assert lines[0] == b'{"t": 1, "kind": "a"}' and b'"kind":"b"' in lines[1] and lines[2] == b""


def test_a_live_tail_waiting_on_a_torn_line_reads_what_replaces_it(tmp_path: Path) -> None:
    events = tmp_path / "events"
    events.mkdir()
    path = events / "w.jsonl"
    path.write_bytes(b'{"t": 1, "kind": "a"}\n{"t": 2, "ki')
    reader = RunReader(tmp_path)
    assert [e["kind"] for e in reader.poll()] == ["a"]
    with EventWriter(path) as writer:
        writer.write("b")
    assert [e["kind"] for e in reader.poll()] == ["b"]


# --- the commands ----------------------------------------------------------------------------------
DAMAGE = {
    "corrupt run.json": (lambda d: (d / "run.json").write_text("{not json"), r"run\.json: not valid JSON"),
    "unknown format_version": (
        lambda d: (d / "run.json").write_text(json.dumps({"format_version": 7, "status": "finished"})),
        r"run\.json: format_version 7 is unknown",
    ),
    "garbage mid-file": (
        lambda d: garble_line(trainer_file(d), 7),
        r"trainer-rank0\.jsonl: line 7: not an event",
    ),
}


@pytest.mark.parametrize("command", ["report", "replay", "attach", "eval"])
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_commands_on_a_damaged_record_say_which_file_in_one_line(
    run_dir: Path, command: str, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    damage_it, message = DAMAGE[damage]
    damage_it(run_dir)
    code = cli.main([command, run_dir.name, "--runs-dir", str(run_dir.parent)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_BAD_INPUT
    assert re.search(message, err) and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_ls_shows_an_unreadable_record_as_a_row(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = Path(shutil.copytree(run_dir, run_dir.parent / "20261130-060000-tiny-cpu-good"))
    tear_last_line(trainer_file(good))  # tolerated
    (run_dir / "run.json").write_text("{not json")
    assert cli.main(["ls", "--runs-dir", str(run_dir.parent)]) == 0
    out = capsys.readouterr().out
    assert "unreadable" in out and "not valid JSON" in out and good.name in out
    assert cli.main(["ls", "--format", "json", "--runs-dir", str(run_dir.parent)]) == 0
    rows = {row["run"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows[run_dir.name]["status"] == "unreadable"
    assert rows[run_dir.name]["diagnosis"].startswith(str(run_dir / "run.json") + ": not valid JSON")
    assert rows[good.name]["status"] == "finished" and rows[good.name]["step"] == 400
    assert rows[good.name]["max_steps"] == 400


def test_ls_json_with_no_runs_is_an_empty_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ls", "--format", "json", "--runs-dir", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from cockpit import __version__

    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"cockpit {__version__}"
