"""`cockpit plan`: text and JSON, hardware from flags over the profile."""

from __future__ import annotations

import json

import pytest

from cockpit.cli import main

STORY = "qwen3-235b-a22b-thinking-4xh100"


def test_json_for_the_story(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--profile", STORY, "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["hardware"] == {
        "gpus": 4,
        "gpu_name": "H100-80GB",
        "gpu_mem_gib": 80.0,
        "host_ram_gib": 960.0,
        "source": {"gpus": "profile", "gpu_mem_gib": "profile", "host_ram_gib": "profile"},
    }
    assert plan["configured"]["fits"] is False
    assert plan["configured"]["binding"] == "GPU memory at load"
    assert any("CPU offload" in r for r in plan["requirements"])
    assert {o["label"] for o in plan["options"]} >= {
        "no offload",
        "param + optimizer offload",
        "NVMe offload",
    }


def test_flags_override_the_profile(capsys: pytest.CaptureFixture[str]) -> None:
    """Eight 141 GiB GPUs hold the whole 4-bit model at load: the trainer's own way of loading then fits."""
    assert (
        main(
            [
                "plan",
                "--profile",
                STORY,
                "--gpus",
                "8",
                "--gpu-mem-gib",
                "141",
                "--host-ram-gib",
                "2048",
                "--format",
                "json",
            ]
        )
        == 0
    )
    plan = json.loads(capsys.readouterr().out)
    assert plan["hardware"]["source"] == {"gpus": "flag", "gpu_mem_gib": "flag", "host_ram_gib": "flag"}
    assert plan["configured"]["setup"]["gpus"] == 8
    assert plan["configured"]["fits"] is True


def test_text_is_readable(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "140")
    assert main(["plan", "--profile", STORY]) == 0
    out = capsys.readouterr().out
    for words in (
        "Parameters and weight bytes",
        "experts",
        "470.2 GB",
        "DOES NOT FIT",
        "Required:",
        "CPU offload",
        "Fastest that fits",
    ):
        assert words in out


def test_bad_profile_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--profile", "no-such-profile"]) == 2
    assert "no such profile" in capsys.readouterr().err
