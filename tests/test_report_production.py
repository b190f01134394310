"""The report names the production path: the `vllm serve` command for the run's adapter (its base, rank,
tensor parallelism and quantization from the profile), and says the cockpit's own serving figure is its
own engine's, an upper bound on cost; in Markdown, the terminal and the app alike."""

from __future__ import annotations

import io
import itertools
import json
import shlex
from pathlib import Path

import pytest
from rich.console import Console
from test_report import write_own
from test_report_model import SERVING

from cockpit.profiles import load_profile, profile_to_dict
from cockpit.record import write_manifest
from cockpit.report import Report, render_markdown, report_parts, run_report

BASE, ADAPTER = "/models/Qwen3-235B-A22B-Thinking-2507", "/runs/r1/adapter"
UPPER_BOUND = "They are an upper bound on the cost of serving it"


def record(run: Path, profile_name: str, overrides: list[str] = ()) -> Report:
    """A run of `profile_name` (with `overrides`) evaluated: base and tuned predictions, the tuned one's
    meta naming the base and the adapter as the evaluation writes them, and a serving measurement."""
    profile, _ = load_profile(profile_name, list(overrides))
    write_manifest(run, {"run_id": "r1", "profile": profile_to_dict(profile)})
    write_own(run, "base", 0.3, seed=1)
    write_own(run, "finetuned", 0.8, seed=2)
    tuned = run / "predictions" / "finetuned.jsonl"
    _first, *rest = tuned.read_text().splitlines()
    meta = {"meta": {"system": "finetuned", "model": BASE, "adapter": ADAPTER}}
    tuned.write_text("\n".join([json.dumps(meta), *rest]) + "\n")
    (run / "events").mkdir(exist_ok=True)
    (run / "events" / "eval.jsonl").write_text(json.dumps(SERVING) + "\n")
    return run_report(run, samples=50)


def flags(command: str) -> dict[str, str]:
    argv = shlex.split(command)
    assert argv[:3] == ["vllm", "serve", BASE] and "--enable-lora" in argv
    return {a: b for a, b in itertools.pairwise(argv) if a.startswith("--") and not b.startswith("--")}


@pytest.mark.parametrize(
    "profile_name, overrides, rank, tp, quantization",
    [
        ("qwen3-235b-a22b-thinking-4xh100", [], "16", "4", "fp8"),  # r=16 on 4 GPUs, trained on NF4
        ("tiny-cpu", [], "32", "1", "fp8"),  # r=32, a CPU profile: one GPU
        ("qwen3-235b-a22b-thinking-4xh100", ["lora.r=24", "hardware.gpus=8"], "32", "8", "fp8"),
        ("tiny-cpu", ["quantization.load_in_4bit=false", "lora.r=8"], "8", "1", None),
    ],
)
def test_the_serving_section_holds_the_vllm_command(
    tmp_path: Path, profile_name: str, overrides: list[str], rank: str, tp: str, quantization: str | None
) -> None:
    report = record(tmp_path, profile_name, overrides)
    assert report.production is not None
    command = report.production.command
    got = flags(command)
    assert got["--max-lora-rank"] == rank and got["--tensor-parallel-size"] == tp
    assert got["--lora-modules"] == f"r1={ADAPTER}"
    assert got.get("--quantization") == quantization
    md = render_markdown(report)
    serving = md[md.index("## Serving") :]
    assert f"```bash\n{command}\n```" in serving
    assert UPPER_BOUND in serving and "Hugging Face generate on the NF4 base" in serving
    if quantization:
        assert "not in bitsandbytes NF4" in serving and "vllm-project/vllm#29424" in serving
    again = Report.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again.production == report.production and again.to_dict()["production"]["command"] == command


def test_the_terminal_and_the_app_show_the_command_and_the_upper_bound(tmp_path: Path) -> None:
    from cockpit.app.widgets.report import production_text

    report = record(tmp_path, "qwen3-235b-a22b-thinking-4xh100")
    console = Console(file=io.StringIO(), width=400, color_system=None)
    for part in report_parts(report):
        console.print(part)
    terminal = console.file.getvalue()
    assert report.production.command in terminal and UPPER_BOUND in terminal
    app = production_text(report).plain
    assert report.production.command in app and "an upper bound on the cost of serving" in app
    assert "HF generate on NF4" in app and "not bitsandbytes NF4" in app


def test_experts_lora_is_said_to_stay_behind(tmp_path: Path) -> None:
    report = record(tmp_path, "qwen3-235b-a22b-thinking-4xh100", ["lora.target_experts=true"])
    assert "the experts' LoRA (expert_lora.safetensors) is the cockpit's own format" in render_markdown(
        report
    )


def test_no_tuned_model_no_production_path(tmp_path: Path) -> None:
    record(tmp_path, "tiny-cpu")
    (tmp_path / "predictions" / "finetuned.jsonl").unlink()
    report = run_report(tmp_path, samples=50)
    assert report.production is None and "vllm serve" not in render_markdown(report)
