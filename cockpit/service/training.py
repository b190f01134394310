"""The training stage: the ranks launched, watched, and their end diagnosed in one line.

With several nodes launched without ssh, node 0's supervisor waits a while for every node that joined to
say how its ranks ended (`node_end`, from `cockpit.service.node`) before it diagnoses.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from typing import Any

from cockpit.launcher import master_port
from cockpit.record.schema import CUDA_PEAK_ALLOC_MIB
from cockpit.service.diagnosis import EndFacts, culprit, diagnose, read_tail
from cockpit.service.shm import remove_allreduce_buffers
from cockpit.service.spawn import POLL_S, free_port, trainer_argv
from cockpit.service.stage import StageRunner

# After node 0's ranks end, how long it waits for the nodes that joined (launches without ssh) to end
# theirs and say how (`node_end`), before diagnosing without them.
NODE_END_WAIT_S = 45.0


def train(runner: StageRunner, resume: bool, extra: Sequence[str] = ()) -> tuple[str, str, int]:
    """Launch the ranks (`extra`: trainer arguments), watch them to their end; (status, diagnosis, exit
    code)."""
    profile, keeper = runner.profile, runner.keeper
    spec, nodes = profile.launcher, profile.hardware.nodes
    port = master_port(spec, nodes, free_port())
    runner.stall_where = ""
    runner.launch(trainer_argv(profile, runner.paths.root, resume, port, extra), "train")
    if spec.no_ssh and nodes > 1:  # the ranks wait at the rendezvous until every node has joined
        others = ", ".join(str(n) for n in range(nodes) if n != spec.node_rank)
        keeper.note(
            f"node {spec.node_rank} launched; on node(s) {others}: "
            f"`cockpit join {runner.paths.run_id} --node-rank N` (the run waits for them)"
        )
    returncode = runner.watch()
    remove_allreduce_buffers(port)  # DeepSpeed leaves its CPU all-reduce buffers in /dev/shm
    keeper.write("launch_end", stage="train", exit_code=returncode)
    _wait_for_nodes(runner)
    view = runner.view
    gpu_peaks = {r: m[CUDA_PEAK_ALLOC_MIB] for r, m in view.memory.items() if CUDA_PEAK_ALLOC_MIB in m}
    facts = EndFacts(
        returncode=returncode,
        output_tail=read_tail(runner.paths.output_log),
        stop_requested=runner.stop_requested_at is not None,
        stop_reason=runner.stop_reason,
        ram_guard=runner.ram_stop or "",
        stalled=runner.stall.stalled is not None,
        stall_detail="; ".join(w for w in (runner.stall_where, runner.stall.stalled or "") if w),
        disk_full=keeper.disk_full,
        disk_free_mib=shutil.disk_usage(runner.paths.root).free / 2**20,
        host_ram_peak_fraction=runner.ram_peak_fraction,
        host_ram_peak_mib=runner.ram_peak_mib,
        gpu_peak_mib=gpu_peaks or None,
        trainer_outcome=view.trainer_outcome,
        last_step=view.step or None,
        stall_step=runner.stall.stage_step,
        culprit=_culprit(runner),
        early_stop=view.early_stop or "",
    )
    status, diagnosis = diagnose(facts)
    return status, diagnosis, returncode


def _culprit(runner: StageRunner) -> Any:
    """With several ranks, the one that failed first on its own (`cockpit.service.diagnosis.culprit`)."""
    if runner.profile.world_size <= 1:
        return None
    view = runner.view
    return culprit(view.ranks, view.rank_exits, view.rank_errors)


def _wait_for_nodes(runner: StageRunner) -> None:
    """In a launch without ssh, wait (a while) for every node that joined it to say how its ranks
    ended, so the diagnosis sees them; nodes that never joined are named in a note."""
    spec, nodes = runner.profile.launcher, runner.profile.hardware.nodes
    if not spec.no_ssh or nodes <= 1:
        return
    view = runner.view
    deadline = time.monotonic() + NODE_END_WAIT_S
    while not set(view.nodes_joined) <= set(view.nodes_ended) and time.monotonic() < deadline:
        time.sleep(POLL_S)
        runner.follow()
    silent = sorted(set(view.nodes_joined) - set(view.nodes_ended))
    if silent:
        waited = f"{NODE_END_WAIT_S:.0f} s"
        runner.keeper.note(f"node(s) {', '.join(map(str, silent))} did not report an end within {waited}")
    absent = sorted(set(range(nodes)) - {spec.node_rank} - set(view.nodes_joined))
    if absent:
        which = ", ".join(map(str, absent))
        runner.keeper.note(f"node(s) {which} never joined (`cockpit join RUN --node-rank N` on each)")
