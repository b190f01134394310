"""How the project installs: its dependency ranges and what a wheel carries."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from cockpit.profiles import PROFILES_DIR, load_profile
from devtools.faults import Watch, run_watched

ROOT = Path(__file__).resolve().parent.parent
STORY = "qwen3-235b-a22b-thinking-4xh100"


def _requirement(name: str) -> Requirement:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    found = [Requirement(r) for r in pyproject["project"]["dependencies"] if Requirement(r).name == name]
    assert len(found) == 1, f"{name} is not declared once in pyproject.toml"
    return found[0]


@pytest.mark.parametrize(
    ("version", "accepted"),
    [
        ("2.11.0a0+gitabc", True),  # NVIDIA's container build: pip must keep it, not replace it
        ("2.11.0", True),
        ("2.13.0", True),
        ("2.14.1+cu128", True),
        ("2.10.1", False),
        ("2.15.0", False),
    ],
)
def test_torch_range_keeps_container_builds(version: str, accepted: bool) -> None:
    assert _requirement("torch").specifier.contains(version) is accepted


def _build_wheel(tmp_path: Path) -> Path:
    """A wheel built from a copy of this source tree (setuptools' own build, about a second)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("cockpit", "trainer", "profiles", "devtools"):  # devtools: there, and left out
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "dist"
    build = f"from setuptools import build_meta; print(build_meta.build_wheel({str(out)!r}))"
    done = run_watched([sys.executable, "-c", build], Watch(), cwd=src)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = out.glob("*.whl")
    return wheel


def _wheel_files(tmp_path: Path) -> set[str]:
    """The files a wheel built from this source tree holds."""
    with zipfile.ZipFile(_build_wheel(tmp_path)) as archive:
        return set(archive.namelist())


def test_wheel_carries_the_shipped_profiles_and_no_development_tools(tmp_path: Path) -> None:
    """The checkout's profiles/ install as the package data `cockpit.shipped_profiles` (a package-dir
    mapping, not a copy); devtools/, benchmarks/ and tests/ never ship."""
    shipped = sorted(p for p in PROFILES_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    names = {p.relative_to(PROFILES_DIR).as_posix() for p in shipped}
    assert {"tiny-cpu.toml", f"{STORY}.toml", "models/qwen3-235b-a22b-thinking-2507/config.json"} <= names
    assert PROFILES_DIR == ROOT / "profiles"  # at the top of the checkout, as the design card has it
    in_wheel = _wheel_files(tmp_path)
    missing = [name for name in names if f"cockpit/shipped_profiles/{name}" not in in_wheel]
    assert not missing, f"not in the wheel: {missing}"
    tools = sorted(n for n in in_wheel if n.split("/")[0] in ("devtools", "benchmarks", "tests", "profiles"))
    assert not tools, f"development files in the wheel: {tools[:5]}"
    modules = {
        p.relative_to(ROOT).as_posix() for d in ("cockpit", "trainer") for p in (ROOT / d).rglob("*.py")
    }
    left_out = sorted(m for m in modules if m not in in_wheel and "__pycache__" not in m)
    assert not left_out, f"modules a package list left out of the wheel: {left_out[:5]}"


def test_shipped_profile_by_name_from_another_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    profile, path = load_profile(STORY)
    assert path == PROFILES_DIR / f"{STORY}.toml"
    assert Path(profile.model.config) == PROFILES_DIR / "models/qwen3-235b-a22b-thinking-2507/config.json"
    assert Path(profile.model.config).is_file()
    # An explicit file still wins, wherever it is.
    own = tmp_path / "mine.toml"
    own.write_text((PROFILES_DIR / "tiny-cpu.toml").read_text(encoding="utf-8").replace("tiny-cpu", "mine"))
    assert load_profile(str(own))[0].name == "mine"


@pytest.mark.e2e
def test_a_wheel_installed_outside_the_checkout_plans_and_checks(tmp_path: Path) -> None:
    """`pip install cockpit-*.whl` into a new venv, run from another directory: `cockpit plan` and
    `cockpit doctor` work from the installed package alone (its profiles are package data)."""
    import sysconfig
    import venv

    (tmp_path / "build").mkdir()
    wheel = _build_wheel(tmp_path / "build")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    installed = run_watched(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], Watch()
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    # The dependencies are this environment's (nothing is downloaded in CI): its site-packages as a plain
    # path entry, after the new venv's own, so its editable finder for the checkout never runs.
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["COCKPIT_RUNS_DIR"] = str(tmp_path / "runs")

    def cockpit(*args: str) -> subprocess.CompletedProcess[str]:
        return run_watched([str(env_dir / "bin" / "cockpit"), *args], Watch(), cwd=away, env=env)

    where = subprocess.run(
        [python, "-c", "import cockpit, trainer; print(cockpit.__file__); print(trainer.__file__)"],
        cwd=away, env=env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert all(Path(f).is_relative_to(site) for f in where), where
    plan = cockpit("plan", "--profile", "tiny-cpu")
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert "FITS" in plan.stdout
    listed = cockpit("profiles")
    assert listed.returncode == 0 and "tiny-cpu" in listed.stdout and STORY in listed.stdout, listed.stdout
    no_tools = subprocess.run(
        [python, "-c", "import devtools"], cwd=away, env=env, capture_output=True, text=True
    )
    assert no_tools.returncode != 0 and "No module named 'devtools'" in no_tools.stderr
    doctor = cockpit("doctor", "--profile", "tiny-cpu")
    assert doctor.returncode == 0, doctor.stdout[-2000:] + doctor.stderr[-2000:]
    assert "cockpit doctor: profile tiny-cpu" in doctor.stdout
    assert "fail " not in doctor.stdout
