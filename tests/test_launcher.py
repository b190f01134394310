"""DeepSpeed's launcher as profiles name it: the runner's own parser takes the argv the cockpit builds,
the hostfile is read and its hosts selected as the runner does, and a selection that is not the run's
plan is refused before anything starts."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from types import ModuleType

import pytest

from cockpit.launcher import (
    EXTRA_OPTIONS,
    HostfileError,
    master_port,
    parse_hostfile,
    runner_options,
    select_hosts,
)
from cockpit.profiles import Profile, ProfileError, check_hosts, load_profile
from cockpit.service.spawn import trainer_argv

HOSTS = """# four hosts
gpu-a slots=4
gpu-b slots=4

gpu-c slots=2
gpu-d slots=4
"""


def profile(*overrides: str) -> Profile:
    return load_profile("tiny-cpu", list(overrides))[0]


def runner() -> ModuleType:
    """DeepSpeed's runner module (it imports torch: only in these tests)."""
    from deepspeed.launcher import runner as ds_runner

    return ds_runner


def test_one_host_keeps_the_launch_of_old() -> None:
    p = profile("hardware.gpus=2")
    assert runner_options(p.launcher, 1, 2, 1234) == ["--num_gpus", "2", "--master_port", "1234"]
    assert master_port(p.launcher, 1, 1234) == 1234  # a free port here


def test_the_runner_parses_every_option_as_the_profile_gave_it(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text(HOSTS)
    ssh = profile(
        f"launcher.hostfile={hostfile}", "hardware.nodes=2", "hardware.gpus=4",
        "launcher.backend=openmpi", "launcher.launcher_args=--mca btl tcp", "launcher.ssh_port=2222",
        'launcher.extra_args=["--bind_core_list", "0-3", "--save_pid"]',
    )  # fmt: skip
    argv = trainer_argv(ssh, tmp_path / "run", False, master_port(ssh.launcher, 2, 1234))
    assert argv[1:3] == ["-m", "deepspeed.launcher.runner"]
    args = runner().parse_args(argv[3:])
    assert (args.hostfile, args.num_nodes, args.num_gpus) == (str(hostfile), 2, 4)
    assert args.master_port == 29500, "ssh starts node 0 elsewhere: DeepSpeed's port, not one free here"
    assert (args.launcher, args.launcher_args, args.ssh_port) == ("openmpi", "--mca btl tcp", 2222)
    assert (args.bind_core_list, args.save_pid, args.module) == ("0-3", True, True)
    assert (args.user_script, args.user_args[:2]) == (
        "cockpit.service.guard",
        ["--run-dir", str(tmp_path / "run")],
    )

    no_ssh = profile(
        f"launcher.hostfile={hostfile}", "hardware.nodes=2", "launcher.no_ssh=true",
        "launcher.master_addr=10.0.0.1", "launcher.include=gpu-a:0@gpu-c:1",
    )  # fmt: skip
    args = runner().parse_args(trainer_argv(no_ssh, tmp_path, False, 4321, node_rank=1)[3:])
    assert (args.no_ssh, args.node_rank, args.master_addr, args.master_port) == (True, 1, "10.0.0.1", 4321)
    assert (args.include, args.num_nodes, args.num_gpus) == ("gpu-a:0@gpu-c:1", -1, -1), (
        "the runner refuses --num_nodes/--num_gpus beside --include"
    )


def test_every_extra_option_allowed_is_one_of_the_runners() -> None:
    """The runner builds its parser inside `parse_args`: its options are read from its help."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        runner().parse_args(["--help"])
    for option in EXTRA_OPTIONS:
        assert option in out.getvalue(), option


@pytest.mark.parametrize(
    "text",
    [HOSTS, "a slots=1", "  # only\nb slots=3 # a comment after\n", "", "a slots=1\na slots=2", "a 4"],
    ids=["four", "one", "comment", "empty", "twice", "no-slots"],
)
def test_hostfiles_read_as_the_runner_reads_them(text: str) -> None:
    try:
        expected = dict(runner()._parse_hostfile(text.splitlines()))
    except ValueError:
        with pytest.raises(HostfileError):
            parse_hostfile(text)
        return
    assert parse_hostfile(text) == expected


@pytest.mark.parametrize(
    ("include", "exclude", "nodes", "per_node"),
    [
        ("", "", 0, 0),
        ("", "", 2, 2),
        ("", "", 3, 0),
        ("gpu-b@gpu-d:1,3", "", 0, 0),
        ("gpu-a:0@gpu-a:2", "", 0, 0),
        ("", "gpu-a@gpu-d:0", 0, 0),
        ("", "gpu-c:0,1", 0, 0),
        ("gpu-e", "", 0, 0),
        ("gpu-c:2", "", 0, 0),
    ],
)
def test_hosts_selected_as_the_runner_selects_them(
    include: str, exclude: str, nodes: int, per_node: int
) -> None:
    ds = runner()
    pool = ds._parse_hostfile(HOSTS.splitlines())
    try:
        active = ds.parse_inclusion_exclusion(pool, include, exclude)
        expected = {h: list(s) for h, s in ds.apply_num_nodes_and_gpus(active, nodes, per_node).items()}
    except ValueError:
        with pytest.raises(HostfileError):
            select_hosts(parse_hostfile(HOSTS), include, exclude, nodes, per_node)
        return
    assert select_hosts(parse_hostfile(HOSTS), include, exclude, nodes, per_node) == expected


def test_a_selection_that_is_not_the_plan_is_refused(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text(HOSTS)
    base = [f"launcher.hostfile={hostfile}", "hardware.gpus=4"]
    check_hosts(profile(*base, "hardware.nodes=2"), "p")  # the first two hosts, 4 slots each
    check_hosts(profile(*base, "hardware.nodes=2", "launcher.exclude=gpu-a@gpu-c"), "p")
    refusals = {
        "hardware.nodes=5": "hardware.nodes: 5 node(s), but the hostfile lists 4 host(s)",
        "hardware.nodes=3": "hardware.gpus: 4 rank(s) a node, but host 'gpu-c' has 2 slot(s) in the hostfile",
        "launcher.include=gpu-a:0,1@gpu-b": "but host 'gpu-a' has 2 slot(s) selected",
        "launcher.include=gpu-z": "launcher.hostfile: host 'gpu-z' is not in the hostfile",
    }
    for override, words in refusals.items():
        nodes = [] if override.startswith("hardware.nodes") else ["hardware.nodes=2"]
        with pytest.raises(ProfileError) as info:
            check_hosts(profile(*base, *nodes, override), "p.toml")
        assert str(info.value).startswith("p.toml: ") and words in str(info.value), str(info.value)
    with pytest.raises(ProfileError, match=r"launcher\.hostfile: cannot read"):
        check_hosts(profile(f"launcher.hostfile={tmp_path / 'none'}"), "p.toml")


def test_a_relative_hostfile_is_the_profiles_neighbour(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("a slots=1\nb slots=1\n")
    path = tmp_path / "two.toml"
    path.write_text(
        'name = "two"\n[model]\npath = "builtin:tiny-qwen3-moe"\n[data]\nsource = "builtin:tiny-tenants"\n'
        '[hardware]\nnodes = 2\n[launcher]\nhostfile = "hosts"\n'
    )
    p, _ = load_profile(str(path))
    assert p.launcher.hostfile == str(tmp_path / "hosts")
    assert p.world_size == 2 and p.ranks_per_node == 1
    check_hosts(p, str(path))
