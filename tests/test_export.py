"""`cockpit export`: the record's series as trackio CSV and as TensorBoard event files, read back.

TensorBoard's own reader (the `tensorboard` package's event accumulator) must find every step's loss
and every validation loss the record holds, at the same step (TensorBoard keeps 32-bit floats).
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from compare_helpers import lr_run

from cockpit import cli
from cockpit.export import STEP_METRICS
from cockpit.record import read_events


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return lr_run(tmp_path, 0.005, name="20261130-100000-tiny-cpu-aaaa", steps=120, seed=3)


def test_tensorboard_reads_back_the_exported_losses(run: Path, tmp_path: Path, capsys) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = tmp_path / "tb"
    assert cli.main(["export", str(run), "--format", "tensorboard", "--output", str(logdir)]) == 0
    assert capsys.readouterr().out.strip() == str(logdir)
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    steps = read_events(run, "step")
    loss = acc.Scalars("loss")
    assert [s.step for s in loss] == [e["step"] for e in steps]
    assert [s.value for s in loss] == [float(np.float32(e["loss"])) for e in steps]
    assert [s.wall_time for s in loss] == pytest.approx([e["t"] for e in steps])
    vals = read_events(run, "val_loss")
    assert [(s.step, s.value) for s in acc.Scalars("val/loss")] == [
        (e["step"], float(np.float32(e["loss"]))) for e in vals
    ]
    assert [s.value for s in acc.Scalars("tokens/s")] == [float(np.float32(e["tokens_per_s"])) for e in steps]


def test_csv_is_trackios_import_format(run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run.csv"
    assert cli.main(["export", str(run), "--format", "csv", "--output", str(out)]) == 0
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    header = list(rows[0])
    assert header[:2] == ["step", "timestamp"]
    # trackio keeps the first 10 letters, digits and "/" of a column: every name survives as it is.
    assert all(re.fullmatch(r"[A-Za-z0-9/]{1,10}", name) for name in header[2:]), header
    steps = read_events(run, "step")
    loss_rows = [r for r in rows if r["loss"]]
    assert [(int(r["step"]), float(r["loss"])) for r in loss_rows] == [(e["step"], e["loss"]) for e in steps]
    assert [float(r["lr"]) for r in loss_rows] == [e["learning_rate"] for e in steps]
    assert all(r["timestamp"].startswith("2026-") for r in rows)  # a cockpit run: wall time, ISO 8601
    vals = [(int(r["step"]), float(r["val/loss"])) for r in rows if r["val/loss"]]
    assert vals == [(e["step"], e["loss"]) for e in read_events(run, "val_loss")]
    assert set(STEP_METRICS) & set(header) >= {"loss", "lr", "gradnorm", "tokens/s"}


def test_an_imported_log_without_wall_time_leaves_the_timestamp_empty(tmp_path: Path, capsys) -> None:
    state = tmp_path / "trainer_state.json"
    state.write_text('{"log_history": [{"loss": 2.0, "step": 1}, {"loss": 1.5, "step": 2}], "max_steps": 2}')
    out = tmp_path / "state.csv"
    assert cli.main(["export", str(state), "--format", "csv", "--output", str(out)]) == 0
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["step"], r["timestamp"], r["loss"]) for r in rows] == [("1", "", "2.0"), ("2", "", "1.5")]


def test_without_tensorboard_the_error_is_one_line(run: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    for name in [m for m in sys.modules if m == "tensorboard" or m.startswith("tensorboard.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # what an environment without it gives
    assert cli.main(["export", str(run), "--format", "tensorboard", "--output", str(tmp_path / "tb")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'cockpit[tensorboard]'" in err
