"""`cockpit rehearse` refuses bad input in one line, exit 2, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from cockpit.cli import main
from cockpit.record import write_manifest


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--layers", "4"], "two different depths"),
        (["--layers", "1,1"], "two different depths"),
        (["--layers", "0,2"], "expected depths of at least one layer"),
        (["--layers", "1,9"], "deeper than the model (4 layers)"),
        (["--layers", "1,x"], "expected depths of at least one layer, like 1,2,4"),
        (["--steps", "2"], "argument --steps: 2: expected a whole number of at least 3"),
        (["--steps", "nan"], "argument --steps: 'nan'"),
        (["--gpus", "8"], "--gpus 8: this machine has"),
        (["--eval-only", "--no-eval"], "--eval-only and --no-eval: choose one"),
        (["--eval-tokens", "3"], "argument --eval-tokens: 3: expected a whole number of at least 4"),
        (["--gpus", "-1"], "argument --gpus: -1: expected a whole number from 0"),
        (["--set", "training.learning_rate=inf"], "training.learning_rate: Input should be a finite number"),
        (["--set", 'model.loader="transformers"'], "model.loader"),
        (
            ["--set", "training.bf16=true", "--set", 'quantization.storage_dtype="bfloat16"', "--gpus", "0"],
            "training.bf16: a bf16 rehearsal needs a GPU",
        ),
    ],
)
def test_bad_rehearsal_input_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], words: str
) -> None:
    runs = tmp_path / "runs"
    assert main(["rehearse", "--no-ui", "--runs-dir", str(runs), *args]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not runs.exists() or not any(runs.iterdir())


def test_show_refuses_a_run_that_is_not_a_rehearsal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "runs" / "20260101-000000-tiny-cpu-0000"
    run.mkdir(parents=True)
    write_manifest(run, {"run_id": run.name, "status": "finished", "mode": "train"})
    assert main(["rehearse", "--runs-dir", str(tmp_path / "runs"), "--show", run.name]) == 2
    assert "is not a rehearsal" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["resume", "eval"])
def test_a_rehearsal_cannot_be_resumed_or_evaluated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    run = tmp_path / "runs" / "20260101-000000-tiny-cpu-0000"
    run.mkdir(parents=True)
    write_manifest(run, {"run_id": run.name, "status": "finished", "mode": "rehearse"})
    assert main([command, "--runs-dir", str(tmp_path / "runs"), run.name]) == 2
    assert "is a rehearsal and cannot be" in capsys.readouterr().err


def test_default_depths_past_the_window_are_dropped_deepest_first_where_they_do_not_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without --layers: the offload defaults (the window and twice it) lose their deepest depths until
    the slices fit here; the shallow defaults stay for the preflight to refuse on its own terms."""
    from cockpit.rehearse import run
    from cockpit.service import lifecycle

    def fits_up_to(deepest: int):
        def preflight(here, geometry, depths) -> None:
            if max(depths) > deepest:
                raise run.RehearsalError(f"depth {max(depths)} does not fit here")

        return preflight

    monkeypatch.setattr(run, "preflight", fits_up_to(4))
    assert lifecycle._default_depths_here(None, None, [1, 2, 3, 4, 6]) == [1, 2, 3, 4]
    assert lifecycle._default_depths_here(None, None, [1, 2, 4, 8]) == [1, 2, 4]
    monkeypatch.setattr(run, "preflight", fits_up_to(1))
    assert lifecycle._default_depths_here(None, None, [1, 2, 4, 8]) == [1, 2, 4]  # refused later
