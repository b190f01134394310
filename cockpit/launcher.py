"""DeepSpeed's launcher as a profile asks for it: the runner's options, and the hosts and slots it starts.

The cockpit launches ranks only through `deepspeed.launcher.runner`, never a launcher of its own. A
profile's `[launcher]` section names a hostfile and the runner's own options; `runner_options` turns
them into its argv, unchanged. `parse_hostfile` and `select_hosts` read a hostfile as the runner does
(same syntax, same errors, same order of hosts), so a run is checked before it starts: the hosts the
runner will use must be `hardware.nodes` hosts with `hardware.gpus` slots each, the run's plan.

Pure: reads text, returns values; imports nothing of the project. It takes what it needs (the
`[launcher]` section, as `Spec` reads it, the nodes and the ranks a node), not a whole profile.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

RUNNER = "deepspeed.launcher.runner"
DEFAULT_PORT = 29500  # DeepSpeed's own, for ssh launches whose master is another host
# DeepSpeed's --launcher backends for ssh launches over several hosts.
BACKENDS = ("pdsh", "openmpi", "mvapich", "slurm", "mpich", "impi")
# Runner options a profile may add through `launcher.extra_args`; the others are the cockpit's own
# (`--module`, `--num_gpus`, ...) or have their own field.
EXTRA_OPTIONS = (
    "--bind_cores_to_rank",
    "--bind_core_list",
    "--enable_each_rank_log",
    "--force_multi",
    "--log_level",
    "--no_local_rank",
    "--no_ssh_check",
    "--quiet",
    "--save_pid",
    "--venv_script",
)
# NODE_SPEC[@NODE_SPEC ...], NODE_SPEC = NAME[:SLOT[,SLOT ...]] (DeepSpeed's --include and --exclude).
_NODE_SPEC = r"[^@:,\s]+(?::\d+(?:,\d+)*)?"
NODE_SPECS = re.compile(rf"^{_NODE_SPEC}(?:@{_NODE_SPEC})*$")
_HOST_LINE = re.compile(r"^(\S+)\s+slots=(\d+)")


class Spec(Protocol):
    """What the launcher reads of a profile's `[launcher]` section (`cockpit.profiles.LauncherSpec`)."""

    @property
    def hostfile(self) -> str: ...
    @property
    def include(self) -> str: ...
    @property
    def exclude(self) -> str: ...
    @property
    def master_addr(self) -> str: ...
    @property
    def master_port(self) -> int: ...
    @property
    def no_ssh(self) -> bool: ...
    @property
    def node_rank(self) -> int: ...
    @property
    def backend(self) -> str: ...
    @property
    def launcher_args(self) -> str: ...
    @property
    def ssh_port(self) -> int: ...
    @property
    def extra_args(self) -> Sequence[str]: ...


class HostfileError(ValueError):
    """A hostfile, or a selection of its hosts, the runner would refuse; the message says where."""


def parse_hostfile(text: str) -> dict[str, int]:
    """`host slots=N` lines (comments and blank lines skipped) as {host: slots}, in the file's order."""
    pool: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _HOST_LINE.search(line)
        if match is None:
            raise HostfileError(f"line {number}: expected 'HOST slots=N', got {line!r}")
        host, slots = match.group(1), int(match.group(2))
        if host in pool:
            raise HostfileError(f"line {number}: host {host!r} is listed twice")
        pool[host] = slots
    if not pool:
        raise HostfileError("no 'HOST slots=N' line")
    return pool


def _node_specs(text: str) -> dict[str, list[int]]:
    specs: dict[str, list[int]] = {}
    for spec in text.split("@"):
        host, _, slots = spec.partition(":")
        specs.setdefault(host, [])
        specs[host] += [int(s) for s in slots.split(",")] if slots else []
    return specs


