"""`cockpit import PATH` and `cockpit replay PATH`: foreign logs in, the same losses out.

The HF Trainer output directory and console log come from a real run of plain `transformers.Trainer`
outside the cockpit (`tests/plain_hf_run.py`: 8 steps of a tiny random Qwen3-MoE on the CPU, a few
seconds); the LLaMA-Factory log is the fixture written from its documented format. Each is imported,
then replayed through the viewers' own `Playback`, and the losses read back are compared with what the
source holds.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tui_helpers import sync, wait_for

from cockpit import cli
from cockpit.app.app import CockpitApp
from cockpit.cli import common
from cockpit.importers import ForeignLogError, read_foreign
from cockpit.record import load_manifest, read_events
from cockpit.record.playback import Playback
from cockpit.service.runs import find_run

HERE = Path(__file__).resolve().parent
LLAMAFACTORY = HERE / "fixtures" / "imports" / "llamafactory" / "trainer_log.jsonl"


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A real HF Trainer output directory and its console log (stdout and stderr, as `> log 2>&1`)."""
    root = tmp_path_factory.mktemp("plain-hf")
    out, log = root / "output", root / "console.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(HERE.parent)}
    with open(log, "wb") as f:
        subprocess.run(
            [sys.executable, str(HERE / "plain_hf_run.py"), str(out)],
            stdout=f, stderr=subprocess.STDOUT, env=env, check=True, timeout=300,
        )  # fmt: skip
    return out, log


def history(out: Path) -> list[dict]:
    """The trainer's own log history, from its last checkpoint."""
    last = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    return json.loads((last / "trainer_state.json").read_text())["log_history"]


def replayed(run_dir: Path) -> Playback:
    """The record as a replay shows it at its end."""
    pb = Playback(run_dir, live=False, speed=1.0, now=lambda: 0.0)
    pb.load()
    pb.command("end")
    pb.tick()
    return pb


