"""benchmarks/two_gpus.py without running anything: which units `--parts` picks, the budget's skips, and the
per-GPU tables built from synthetic results."""

import json
import time
from pathlib import Path

import pytest

from benchmarks.two_gpus import UNITS, Ctx, Unit, report, run_units, selected


def names(units: list[Unit]) -> list[str]:
    return [u.name for u in units]


def test_parts_pick_units_in_order_of_importance() -> None:
    assert names(selected("slice-eval,slice", gpu=True)) == ["slice-2", "slice-1", "eval-2", "eval-1"]
    # the rehearsal's nf4-none configuration is the slice's run; DeepSpeed's CPU Adam is built first
    assert names(selected("rehearsal", gpu=True)) == [
        "slice-2",
        "prebuild",
        "rehearsal-nf4-offload",
        "rehearsal-bf16-none",
        "rehearsal-bf16-offload",
    ]
    assert names(selected("tiny-1", gpu=True)) == ["prebuild", "tiny-1"]  # a unit by its name
    cpu = names(selected("", gpu=False))
    assert "two-nodes" in cpu and not any(n.startswith(("rehearsal", "load-share")) for n in cpu)
    assert names(selected("", gpu=True)) == [u.name for u in UNITS]
    with pytest.raises(ValueError, match="unknown slices"):
        selected("slices", gpu=True)


def results() -> dict:
    per_rank = [
        {"rank": r, "local_rank": r, "load_s": 1.5 + r, "gpu_load_gib": 8.0, "gpu_train_gib": 9.0 + r,
         "rss_load_gib": 2.0, "rss_train_gib": 3.0}
        for r in (0, 1)
    ]  # fmt: skip
    two = {"layers": 4, "ranks": 2, "step_s": 0.5, "tokens_per_step": 16000, "tokens_per_s": 32000.0,
           "per_rank": per_rank, "nvml_peak_mib": {"0": 11000.0, "1": 12500.0}}  # fmt: skip
    one = {
        **two,
        "ranks": 1,
        "tokens_per_s": 18000.0,
        "per_rank": per_rank[:1],
        "nvml_peak_mib": {"0": 10500.0},
    }
    check = {"ranks": {"0": {"events": 40, "steps": 24, "local_rank": 0}, "1": {"events": 39, "steps": 24,
             "local_rank": 1}}, "telemetry_gpus": 2, "zero_stage": 3}  # fmt: skip
    measures = [
        {"layers": d, "status": "ok", "ranks": 2, "load_s": 1.0, "gpu_load_gib": {"0": 3.0 + d},
         "gpu_train_gib": {"0": 4.5 + d, "1": 4.0 + d}, "rss_load_gib": {"0": 2.0},
         "rss_train_gib": {"0": 2.75}, "step_s": 0.1 + 0.05 * d, "steps_timed": 6, "tokens_per_step": 16000.0}
        for d in (1, 2, 4)
    ]  # fmt: skip
    gib = 2**30
    evaluation = {
        "gpus": 2,
        "device": "NVIDIA H200",
        "load_s": 12.5,
        "placement": {
            "layers_per_device": {"0": 1, "1": 3},
            "bytes_per_device": {"0": 41 * gib, "1": 5 * gib},
        },
        "layer_devices": [0, 1, 1, 1],
        "load_peak_bytes": [3 * gib, 4 * gib],
        "score": {"peak_bytes": [30 * gib, 4 * gib], "tokens_per_s": 50000.0},
        "think": {"peak_bytes": [3 * gib, 5 * gib], "tokens_per_s": 90.0},
    }
    return {
        "mode": "gpu",
        "depths": [1, 2, 4],
        "machine": {"gpus": [{"name": "NVIDIA H200"}] * 2, "cpus": 32, "versions": {"torch": "2.11.0"}},
        "calls": [{"argv": ["python", "benchmarks/two_gpus.py"], "seconds": 480.0}],
        "units": {
            "slice-2": {
                "part": "slice",
                "status": "ok",
                "seconds": 140,
                "result": {"run_dir": "/x/r2", "figures": two, "check": check, "measures": measures},
            },
            "slice-1": {
                "part": "slice",
                "status": "ok",
                "seconds": 50,
                "result": {"run_dir": "/x/r1", "figures": one},
            },
            "eval-2": {"part": "slice-eval", "status": "ok", "seconds": 70, "result": evaluation},
            "tiny-2": {"part": "tiny", "status": "failed", "seconds": 30, "why": "UnitFailed: exit 1: boom"},
            "two-nodes": {
                "part": "two-nodes",
                "status": "skipped",
                "why": "budget: needs about 150 s, 20 s left",
            },
        },
    }


