"""The host RAM guard: stop a run with a checkpoint before the kernel's OOM killer takes a rank.

With parameters and optimizer state offloaded, host RAM is what runs out, and the OOM killer's
SIGKILL leaves no checkpoint. The supervisor measures the resident memory (RSS) of the stage's own
process tree (the launcher and every rank, or the evaluation) at every poll and, once it reaches the
profile's `hardware.host_ram_limit_gib`, asks for a checkpoint and a stop, once.

The run's own tree, not the host's used RAM: on a shared machine another user's processes must not
stop this run. RSS summed over processes counts shared pages (libraries) once per process, so it
errs high: the guard stops early rather than late. Pure functions: figures in, decision out.
"""

from __future__ import annotations

from cockpit.units import common_unit

GIB_MIB = 1024.0
MIB = 1024**2
# The default limit leaves this much of the host's RAM to everything else: 5% or 4 GiB, the larger,
# but never more than half the host (a small machine still gets a usable limit).
MARGIN_FRACTION = 0.05
MARGIN_MIN_MIB = 4 * GIB_MIB


def default_margin_mib(host_total_mib: float) -> float:
    """What the default limit leaves free: max(5%, 4 GiB), at most half of the host's RAM."""
    return min(max(MARGIN_FRACTION * host_total_mib, MARGIN_MIN_MIB), host_total_mib / 2)


def ram_limit_mib(limit_gib: float, host_total_mib: float) -> float:
    """The limit in MiB: `hardware.host_ram_limit_gib`, or (0) the host's total less its margin."""
    if limit_gib > 0:
        return limit_gib * GIB_MIB
    return host_total_mib - default_margin_mib(host_total_mib)


def ram_verdict(run_rss_mib: float | None, limit_mib: float) -> str | None:
    """The diagnosis when the run's processes have reached the limit, else None (no reading: None)."""
    if run_rss_mib is None or limit_mib <= 0 or run_rss_mib < limit_mib:
        return None
    return f"host RAM at {_apart(run_rss_mib * MIB, limit_mib * MIB)}; stopped before the OOM killer"


def _apart(used: float, limit: float) -> str:
    """`553.0 of 512.0 MiB`, `2.51 of 2.50 GiB`: both byte counts in the unit the plan's byte formatter
    picks for the larger, with as many decimals (one to three) as it takes for figures that differ to
    read differently (one where even three cannot tell them apart: the limit, just reached)."""
    name, unit = common_unit([used, limit])
    for digits in (1, 2, 3, 1):
        at, of = (f"{n / unit:,.{digits}f}" for n in (used, limit))
        if at != of:
            break
    return f"{at} of {of} {name}"
