"""The record's one schema (`cockpit.record.schema`): every reader goes through it, and it is the writers'.

A field of the wrong type (`"step": null`, `"t": "abc"`, `profile: "nope"` in run.json, a prediction
without a tenant) is damage that the record check names by file, line and field, on every path a line
can take (the tail, the bulk reader's fast columns, the check); the records of real runs and docs/record.md's
event table agree with the schema; a NaN or infinite number is written as a word JSON allows and read
back as the number.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest

from cockpit.record import EventWriter, RecordError, RunReader, check_record, load_manifest, read_events
from cockpit.record.bulk import MIN_FAST_LINES, read_file, read_record
from cockpit.record.scalars import load_scalars
from cockpit.record.schema import EVENTS, HEADER, MANIFEST

ROOT = Path(__file__).resolve().parent.parent
RECORDS = sorted(p for p in (ROOT / "tests" / "fixtures" / "records").iterdir() if p.is_dir())


def test_every_real_record_is_well_typed_and_its_fields_are_the_schemas() -> None:
    """The fixtures are real runs' records: the check passes them, and every field their writers wrote is
    listed (a writer's new field goes into the schema with its type)."""
    unlisted: set[str] = set()
    for run_dir in RECORDS:
        manifest = check_record(run_dir)
        unlisted |= {f"run.json {k}" for k in manifest if k not in MANIFEST}
        for e in read_events(run_dir):
            if e["kind"] not in EVENTS:
                unlisted.add(f"kind {e['kind']}")
                continue
            unlisted |= {f"{e['kind']}.{k}" for k in e if k not in HEADER and k not in EVENTS[e["kind"]]}
    assert unlisted == set()


def test_the_record_pages_event_table_names_the_schemas_kinds() -> None:
    text = (ROOT / "docs" / "record.md").read_text(encoding="utf-8")
    table = text[text.index("| kind | writer | fields |") :].split("\n\n", 1)[0]
    kinds = {k for row in table.splitlines()[2:] for k in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert kinds == set(EVENTS)


# --- wrong types are damage, named by file, line and field ---------------------------------------------
def step_line(step: int, **fields: object) -> dict[str, object]:
    return {
        "t": 1e9 + step,
        "kind": "step",
        "rank": 0,
        "step": step,
        "loss": 2.0,
        "tokens_per_s": 1.0,
        **fields,
    }


WRONG = {
    "step null": ({"step": None}, "step event: field step: expected a whole number, got null"),
    "step text": ({"step": "x"}, "step event: field step: expected a whole number, got 'x'"),
    "step half": ({"step": 2.5}, "step event: field step: expected a whole number, got 2.5"),
    "no step": ({"step": ...}, "step event: field step: missing"),
    "t text": ({"t": "abc"}, "not an event: field t: expected a finite number (Unix seconds), got 'abc'"),
    "t nan": ({"t": "nan"}, "not an event: field t: expected a finite number (Unix seconds), got 'nan'"),
    "rank text": ({"rank": "0"}, "not an event: field rank: expected a whole number, got '0'"),
    "loss text": (
        {"loss": "low"},
        "step event: field loss: expected a number (or nan, inf, -inf), got 'low'",
    ),
    "loss bool": ({"loss": True}, "step event: field loss: expected a number (or nan, inf, -inf), got True"),
}


def write_lines(path: Path, rows: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{k: v for k, v in r.items() if v is not ...} for r in rows]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("lines", [3, MIN_FAST_LINES * 2], ids=["short", "long (the bulk reader's columns)"])
@pytest.mark.parametrize("case", list(WRONG))
def test_a_field_of_the_wrong_type_is_damage_on_every_path(tmp_path: Path, case: str, lines: int) -> None:
    change, message = WRONG[case]
    rows = [step_line(i) for i in range(1, lines + 1)]
    rows[1] = {**rows[1], **change}
    path = tmp_path / "events" / "trainer-rank0.jsonl"
    write_lines(path, rows)
    expected = rf"^{re.escape(str(path))}: line 2: {re.escape(message)}$"
    with pytest.raises(RecordError, match=expected):
        check_record_events(tmp_path)
    with pytest.raises(RecordError, match=expected):
        RunReader(tmp_path).poll()
    with pytest.raises(RecordError, match=expected):
        list(read_file(path))
    assert len(RunReader(tmp_path, strict=False).poll()) == lines - 1  # a viewer counts it and goes on


def check_record_events(run_dir: Path) -> None:
    from cockpit.record.check import check_events

    check_events(run_dir)


def test_a_telemetry_list_and_a_tenant_loss_are_typed_inside(tmp_path: Path) -> None:
    path = tmp_path / "events" / "telemetry.jsonl"
    write_lines(path, [{"t": 1.0, "kind": "telemetry", "gpu_mem_used_mib": [1.0, "a"]}])
    with pytest.raises(
        RecordError, match="telemetry event: field gpu_mem_used_mib: expected a list of numbers"
    ):
        RunReader(tmp_path).poll()
    write_lines(path, [{"t": 1.0, "kind": "val_loss", "step": 3, "tenant_loss": {"acme": "high"}}])
    with pytest.raises(RecordError, match="val_loss event: field tenant_loss: expected an object of numbers"):
        RunReader(tmp_path).poll()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A copy of a real record with a report's predictions (tiny-cpu, evaluated)."""
    return Path(shutil.copytree(RECORDS[-1], tmp_path / "runs" / RECORDS[-1].name))


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("profile", "nope", "field profile: expected an object, got 'nope'"),
        ("supervisor_pid", "abc", "field supervisor_pid: expected a whole number, got 'abc'"),
        (
            "created_at",
            "yesterday",
            "field created_at: expected a number (or nan, inf, -inf), got 'yesterday'",
        ),
        ("status", 3, "field status: expected text, got 3"),
    ],
)
def test_a_manifest_field_of_the_wrong_type_is_named(
    run_dir: Path, field: str, value: object, expected: str
) -> None:
    manifest = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**manifest, field: value}))
    with pytest.raises(
        RecordError, match=rf"^{re.escape(str(run_dir / 'run.json'))}: {re.escape(expected)}$"
    ):
        load_manifest(run_dir)