def import_cli(path: Path, runs: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert cli.main(["import", str(path), "--runs-dir", str(runs)]) == 0
    return Path(capsys.readouterr().out.strip())


@pytest.mark.e2e  # a real HF Trainer run (plain_run)
def test_hf_output_dir_replays_the_trainers_own_losses(plain_run, tmp_path, capsys) -> None:
    out, _ = plain_run
    run_dir = import_cli(out, tmp_path / "runs", capsys)
    trained = [e for e in history(out) if "loss" in e]
    pb = replayed(run_dir)
    assert [(s.step, s.loss) for s in pb.view.steps] == [(e["step"], e["loss"]) for e in trained]
    assert [s.learning_rate for s in pb.view.steps] == [e["learning_rate"] for e in trained]
    evals = [(e["step"], e["eval_loss"]) for e in history(out) if "eval_loss" in e]
    assert [(e["step"], e["loss"]) for e in read_events(run_dir, "val_loss")] == evals
    imported = load_manifest(run_dir)["imported"]
    assert imported["clock"] == "elapsed" and imported["finished"]
    assert "cuda_peak_alloc_mib" in imported["absent"]  # a CPU run: no CUDA memory, and none made up


@pytest.mark.e2e  # a real HF Trainer run (plain_run)
def test_console_log_replays_the_printed_losses(plain_run, tmp_path, capsys) -> None:
    """The console holds the losses as HF printed them (4 significant digits), at the bar's steps."""
    out, log = plain_run
    run_dir = import_cli(log, tmp_path / "runs", capsys)
    trained = [e for e in history(out) if "loss" in e]
    pb = replayed(run_dir)
    assert [s.step for s in pb.view.steps] == [e["step"] for e in trained]
    assert [s.loss for s in pb.view.steps] == [float(f"{e['loss']:.4g}") for e in trained]
    evals = [(e["step"], float(f"{e['eval_loss']:.4g}")) for e in history(out) if "eval_loss" in e]
    assert [(e["step"], e["loss"]) for e in read_events(run_dir, "val_loss")] == evals
    assert load_manifest(run_dir)["imported"]["notes"] == []  # steps from the bar, not guessed


@sync
@pytest.mark.e2e  # a real HF Trainer run (plain_run)
async def test_replay_opens_the_app_on_a_foreign_log(plain_run, tmp_path, monkeypatch) -> None:
    """`cockpit replay PATH` imports into the cache once and shows the run: the header's last loss."""
    out, _ = plain_run
    monkeypatch.setenv("COCKPIT_CACHE", str(tmp_path / "cache"))
    run_dir = common.run_or_log(str(out), tmp_path / "runs")
    assert common.run_or_log(str(out), tmp_path / "runs") == run_dir  # cached: not imported again
    app = CockpitApp(playback=Playback(run_dir, live=False, speed=1024.0))
    async with app.run_test(size=(120, 40)) as pilot:
        app.action_jump_end()
        await wait_for(pilot, lambda: bool(app.last_snapshot and app.last_snapshot.header.step == 8))
        assert app.last_snapshot.header.loss == [e for e in history(out) if "loss" in e][-1]["loss"]


def test_llamafactory_log_replays_its_losses(tmp_path, capsys) -> None:
    run_dir = import_cli(LLAMAFACTORY, tmp_path / "runs", capsys)
    rows = [json.loads(line) for line in LLAMAFACTORY.read_text().splitlines()]
    trained = [r for r in rows if "loss" in r]
    pb = replayed(run_dir)
    assert [(s.step, s.loss, s.learning_rate) for s in pb.view.steps] == [
        (r["current_steps"], r["loss"], r["lr"]) for r in trained
    ]
    evals = [(r["current_steps"], r["eval_loss"]) for r in rows if "eval_loss" in r]
    assert [(e["step"], e["loss"]) for e in read_events(run_dir, "val_loss")] == evals
    steps = read_events(run_dir, "step")
    # The clock is tokens over throughput (sub-second), so tokens/s between two lines is a real rate.
    t = [r["total_tokens"] / r["throughput"] for r in trained]
    assert [e["t"] for e in steps] == pytest.approx(t, abs=1e-3)
    rate = (trained[1]["total_tokens"] - trained[0]["total_tokens"]) / (t[1] - t[0])
    assert steps[1]["tokens_per_s"] == pytest.approx(rate, rel=1e-3)
    assert steps[0]["cuda_peak_alloc_mib"] == pytest.approx(trained[0]["vram_allocated"] * 1024)
    assert load_manifest(run_dir)["status"] == "finished"


def test_llamafactory_output_dir_is_found_by_its_log(tmp_path: Path) -> None:
    folder = tmp_path / "saves"
    folder.mkdir()
    (folder / "trainer_log.jsonl").write_text(LLAMAFACTORY.read_text())
    (folder / "trainer_state.json").write_text(json.dumps({"log_history": []}))
    assert read_foreign(folder).format == "llamafactory"


# --- noisy, cut off, DeepSpeed ----------------------------------------------------------------------
BAR = "\r{pct:3d}%|{bar:<10}| {n}/{total} [00:0{n}<00:10,  1.00it/s]"


def noisy_console(steps: int = 6, total: int = 10, cut: bool = True) -> tuple[str, list[float]]:
    """An HF + DeepSpeed console as a user keeps it: tqdm redraws, warnings, DeepSpeed's step, speed and
    memory lines, older transformers' float dicts, and (with `cut`) a last dict cut off mid-line."""
    losses = [round(3.0 - 0.2 * s, 4) for s in range(1, steps + 1)]
    out = [
        "[2026-11-30 10:00:00,000] [INFO] [real_accelerator.py:203:get_accelerator] Setting ds_accelerator",
        "Before initializing optimizer states",
        "MA 1.25 GB         Max_MA 2.5 GB         CA 2.75 GB         Max_CA 3 GB ",
        "CPU Virtual Memory:  used = 45.21 GB, percent = 4.5%",
        "/site-packages/torch/utils/checkpoint.py:85: UserWarning: None of the inputs have requires_grad",
        "  0%|          | 0/10 [00:00<?, ?it/s]",
    ]
    text = "\n".join(out)
    for s, loss in enumerate(losses, 1):
        bar = BAR.format(pct=s * 10, bar="█" * s, n=s, total=total)
        text += (
            bar
            + "\r"
            + " " * 40
            + "\r"
            + str({"loss": loss, "grad_norm": 1.5, "learning_rate": 1e-4, "epoch": s / 10})
        )
        text += "\n" + bar
        text += (
            f"\n[2026-11-30 10:00:{10 + 2 * s:02d},000] [INFO] [logging.py:128:log_dist] [Rank 0] "
            f"step={s}, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]"
            f"\n[2026-11-30 10:00:{10 + 2 * s:02d},001] [INFO] [timer.py:264:stop] epoch=0/micro_step={s}/"
            f"global_step={s}, RunningAvgSamplesPerSec=7.5, CurrSamplesPerSec=7.{s}, MemAllocated=4.31GB, "
            f"MaxMemAllocated=9.8{s}GB\n"
        )
    if cut:
        text += BAR.format(pct=70, bar="███████", n=7, total=total) + "\r{'loss': 1.6, 'grad_no"
    return text, losses


def test_a_noisy_cut_off_console_imports_what_is_there_and_says_what_was_skipped(tmp_path, capsys) -> None:
    text, losses = noisy_console()
    log = tmp_path / "train.log"
    log.write_text(text)
    run_dir = import_cli(log, tmp_path / "runs", capsys)
    steps = read_events(run_dir, "step")
    assert [(e["step"], e["loss"]) for e in steps] == [(s, loss) for s, loss in enumerate(losses, 1)]
    assert [e["cuda_peak_alloc_mib"] for e in steps] == pytest.approx(
        [(9.8 + s / 100) * 1024 for s in range(1, 7)]
    )
    assert [e["samples_per_s"] for e in steps] == pytest.approx([7 + s / 10 for s in range(1, 7)])
    load = read_events(run_dir, "load_peak")[0]
    assert load["cuda_peak_alloc_mib"] == pytest.approx(2.5 * 1024)
    imported = load_manifest(run_dir)["imported"]
    assert imported["clock"] == "wall" and not imported["finished"]
    last_line = text.count("\n") + 1
    assert imported["skipped"] == [f"1 cut-off log dict at the end (first at line {last_line})"]
    assert "tokens_per_s" in imported["absent"]
    assert (
        load_manifest(run_dir)["diagnosis"] == "the imported log ends at step 6 of 10: the rest is not in it"
    )


def test_the_cli_says_what_was_skipped_and_absent(tmp_path, capsys) -> None:
    text, _ = noisy_console()
    log = tmp_path / "train.log"
    log.write_text(text)
    assert cli.main(["import", str(log), "--runs-dir", str(tmp_path / "runs")]) == 0
    err = capsys.readouterr().err
    assert "6 steps" in err and "cut off before its end" in err
    assert f"skipped: 1 cut-off log dict at the end (first at line {text.count(chr(10)) + 1})" in err
    assert "absent (not in the log): tokens_per_s" in err


def test_dicts_printed_apart_from_the_bar_are_numbered_and_said_so(tmp_path: Path) -> None:
    """stdout buffered apart from stderr: every dict after the last bar. Steps are counted, with a note."""
    text, losses = noisy_console(cut=False)
    dicts = [line for line in text.replace("\r", "\n").split("\n") if line.startswith("{")]
    rest = [line for line in text.replace("\r", "\n").split("\n") if not line.startswith("{")]
    log = tmp_path / "buffered.log"
    log.write_text("\n".join(rest + dicts) + "\n")
    imported = read_foreign(log)
    assert sorted(imported.steps) == list(range(1, len(losses) + 1))
    assert [imported.steps[s]["loss"] for s in sorted(imported.steps)] == losses
    assert any("numbered by log dict" in note for note in imported.notes)


def test_a_checkpoint_state_adds_the_steps_a_resumed_history_lacks(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "checkpoint-2").mkdir(parents=True)
    (out / "checkpoint-4").mkdir()
    first = [{"loss": 2.0, "step": 1}, {"loss": 1.9, "step": 2}]
    later = [{"loss": 1.8, "step": 3}, {"loss": 1.7, "step": 4}, {"eval_loss": 1.75, "step": 4}]
    (out / "checkpoint-2" / "trainer_state.json").write_text(
        json.dumps({"log_history": first, "max_steps": 4})
    )
    (out / "checkpoint-4" / "trainer_state.json").write_text(
        json.dumps({"log_history": later, "max_steps": 4, "global_step": 4})
    )
    imported = read_foreign(out)
    assert {s: f["loss"] for s, f in imported.steps.items()} == {1: 2.0, 2: 1.9, 3: 1.8, 4: 1.7}
    assert imported.finished and imported.clock == "step" and "wall time" in imported.absent


# --- bad input: one line, exit 2 ---------------------------------------------------------------------
BAD = {
    "empty.log": (b"", "empty file"),
    "blank.json": (b"\n  \n", "empty file"),
    "weights.bin": (bytes(range(256)) * 4, "binary file"),
    "config.json": (b'{"model_type": "qwen3_moe", "hidden_size": 128}', "JSON of another shape"),
    "list.json": (b"[1, 2, 3]", "JSON of another shape"),
    "state.json": (b'{"log_history": {"loss": 1}}', "no `log_history` list"),
    "rows.jsonl": (b'{"id": 1, "text": "a"}\n{"id": 2, "text": "b"}\n', "without `current_steps`"),
    "notes.txt": (b"epoch one went well\nloss looked fine\n", "no HF Trainer log dicts"),
    "only_eval.jsonl": (b'{"current_steps": 5, "total_steps": 10, "eval_loss": 1.0}\n', "no training step"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_is_one_line_and_exit_2(name: str, tmp_path: Path, capsys) -> None:
    data, words = BAD[name]
    path = tmp_path / name
    path.write_bytes(data)
    assert cli.main(["import", str(path), "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert str(path) in err and words in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_folder_with_no_log_and_a_missing_path_are_one_line_errors(tmp_path: Path, capsys) -> None:
    for args in (["import", str(tmp_path)], ["import", str(tmp_path / "nope")], ["replay", str(tmp_path)]):
        assert cli.main([*args, "--runs-dir", str(tmp_path / "runs")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err


def test_import_with_predictions_keeps_its_meaning(tmp_path: Path, capsys) -> None:
    """`import RUN --predictions NAME=FILE` still looks RUN up among the runs (and says when it is none)."""
    assert cli.main(["import", "nope", "--predictions", "api=x.jsonl", "--runs-dir", str(tmp_path)]) == 2
    assert "no run 'nope'" in capsys.readouterr().err


def test_an_imported_run_cannot_be_resumed_or_evaluated(tmp_path: Path, capsys) -> None:
    run_dir = import_cli(LLAMAFACTORY, tmp_path / "runs", capsys)
    for command in (["resume", str(run_dir)], ["eval", str(run_dir)]):
        assert cli.main(command) == 2
        assert "imported log" in capsys.readouterr().err


def test_read_foreign_refuses_a_run_record(tmp_path: Path, capsys) -> None:
    run_dir = import_cli(LLAMAFACTORY, tmp_path / "runs", capsys)
    with pytest.raises(ForeignLogError, match="already a cockpit run record"):
        read_foreign(run_dir)


def test_replay_of_a_log_imports_it_before_asking_for_a_terminal(tmp_path: Path, monkeypatch, capsys) -> None:
    """Without a terminal, `cockpit replay PATH` still reads the log (bad input would be said first), then
    refuses to draw; the cached record is there for the next replay."""
    monkeypatch.setenv("COCKPIT_CACHE", str(tmp_path / "cache"))
    assert cli.main(["replay", str(LLAMAFACTORY), "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "imported" in err and "needs a terminal" in err.splitlines()[-1]
    (cached,) = (tmp_path / "cache" / "imports").iterdir()
    assert load_manifest(cached)["imported"]["format"] == "llamafactory"


# --- report and `latest` with imports in the runs folder (issue 27, items 15 and 16) ----------------------
TRAINED = HERE / "fixtures" / "records" / "20261201-115430-tiny-cpu-d226"  # trained and evaluated


def test_report_on_an_imported_log_says_it_has_no_predictions(tmp_path, capsys) -> None:
    """It was an AttributeError in report/build.py (an import's manifest has no profile)."""
    run_dir = import_cli(LLAMAFACTORY, tmp_path / "runs", capsys)
    for ref in (run_dir.name, "latest"):
        code = cli.main(["report", ref, "--runs-dir", str(tmp_path / "runs")])
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "no training run or evaluation run" in err  # `latest` never names an import


def test_latest_is_the_newest_training_run_even_after_an_import(tmp_path, capsys) -> None:
    runs = tmp_path / "runs"
    trained = Path(shutil.copytree(TRAINED, runs / TRAINED.name))
    imported = import_cli(LLAMAFACTORY, runs, capsys)  # newer than the training run
    assert imported.name > trained.name
    assert find_run(runs, "latest") == trained
    out = tmp_path / "latest.csv"
    assert (
        cli.main(["export", "latest", "--format", "csv", "--output", str(out), "--runs-dir", str(runs)]) == 0
    )
    capsys.readouterr()
    assert len(out.read_text().splitlines()) > 150  # the training run's 150 steps, not the import's few
    assert cli.main(["compare", imported.name, "latest", "--format", "json", "--runs-dir", str(runs)]) == 0
    runs_compared = [s["run"] for s in json.loads(capsys.readouterr().out)["runs"]]
    assert runs_compared == [imported.name, trained.name]


# --- a diverged run stays diverged (item 22) --------------------------------------------------------------
def lf_line(step: int, loss: float, elapsed: str, total: int = 8) -> str:
    """A LLaMA-Factory trainer_log.jsonl line as its LogCallback writes it (Python's json: NaN, Infinity)."""
    row = {"current_steps": step, "total_steps": total, "loss": loss, "lr": 1e-4, "epoch": step / total,
           "percentage": 100 * step / total, "elapsed_time": elapsed}  # fmt: skip
    return json.dumps(row)


def test_a_nan_or_inf_loss_stays_in_a_llamafactory_import(tmp_path, capsys) -> None:
    """The whole step was dropped, uncounted; now it is a step whose loss is nan (or inf), said in a note,
    and a replay shows it."""
    lines = [
        lf_line(1, 2.0, "0:00:01"),
        lf_line(2, float("nan"), "0:00:02"),
        lf_line(3, float("inf"), "0:00:03"),
    ]
    log = tmp_path / "trainer_log.jsonl"
    log.write_text("\n".join(lines) + "\n")
    assert "NaN" in log.read_text() and "Infinity" in log.read_text()
    run_dir = import_cli(log, tmp_path / "runs", capsys)
    losses = [e["loss"] for e in read_events(run_dir, "step")]
    assert losses[0] == 2.0 and math.isnan(losses[1]) and losses[2] == math.inf
    assert '"loss":"nan"' in (run_dir / "events" / "import.jsonl").read_text()  # JSON, not NaN
    pb = replayed(run_dir)
    assert [s.step for s in pb.view.steps] == [1, 2, 3] and pb.view.last_loss == math.inf
    note = "the loss is nan or inf at 2 step(s), from step 2: the run diverged"
    assert note in load_manifest(run_dir)["imported"]["notes"]


@pytest.mark.parametrize(
    "printed",
    ["{'loss': 'nan', 'grad_norm': 'inf', 'learning_rate': '1e-04', 'epoch': '0.2'}",  # transformers 5
     "{'loss': nan, 'grad_norm': inf, 'learning_rate': 0.0001, 'epoch': 0.2}"],  # earlier: floats
    ids=["strings", "floats"],
)  # fmt: skip
def test_a_nan_loss_stays_in_a_console_import(tmp_path, printed: str) -> None:
    bar = BAR.format(pct=20, bar="██", n=2, total=10)
    first = "{'loss': '2.5', 'grad_norm': '1.0', 'learning_rate': '1e-04', 'epoch': '0.1'}"
    log = tmp_path / "train.log"
    log.write_text(f"{BAR.format(pct=10, bar='█', n=1, total=10)}\r{first}\n{bar}\r{printed}\n{bar}\n")
    imported = read_foreign(log)
    assert sorted(imported.steps) == [1, 2] and not imported.skipped
    assert math.isnan(imported.steps[2]["loss"]) and imported.steps[2]["grad_norm"] == math.inf


def test_a_nan_loss_stays_in_a_trainer_state_import(tmp_path) -> None:
    diverged = {"loss": float("nan"), "grad_norm": float("inf"), "step": 2}
    state = {"log_history": [{"loss": 2.0, "step": 1}, diverged], "max_steps": 2, "global_step": 2}
    (tmp_path / "trainer_state.json").write_text(json.dumps(state))  # as the Trainer writes it: NaN
    imported = read_foreign(tmp_path)
    assert math.isnan(imported.steps[2]["loss"]) and imported.steps[2]["grad_norm"] == math.inf
    assert any("diverged" in note for note in imported.notes)


# --- a resumed LLaMA-Factory log (item 23) ----------------------------------------------------------------
def test_a_resumed_llamafactory_log_is_detected_and_its_clock_does_not_run_backwards(
    tmp_path, capsys
) -> None:
    """LLaMA-Factory appends a resumed run to the same file, its elapsed time back at zero: the first run
    reached step 4, the second resumed from step 2's checkpoint."""
    first = [lf_line(s, 3.0 - 0.1 * s, f"0:00:{10 * s:02d}") for s in (1, 2, 3, 4)]
    second = [lf_line(s, 2.0 - 0.1 * s, f"0:00:{5 * (s - 2):02d}") for s in (3, 4, 5, 6)]
    log = tmp_path / "trainer_log.jsonl"
    log.write_text("\n".join(first + second) + "\n")
    run_dir = import_cli(log, tmp_path / "runs", capsys)
    steps = read_events(run_dir, "step")
    assert [(e["step"], e["loss"]) for e in steps] == [
        (1, 2.9),
        (2, 2.8),
        (3, 1.7),
        (4, 1.6),
        (5, 1.5),
        (6, 1.4),
    ]
    times = [e["t"] for e in steps]
    assert times == sorted(times)
    imported = load_manifest(run_dir)["imported"]
    assert imported["clock"] == "step"
    assert any("a resumed run was appended at line 5 (step 3)" in note for note in imported["notes"])


# --- consoles: DeepSpeed's own lines (items 17 and 24) ----------------------------------------------------
def test_no_deepspeed_note_for_a_console_without_deepspeed_step_lines(tmp_path) -> None:
    """A DeepSpeed info line (its accelerator) is not a step time: no note that its times cover some steps."""
    text, _ = noisy_console(cut=False)
    kept = [line for line in text.split("\n") if "step=" not in line]
    log = tmp_path / "train.log"
    log.write_text("\n".join(kept) + "\n")
    imported = read_foreign(log)
    assert "[INFO]" in log.read_text() and imported.clock == "step"
    assert not any("DeepSpeed" in note for note in imported.notes), imported.notes


def raw_deepspeed(steps: int) -> str:
    """A DeepSpeed console with no HF Trainer: its engine's report at step 0, then a line a step."""
    lines = ["[2026-11-30 10:00:00,000] [INFO] [logging.py:128:log_dist] [Rank 0] step=0, skipped=0, "
             "lr=[0.0], mom=[(0.9, 0.999)]"]  # fmt: skip
    for s in range(1, steps + 1):
        lines.append(
            f"[2026-11-30 10:00:{10 + s:02d},000] [INFO] [logging.py:128:log_dist] [Rank 0] step={s}, "
            f"skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]"
        )
        lines.append(
            f"[2026-11-30 10:00:{10 + s:02d},001] [INFO] [timer.py:264:stop] epoch=0/micro_step={s}/"
            f"global_step={s}, RunningAvgSamplesPerSec=7.5, CurrSamplesPerSec=7.5, MemAllocated=4.31GB, "
            "MaxMemAllocated=9.8GB"
        )
    return "\n".join(lines) + "\n"


def test_a_raw_deepspeed_console_has_no_step_zero_and_is_not_called_stopped(tmp_path, capsys) -> None:
    log = tmp_path / "ds.log"
    log.write_text(raw_deepspeed(5))
    run_dir = import_cli(log, tmp_path / "runs", capsys)
    assert [e["step"] for e in read_events(run_dir, "step")] == [1, 2, 3, 4, 5]
    manifest = load_manifest(run_dir)
    assert manifest["status"] == "finished" and manifest["imported"]["clock"] == "wall"
    assert manifest["diagnosis"] == "the imported log ends at step 5; it states no total number of steps"


def test_a_log_without_a_total_cut_off_mid_line_is_stopped(tmp_path, capsys) -> None:
    """No total to fall short of, but its last line was cut mid-write: the run was still going."""
    dicts = [str({"loss": 2.0 - 0.1 * s, "learning_rate": 1e-4, "epoch": s / 10}) for s in range(1, 4)]
    log = tmp_path / "train.log"
    log.write_text("\n".join(dicts) + "\n{'loss': 1.6, 'learn")
    run_dir = import_cli(log, tmp_path / "runs", capsys)
    manifest = load_manifest(run_dir)
    assert manifest["status"] == "stopped" and manifest["imported"]["cut"]
    assert manifest["diagnosis"] == "the imported log ends at step 3: the rest is not in it"
