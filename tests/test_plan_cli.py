"""`cockpit plan`: text and JSON, hardware from flags over the profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cockpit.cli import main

STORY = "qwen3-235b-a22b-thinking-4xh100"


def test_json_for_the_story(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--profile", STORY, "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["hardware"] == {
        "gpus": 4,
        "nodes": 1,
        "gpu_name": "H100-80GB",
        "gpu_mem_gib": 80.0,
        "host_ram_gib": 960.0,
        "source": {"gpus": "profile", "gpu_mem_gib": "profile", "host_ram_gib": "profile"},
    }
    # The default loader reads, packs and partitions one layer at a time: the story fits as configured,
    # and only because of that loader (from_pretrained would put the whole model on each 80 GiB GPU).
    # Without parameter offload it fits only with the experts dequantized again for backward, at a speed
    # the model cannot tell from the configured: the plan keeps what is configured.
    assert plan["configured"]["setup"]["loader"] == "layerwise"
    assert plan["configured"]["fits"] is True
    assert plan["configured"]["load"]["gpu_peak"] < 8 * 1024**3
    assert any("layer-by-layer loader" in r for r in plan["requirements"])
    assert not any("CPU offload of the parameters" in r for r in plan["requirements"])
    no_offload = next(o for o in plan["options"] if o["label"] == "no offload")
    assert no_offload["fits"] and "experts dequantized again" in no_offload["setup"]["describe"]
    assert plan["best"]["setup"] == plan["configured"]["setup"]
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
        "FITS as configured",
        "layer-by-layer load",
        "Required:",
        'model.loader = "layerwise"',
        "Fastest that fits",
    ):
        assert words in out


def test_bad_profile_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--profile", "no-such-profile"]) == 2
    assert "no such profile" in capsys.readouterr().err


def test_the_transformers_loader_does_not_fit_the_story(
    tmp_path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """model.loader = "transformers": every rank's whole model on its GPU at load, more than 80 GiB."""
    from pathlib import Path

    src = Path(__file__).resolve().parent.parent / "profiles" / f"{STORY}.toml"
    text = src.read_text().replace('loader = "layerwise"', 'loader = "transformers"')
    assert 'loader = "transformers"' in text
    text = text.replace('config = "models/', f'config = "{src.parent}/models/')
    profile = tmp_path / "story-transformers.toml"
    profile.write_text(text)
    monkeypatch.setenv("COLUMNS", "140")
    assert main(["plan", "--profile", str(profile), "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["configured"]["setup"]["loader"] == "transformers"
    assert plan["configured"]["fits"] is False
    assert plan["configured"]["binding"] == "GPU memory at load"
    assert plan["configured"]["load"]["gpu_peak"] > 80 * 1024**3
    assert any("not what the profile says" in r for r in plan["requirements"])


def test_unknown_gpu_memory_is_not_called_a_fit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--profile", STORY, "--gpu-mem-gib", "0", "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["configured"]["unchecked"] == ["GPU memory"]
    assert plan["verdict"].startswith("NOT CHECKED: GPU memory unknown")
    assert main(["plan", "--profile", STORY, "--gpu-mem-gib", "0"]) == 0
    text = capsys.readouterr().out
    assert "FITS as configured" not in text and "Fastest that fits (not checked: GPU memory)" in text


FIXTURES = Path(__file__).parent / "fixtures" / "profiles"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--gpus", "-1"], "argument --gpus: -1: expected a whole number from 0 to 1,024"),
        (["--gpus", "2.5"], "argument --gpus: '2.5'"),
        (["--host-ram-gib", "-5"], "argument --host-ram-gib: -5: expected a finite number from 0"),
        (["--gpu-mem-gib", "nan"], "argument --gpu-mem-gib: nan: expected a finite number from 0 to 4,096"),
        (["--gpu-mem-gib", "inf"], "argument --gpu-mem-gib: inf"),
        (["--gpu-mem-gib", "1e400"], "argument --gpu-mem-gib: 1e400"),
        (
            ["--profile", str(FIXTURES / "infinite_gpu_mem.toml")],
            "hardware.gpu_mem_gib: Input should be a finite",
        ),
    ],
)
def test_bad_numbers_are_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], words: str
) -> None:
    assert main(["plan", *args]) == 2
    captured = capsys.readouterr()
    assert words in captured.err and "Traceback" not in captured.err
    assert len(captured.err.strip().splitlines()) == 1
    assert captured.out == ""