def test_a_prediction_without_a_tenant_is_damage(run_dir: Path) -> None:
    path = run_dir / "predictions" / "api.jsonl"
    path.parent.mkdir(exist_ok=True)
    path.write_text('{"meta": {"system": "api"}}\n{"id": "a1", "pred": "ORG", "gold": "ORG"}\n')
    with pytest.raises(RecordError, match=rf"^{re.escape(str(path))}: line 2: field tenant: missing$"):
        check_record(run_dir)
    path.write_text('{"tenant": "acme", "id": "a1", "pred": "ORG", "scores": {"ORG": -1.0}}\n')
    with pytest.raises(RecordError, match=r"line 1: field gold: missing \(a scored prediction"):
        check_record(run_dir)


# --- NaN and infinity: written as words JSON allows, read back as the numbers (issue 27, item 22) -------
def test_a_diverged_step_keeps_its_nan_and_inf_on_every_path(tmp_path: Path) -> None:
    """The trainer's writer puts NaN and infinity as words; the tail, the bulk reader and the scalars all
    give the numbers back, so the viewers show `nan` and `inf` rather than a missing reading."""
    from cockpit.headless import step_line
    from cockpit.record.view import RunView

    path = tmp_path / "events" / "trainer-rank0.jsonl"
    clock = iter(range(1, 1000))
    with EventWriter(path, rank=0, clock=lambda: float(next(clock))) as w:
        for step in range(1, MIN_FAST_LINES * 2):
            w.write("step", step=step, loss=2.0 / step, tokens_per_s=100.0)
        w.write("step", step=MIN_FAST_LINES * 2, loss=math.nan, tokens_per_s=math.inf)
        w.write("val_loss", step=MIN_FAST_LINES * 2, loss=math.inf, tenant_loss={"acme": math.nan})
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text and '"loss":"nan"' in text  # valid JSON
    check_record_events(tmp_path)
    last = RunReader(tmp_path).poll()[-2:]
    assert math.isnan(last[0]["loss"]) and last[0]["tokens_per_s"] == math.inf
    assert last[1]["loss"] == math.inf and math.isnan(last[1]["tenant_loss"]["acme"])
    blocks, events, _, _ = read_record(tmp_path / "events")
    view = RunView()
    for block in blocks:
        view.apply_block(block)
    view.apply(events)
    assert math.isnan(view.last_loss) and view.val_loss == math.inf
    assert "loss nan  val inf" in step_line(view)  # the headless line of a live run: diverged, and says so
    scalars = load_scalars(tmp_path)
    assert math.isnan(scalars.column("loss")[-1]) and scalars.column("tokens_per_s")[-1] == math.inf