def test_report_gives_each_gpu_against_one_gpu_and_says_what_was_skipped() -> None:
    text = report(results())
    rows = [
        line for line in text.splitlines() if line.startswith("| 2 GPUs |") or line.startswith("| 1 GPU |")
    ]
    # a GPU's tokens/s is the job's over its ranks; NVML's peak is the rank's own GPU's
    assert rows[0].split(" | ")[1:] == ["0 (0)", "1.50", "8.00", "9.00", "11,000", "3.00", "0.500", "32,000",
                                        "16,000 |"]  # fmt: skip
    assert rows[1].split(" | ")[1:6] == ["1 (1)", "2.50", "8.00", "10.00", "12,500"]
    assert rows[2].split(" | ")[-2:] == ["18,000", "18,000 |"]
    assert len(rows) == 3
    assert "| 2 x NVIDIA H200 | cuda:0 | 1 | 41.0 | 3.0 | 30.0 | 3.0 | 12.5 | 50,000 | 90 |" in text
    assert "| 2 x NVIDIA H200 | cuda:1 | 3 | 5.0 | 4.0 | 4.0 | 5.0 |" in text
    assert "rank 1: 39 events (24 steps, local index 1)" in text and "the sampler saw 2 GPU(s)" in text
    assert "| two-nodes | two-nodes | skipped | - | budget: needs about 150 s, 20 s left |" in text
    assert "| tiny-2 | tiny | failed | 30 | UnitFailed: exit 1: boom |" in text
    # the rehearsal's nf4-none row is the slice's own run, depth 4 read against the fit of depths 1 and 2
    (row,) = [line for line in text.splitlines() if line.startswith("| nf4-none (depth 4) |")]
    measured = [cell.split(" / ")[1].split(" (")[0] for cell in row.split(" | ")[1:6]]
    assert measured == ["7", "8.5", "2", "2.75", "0.3"]
    assert "offload copies of two ranks" in text
    for absent in ("## The tiny profile", "## Two nodes", "## Faults", "## Screenshots"):
        assert absent not in text  # nothing measured: no section


def test_budget_skips_a_unit_too_long_and_runs_a_later_shorter_one(tmp_path: Path) -> None:
    ran: list[str] = []

    def unit(name: str, seconds: float) -> Unit:
        return Unit(name, "tiny", seconds, seconds, lambda ctx: ran.append(name) or {"n": name})

    res = {"mode": "cpu", "depths": [1, 2], "units": {"done": {"status": "ok", "result": {}}}, "calls": []}
    ctx = Ctx(False, tmp_path, tmp_path, tmp_path, time.time() + 60, res)
    run_units(ctx, [unit("done", 1), unit("long", 600), unit("short", 5)])
    assert ran == ["short"]  # "done" was finished by the resumed call
    assert res["units"]["long"]["status"] == "skipped" and "needs about 600 s" in res["units"]["long"]["why"]
    assert res["units"]["short"] == {"part": "tiny", "status": "ok", "result": {"n": "short"},
                                     "seconds": res["units"]["short"]["seconds"]}  # fmt: skip
    written = json.loads((tmp_path / "two_gpus_cpu.json").read_text())
    assert written["units"]["long"]["status"] == "skipped"
    assert "| long | tiny | skipped |" in (tmp_path / "two_gpus_cpu.md").read_text()
