"""The hardware a plan is for: flags first, then the profile, then this machine (NVML, psutil)."""

from __future__ import annotations

from dataclasses import dataclass, field

from cockpit.profiles import Profile


@dataclass(frozen=True)
class Hardware:
    gpus: int  # a node
    gpu_name: str
    gpu_mem_gib: float  # 0: unknown
    host_ram_gib: float  # a node
    source: dict[str, str] = field(default_factory=dict)  # field -> "flag" | "profile" | "this machine"
    nodes: int = 1

    @property
    def ranks(self) -> int:
        """Every rank of the job: nodes x (GPUs a node, or one on the CPU)."""
        return self.nodes * max(1, self.gpus)


def machine_facts() -> tuple[list[dict], float]:
    """GPUs NVML sees (name, memory) and this machine's RAM in GiB."""
    import psutil

    from cockpit.hostinfo import gpu_inventory

    return gpu_inventory(), psutil.virtual_memory().total / 1024**3


def resolve_hardware(
    profile: Profile,
    gpus: int | None = None,
    gpu_mem_gib: float | None = None,
    host_ram_gib: float | None = None,
    probe: bool = True,
    nodes: int | None = None,
) -> Hardware:
    """Each figure from the first that has it: the flag, the profile (non-zero), this machine."""
    hw = profile.hardware
    machine_gpus, machine_ram = machine_facts() if probe else ([], 0.0)
    source: dict[str, str] = {}

    if gpus is not None:
        n, source["gpus"] = gpus, "flag"
    else:
        n, source["gpus"] = hw.gpus, "profile"

    name = hw.gpu_name or (machine_gpus[0]["name"] if machine_gpus else "")
    if gpu_mem_gib is not None:
        mem, source["gpu_mem_gib"] = gpu_mem_gib, "flag"
    elif hw.gpu_mem_gib:
        mem, source["gpu_mem_gib"] = hw.gpu_mem_gib, "profile"
    elif machine_gpus:
        mem, source["gpu_mem_gib"] = min(g["mem_total_mib"] for g in machine_gpus) / 1024, "this machine"
        name = machine_gpus[0]["name"]
    else:
        mem, source["gpu_mem_gib"] = 0.0, "unknown"

    if host_ram_gib is not None:
        ram, source["host_ram_gib"] = host_ram_gib, "flag"
    elif hw.host_ram_gib:
        ram, source["host_ram_gib"] = hw.host_ram_gib, "profile"
    elif machine_ram:
        ram, source["host_ram_gib"] = machine_ram, "this machine"
    else:
        ram, source["host_ram_gib"] = 0.0, "unknown"
    if nodes is not None:
        source["nodes"] = "flag"
    nodes = hw.nodes if nodes is None else nodes
    return Hardware(
        gpus=n, gpu_name=name, gpu_mem_gib=float(mem), host_ram_gib=float(ram), source=source, nodes=nodes
    )