def select_hosts(
    pool: dict[str, int], include: str = "", exclude: str = "", nodes: int = 0, per_node: int = 0
) -> dict[str, list[int]]:
    """The hosts and slots the runner uses, as it resolves them: `include` or `exclude` filter the
    hostfile; without either, the first `nodes` hosts (0: all) and slots `0..per_node-1` (0: all)."""
    if include and exclude:
        raise HostfileError("include and exclude cannot both be set")
    slots = {host: list(range(n)) for host, n in pool.items()}
    if include or exclude:
        picked: dict[str, list[int]] = {} if include else {h: list(s) for h, s in slots.items()}
        for host, wanted in _node_specs(include or exclude).items():
            if host not in slots:
                raise HostfileError(f"host {host!r} is not in the hostfile")
            missing = [s for s in wanted if s not in slots[host]]
            if missing:
                raise HostfileError(
                    f"host {host!r} has no slot {missing[0]} (slots=0..{len(slots[host]) - 1})"
                )
            if include:
                picked[host] = sorted(set(picked.get(host, []) + (wanted or slots[host])))
            else:
                picked[host] = [s for s in picked[host] if wanted and s not in wanted]
        return {h: picked[h] for h in pool if picked.get(h)}
    hosts = list(pool)[:nodes] if nodes > 0 else list(pool)
    return {h: list(range(per_node)) if per_node > 0 else slots[h] for h in hosts}


def selection_problem(spec: Spec, nodes: int, per_node: int, hostfile_text: str) -> str | None:
    """Why the hostfile's selection is not `nodes` (`hardware.nodes`) x `per_node` ranks (one line naming
    the field), or None when the runner will start exactly the ranks the run is planned for."""
    try:
        pool = parse_hostfile(hostfile_text)
        filtered = bool(spec.include or spec.exclude)
        chosen = select_hosts(pool, spec.include, spec.exclude)
    except HostfileError as exc:
        return f"launcher.hostfile: {exc}"
    if len(chosen) < nodes or (filtered and len(chosen) != nodes):
        which = "include/exclude select" if filtered else "the hostfile lists"
        return f"hardware.nodes: {nodes} node(s), but {which} {len(chosen)} host(s): {', '.join(chosen)}"
    for host in list(chosen)[:nodes]:
        have = len(chosen[host])
        if have < per_node or (filtered and have != per_node):
            return (
                f"hardware.gpus: {per_node} rank(s) a node, but host {host!r} has {have} slot(s) "
                f"{'selected' if filtered else 'in the hostfile'}"
            )
    return None


def master_port(spec: Spec, nodes: int, free_port: int) -> int:
    """The rendezvous port: the spec's; else a free port here when the master is this host (one host,
    or node 0 of a launch without ssh), DeepSpeed's default when ssh starts the master elsewhere."""
    if spec.master_port:
        return spec.master_port
    if nodes > 1 and not spec.no_ssh:
        return DEFAULT_PORT
    return free_port


def runner_options(
    spec: Spec, nodes: int, per_node: int, port: int, node_rank: int | None = None
) -> list[str]:
    """The runner's options for `nodes` hosts of `per_node` ranks, before `--module trainer`: what the
    spec names, passed unchanged.

    One host without a hostfile keeps the launch of old: `--num_gpus` ranks here. `node_rank` is this
    node's, for a launch without ssh (default: the spec's).
    """
    argv: list[str] = []
    if spec.hostfile:
        argv += ["--hostfile", spec.hostfile]
    if spec.include or spec.exclude:
        argv += ["--include", spec.include] if spec.include else ["--exclude", spec.exclude]
    else:
        if spec.hostfile:
            argv += ["--num_nodes", str(nodes)]
        argv += ["--num_gpus", str(per_node)]
    if spec.master_addr:
        argv += ["--master_addr", spec.master_addr]
    argv += ["--master_port", str(port)]
    if spec.no_ssh:
        argv += ["--no_ssh", "--node_rank", str(spec.node_rank if node_rank is None else node_rank)]
    elif nodes > 1:
        argv += ["--launcher", spec.backend]
        if spec.launcher_args:
            argv += ["--launcher_args", spec.launcher_args]
        if spec.ssh_port:
            argv += ["--ssh_port", str(spec.ssh_port)]
    return [*argv, *spec.extra_args]


def extra_args_problem(args: Sequence[str]) -> str | None:
    """Why `launcher.extra_args` cannot be passed (an option the cockpit sets, or none of the runner's)."""
    for arg in args:
        if not arg.startswith("-"):
            continue  # a value of the option before it
        name = arg.split("=", 1)[0]
        if name == "-q":
            continue
        if name not in EXTRA_OPTIONS:
            return (
                f"{name} is not a runner option the profile may add here (the cockpit sets --module, "
                f"--num_gpus and the [launcher] fields itself; allowed: {', '.join(EXTRA_OPTIONS)})"
            )
    return None