def test_set_overrides_reach_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    """`plan --set` goes through the same override path as `run`: the plan is of the changed profile."""
    args = ["plan", "--profile", STORY, "--format", "json"]
    assert main([*args, "--set", "training.seq_len=2048", "--set", "hardware.gpus=8"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["configured"]["setup"]["seq_len"] == 2048
    assert plan["configured"]["setup"]["gpus"] == 8
    assert plan["hardware"]["source"]["gpus"] == "profile"


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("hardware.host_ram_gib=-5", "hardware.host_ram_gib: Input should be greater than or equal to 0"),
        ("hardware.gpus=nan", "hardware.gpus"),
        ("training.learning_rate=inf", "training.learning_rate: Input should be a finite number"),
        ("training.nope=1", "training.nope: unknown key\n"),
        ("training.learnig_rate=1e-4", "training.learnig_rate: unknown key (did you mean learning_rate?)"),
        (
            "deepspeed.offload_params=cpu",
            "deepspeed.offload_params: unknown key (did you mean offload_param?)",
        ),
        ("training.seq_len", "expected section.key=value"),
    ],
)
def test_bad_set_overrides_name_the_field(
    capsys: pytest.CaptureFixture[str], override: str, words: str
) -> None:
    assert main(["plan", "--set", override]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_profiles_lists_every_name_with_its_description(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cockpit profiles`: the shipped ones and those in ./profiles, the names --profile finds."""
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "mine.toml").write_text('name = "mine"\ndescription = "my [bold] own run"\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    assert "tiny-cpu (default)" in out and "Random-init tiny Qwen3-MoE" in out
    assert STORY in out and "my [bold] own run" in out
    assert "profiles/mine.toml" in out


def test_profile_help_points_to_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("plan", "run", "rehearse"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "cockpit profiles" in " ".join(capsys.readouterr().out.split())


def test_two_nodes_count_eight_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    """`--nodes 2` with 4 GPUs a node: ZeRO-3 partitions divide by 8, the run takes half the steps, and
    host RAM is each node's (its 4 ranks), not all 8 ranks'."""
    assert main(["plan", "--profile", STORY, "--format", "json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert main(["plan", "--profile", STORY, "--format", "json", "--nodes", "2"]) == 0
    two = json.loads(capsys.readouterr().out)
    assert two["hardware"]["nodes"] == 2 and two["hardware"]["source"]["nodes"] == "flag"
    assert two["run"]["steps"] * 2 == pytest.approx(one["run"]["steps"], abs=1)
    pinned = "offload buffers (pinned)"
    rss_one = one["configured"]["train"]["rss_terms"][pinned]
    rss_two = two["configured"]["train"]["rss_terms"][pinned]
    assert rss_two < 0.6 * rss_one  # each rank pins its partition: half as large over twice the ranks
    assert two["configured"]["train"]["host_peak"] < one["configured"]["train"]["host_peak"]
    assert main(["plan", "--profile", STORY, "--nodes", "2"]) == 0
    assert "2 nodes x 4 x H100-80GB (80 GiB) = 8 ranks" in capsys.readouterr().out


def test_the_text_says_the_verdict_and_the_hours_first(capsys: pytest.CaptureFixture[str]) -> None:
    """`cockpit plan | head` shows the answer: the verdict and the run's hours on the third line, the
    same verdict and hours as the end of the text and the JSON."""
    assert main(["plan", "--profile", STORY, "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert main(["plan", "--profile", STORY]) == 0
    lines = capsys.readouterr().out.splitlines()
    first = " ".join(lines[2:4])
    assert first.startswith(f"In short: {plan['verdict'][:40]}")
    hours = (plan["run"]["train_s"] + plan["run"]["validation"]["total_s"]) / 3600
    assert f"training and validation ~{hours:.2f} h (modelled) (details below)" in first
