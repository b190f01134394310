"""Profiles: the shipped ones validate; each malformed one fails fast, naming the field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cockpit.profiles import ProfileError, apply_overrides, check_runnable, load_profile

BAD = sorted((Path(__file__).parent / "fixtures" / "profiles").glob("*.toml"))


def expectations(path: Path) -> list[str]:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect:"), f"{path} must start with '# expect: words | more words'"
    return [w.strip() for w in first.removeprefix("# expect:").split("|")]


@pytest.mark.parametrize("name", ["tiny-cpu", "qwen3-235b-a22b-thinking-4xh100"])
def test_shipped_profiles_validate(name: str) -> None:
    profile, path = load_profile(name)
    assert profile.name == name
    assert path.name == f"{name}.toml"


def test_story_profile_is_the_story() -> None:
    profile, _ = load_profile("qwen3-235b-a22b-thinking-4xh100")
    assert (
        profile.hardware.gpus == 4
        and profile.hardware.gpu_mem_gib == 80
        and profile.hardware.host_ram_gib == 960
    )
    assert profile.deepspeed.stage == 3
    assert profile.deepspeed.offload_param == "cpu" and profile.deepspeed.offload_optimizer == "cpu"
    assert profile.quantization.quant_type == "nf4" and profile.quantization.double_quant
    assert Path(profile.model.config).is_file(), (
        "the plan needs the model's config.json shipped beside the profile"
    )


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_malformed_profile_names_the_field(path: Path) -> None:
    with pytest.raises(ProfileError) as info:
        profile, source = load_profile(str(path))
        check_runnable(profile, str(source))
    message = str(info.value)
    assert str(path) in message
    for words in expectations(path):
        assert words in message, f"{words!r} not in {message!r}"


# `cockpit run` with a bad profile, then which of the heavy libraries it had imported by then.
REJECT = """
import sys
from cockpit.cli import main
code = main(["run", "--no-ui", "--profile", sys.argv[1], "--runs-dir", sys.argv[2]])
print(",".join(m for m in ("torch", "transformers", "deepspeed", "datasets") if m in sys.modules))
sys.exit(code)
"""


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_cli_rejects_malformed_profile_fast_without_traceback(path: Path, tmp_path: Path) -> None:
    """Fast by what it does, not by the clock (a busy machine took 2.8 s): the profile is refused before
    any heavy library is imported."""
    result = subprocess.run(
        [sys.executable, "-c", REJECT, str(path), str(tmp_path)], capture_output=True, text=True
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert expectations(path)[0] in result.stderr
    assert result.stdout.strip() == "", f"imported {result.stdout.strip()} before refusing the profile"
    assert not any(tmp_path.iterdir()), "no run directory for a rejected profile"


def test_overrides_reach_nested_fields_and_are_validated() -> None:
    profile, _ = load_profile("tiny-cpu", ["training.max_steps=7", "lora.target_modules=['q_proj']"])
    assert profile.training.max_steps == 7
    assert profile.lora.target_modules == ["q_proj"]
    with pytest.raises(ProfileError, match=r"training\.max_steps"):
        load_profile("tiny-cpu", ["training.max_steps=seven"])
    with pytest.raises(ProfileError, match=r"expected section\.key=value"):
        apply_overrides({}, ["training.max_steps"])


def test_unknown_profile_name_lists_known_ones() -> None:
    with pytest.raises(ProfileError, match="tiny-cpu"):
        load_profile("no-such-profile")


def test_a_mistyped_profile_name_gets_the_nearest_including_ones_in_local_profiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "mine.toml").write_text('name = "mine"\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ProfileError, match=r"mien: .*did you mean mine\? known: mine, qwen3"):
        load_profile("mien")
    with pytest.raises(ProfileError, match=r"did you mean tiny-cpu\?"):
        load_profile("tiny-cup")


def test_relative_paths_are_the_files_own_or_where_the_user_stands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path in a profile file is relative to the file; one given with --set, to the working directory
    (not to the shipped profile's folder inside the package)."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    shipped = (Path(__file__).parent.parent / "profiles/tiny-cpu.toml").read_text()
    (folder / "mine.toml").write_text(
        shipped.replace('source = "builtin:tiny-tenants"', 'source = "data/d.jsonl"')
    )
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    from_file, _ = load_profile(str(folder / "mine.toml"))
    assert from_file.data.source == str(folder / "data" / "d.jsonl")
    from_set, _ = load_profile("tiny-cpu", ["data.source=d.jsonl", "model.config=cfg/config.json"])
    assert from_set.data.source == str(elsewhere / "d.jsonl")
    assert from_set.model.config == str(elsewhere / "cfg" / "config.json")
    kept, _ = load_profile("tiny-cpu", ["data.source=builtin:tiny-tenants", "training.max_steps=3"])
    assert kept.data.source == "builtin:tiny-tenants"
    home, _ = load_profile("tiny-cpu", ["data.source=~/d.jsonl"])
    assert home.data.source == str(Path.home() / "d.jsonl")  # expanded, as the trainer reads it


@pytest.mark.parametrize("command", ["run", "plan", "doctor", "data"])
def test_a_profile_that_is_not_utf8_is_one_line_naming_the_file_and_the_byte(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cockpit.cli import main

    shipped = (Path(__file__).parent.parent / "profiles/tiny-cpu.toml").read_bytes()
    path = tmp_path / "latin1.toml"
    path.write_bytes(shipped + '\ndescription = "café"\n'.encode("latin-1"))
    line = shipped.count(b"\n") + 2
    runs = ["--runs-dir", str(tmp_path / "runs")] if command != "data" else ["--no-tokens"]
    code = main([command, "--profile", str(path), *runs])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"{path}: cannot read: line {line}: not UTF-8 text (byte 0xe9 at column 19)" in err
    assert not (tmp_path / "runs").exists()


def test_a_hostfile_or_a_listed_profile_that_is_not_utf8_is_named_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cockpit.profiles import profile_names

    hostfile = tmp_path / "hosts"
    hostfile.write_bytes(b"node-1 slots=1\nn\xf6de-2 slots=1\n")
    profile, _ = load_profile("tiny-cpu", [f'launcher.hostfile="{hostfile}"', "hardware.nodes=2"])
    with pytest.raises(ProfileError, match=r"launcher\.hostfile: .*line 2: not UTF-8 text \(byte 0xf6"):
        check_runnable(profile, "mine.toml")
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "mine.toml").write_bytes(b'description = "\xff"\n')
    monkeypatch.chdir(tmp_path)
    assert ("mine", "(cannot be read as TOML)", Path("profiles/mine.toml")) in [
        (n, d, p.relative_to(tmp_path)) if p.is_relative_to(tmp_path) else (n, d, p)
        for n, d, p in profile_names()
    ]
