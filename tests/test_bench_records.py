"""benchmarks/rehearsal_accuracy.py --records: a kept record reads back as the run it came from."""

from pathlib import Path

from benchmarks.rehearsal_accuracy import keep_record
from cockpit.record import read_events
from cockpit.rehearse.measure import depth_measures

RECORD = Path(__file__).resolve().parent.parent / "benchmarks/results/forecast/records/offload_4-16_lean"


def test_a_kept_record_gives_the_forecast_the_same_depths(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "events").mkdir(parents=True)
    for part in ("run.json", "plan.json"):
        (run / part).write_bytes((RECORD / part).read_bytes())
    for stream in (RECORD / "events").glob("*.jsonl"):
        (run / "events" / stream.name).write_bytes(stream.read_bytes())
    (run / "output.log").write_text("not part of what a forecast reads\n")
    (run / "checkpoint-8").mkdir()

    keep_record(run, tmp_path / "kept" / "nf4-offload_4-8-16")

    kept = tmp_path / "kept" / "nf4-offload_4-8-16"
    assert sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file()) == sorted(
        ["run.json", "plan.json", *(f"events/{s.name}" for s in (RECORD / "events").glob("*.jsonl"))]
    )
    original = [m.to_dict() for m in depth_measures(read_events(run))]
    assert original and [m.to_dict() for m in depth_measures(read_events(kept))] == original
