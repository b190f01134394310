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


# --- fields of the wrong type (issue 27, items 7 and 8) -----------------------------------------------------
def edit_line(path: Path, line_no: int, **fields: object) -> None:
    """Set fields of one event line, keeping the rest of the file as it is."""
    lines = path.read_text().split("\n")
    lines[line_no - 1] = json.dumps({**json.loads(lines[line_no - 1]), **fields})
    path.write_text("\n".join(lines))


def edit_manifest(run_dir: Path, **fields: object) -> None:
    manifest = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**manifest, **fields}))


def prediction_without_tenant(run_dir: Path) -> None:
    (run_dir / "predictions").mkdir(exist_ok=True)
    (run_dir / "predictions" / "finetuned.jsonl").write_text(
        '{"meta": {"system": "finetuned"}}\n'
        '{"id": "a1", "gold": "ORG", "pred": "ORG", "scores": {"ORG": 0.0}}\n'
    )


TYPED_DAMAGE = {
    "t not a number": (
        lambda d: edit_line(trainer_file(d), 4, t="abc"),
        r"trainer-rank0\.jsonl: line 4: not an event: field t: expected a finite number",
    ),
    "step null": (
        lambda d: edit_line(trainer_file(d), 9, step=None),
        r"trainer-rank0\.jsonl: line 9: step event: field step: expected a whole number, got null",
    ),
    "step text": (
        lambda d: edit_line(trainer_file(d), 9, step="x"),
        r"trainer-rank0\.jsonl: line 9: step event: field step: expected a whole number, got 'x'",
    ),
    "profile not an object": (
        lambda d: edit_manifest(d, profile="nope"),
        r"run\.json: field profile: expected an object, got 'nope'",
    ),
    "prediction without a tenant": (
        prediction_without_tenant,
        r"finetuned\.jsonl: line 2: field tenant: missing",
    ),
}


@pytest.mark.parametrize("command", ["report", "replay", "compare", "export"])
@pytest.mark.parametrize("damage", list(TYPED_DAMAGE))
def test_every_reader_names_a_field_of_the_wrong_type_in_one_line(
    run_dir: Path, command: str, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each gave a traceback (replay's with exit 0): the record check types every field; every reader
    asks it first."""
    other = Path(shutil.copytree(run_dir, run_dir.parent / "20261130-060000-tiny-cpu-good"))
    damage_it, message = TYPED_DAMAGE[damage]
    damage_it(run_dir)
    extra = {
        "compare": [other.name, "--format", "md"],
        "export": ["--format", "csv", "--output", str(run_dir.parent / "x.csv")],
    }.get(command, [])
    code = cli.main([command, run_dir.name, *extra, "--runs-dir", str(run_dir.parent)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_BAD_INPUT, err
    assert re.search(message, err) and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: edit_line(trainer_file(d), 4, t="abc"),
        lambda d: edit_manifest(d, status="running", supervisor_pid="abc"),
        lambda d: edit_line(trainer_file(d), 9, step=None),
    ],
    ids=["t not a number", "supervisor_pid not a number", "step null"],
)
def test_ls_lists_the_other_runs_and_marks_a_record_with_a_wrong_typed_field(
    run_dir: Path, damage: object, capsys: pytest.CaptureFixture[str]
) -> None:
    good = Path(shutil.copytree(run_dir, run_dir.parent / "20261130-060000-tiny-cpu-good"))
    damage(run_dir)  # type: ignore[operator]
    assert cli.main(["ls", "--format", "json", "--runs-dir", str(run_dir.parent)]) == 0
    rows = {row["run"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows[run_dir.name]["status"] == "unreadable" and "expected" in rows[run_dir.name]["diagnosis"]
    assert rows[good.name]["status"] == "finished" and rows[good.name]["step"] == 400


def test_ls_shows_a_run_folder_without_run_json(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It silently vanished from the list (issue 27, item 25)."""
    lost = Path(shutil.copytree(run_dir, run_dir.parent / "20261130-060000-tiny-cpu-lost"))
    (lost / "run.json").unlink()
    (run_dir.parent / ".hidden").mkdir()
    assert cli.main(["ls", "--format", "json", "--runs-dir", str(run_dir.parent)]) == 0
    rows = {row["run"]: row for row in json.loads(capsys.readouterr().out)}
    assert set(rows) == {run_dir.name, lost.name}
    assert rows[lost.name]["status"] == "no run.json"
    assert rows[lost.name]["diagnosis"].startswith(f"{lost / 'run.json'}: missing")
    assert cli.main(["ls", "--runs-dir", str(run_dir.parent)]) == 0
    assert "no run.json" in capsys.readouterr().out
    for command in (["report", lost.name], ["replay", lost.name]):  # not a run to act on: said in one line
        assert cli.main([*command, "--runs-dir", str(run_dir.parent)]) == cli.EXIT_BAD_INPUT
        assert "no run" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [["report", ""], ["replay", ""], ["export", "", "--format", "csv"], ["compare", "", "x"], ["stop", ""],
     ["resume", ""], ["eval", ""], ["attach", ""], ["join", "", "--node-rank", "1"], ["import", ""],
     ["import", "", "--predictions", "api=x.jsonl"], ["report", " "]],
    ids=lambda c: " ".join(repr(a) if not a.strip() else a for a in c),
)  # fmt: skip
def test_an_empty_run_is_refused_not_taken_for_a_prefix_of_every_run(
    run_dir: Path, command: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`report ''` acted on the only run (every id starts with ''), and `replay ''` / `import ''` would have
    read the current folder; each is refused in one line, exit 2 (issue 27, item 20)."""
    monkeypatch.chdir(run_dir)  # '' is also the current folder: here a run record itself
    monkeypatch.setenv("COCKPIT_CACHE", str(run_dir.parent / "cache"))
    code = cli.main([*command, "--runs-dir", str(run_dir.parent)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_BAD_INPUT and "Traceback" not in err
    said = ("RUN is empty", "no such file", "give a RUN")  # `eval ''` is `eval` with no RUN
    assert len(err.strip().splitlines()) == 1 and any(s in err for s in said), err
    assert load_manifest(run_dir)["status"] == "finished" and not (run_dir / "control" / "stop").exists()
