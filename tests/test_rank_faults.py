"""Diagnoses per rank: from each rank's `rank_start`, its guard's `rank_exit` and its own `error` events,
the rank that failed first on its own is named, with its host (and node, when there are several)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cockpit.record import EventWriter, RunPaths, read_events
from cockpit.record.view import RunView
from cockpit.service.diagnosis import EndFacts, culprit, diagnose, main_stack, stall_where

GLOO = "[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:55203: Connection reset by peer."


def record(
    tmp_path: Path, ranks: list[tuple[str, int, int]], events: list[tuple[float, str, int, dict]]
) -> RunView:
    """A record of one launch: ranks as (host, node, local index), then (t, kind, rank, fields) events,
    each written by its writer (trainer or guard) through the record's writer, then folded."""
    paths = RunPaths(tmp_path)
    with EventWriter(paths.events("supervisor")) as sup:
        sup.write("launch", at=1.0, stage="train", argv=["python"], pid=1, world_size=len(ranks))
    nodes = len({node for _, node, _ in ranks})
    for rank, (host, node, local) in enumerate(ranks):
        with EventWriter(paths.events(f"trainer-rank{rank}"), rank=rank) as w:
            w.write(
                "rank_start", at=2.0, pid=100 + rank, host=host, node_rank=node, local_rank=local,
                world_size=len(ranks), nodes=nodes,
            )  # fmt: skip
    for t, kind, rank, fields in sorted(events, key=lambda e: e[0]):
        writer = "guard" if kind == "rank_exit" else "trainer"
        with EventWriter(paths.events(f"{writer}-rank{rank}"), rank=rank) as w:
            w.write(kind, at=t, **fields)
    view = RunView()
    view.apply(read_events(tmp_path))
    return view


def killed(signal: str, code: int) -> dict[str, Any]:
    return {"exit_code": code, "signal": signal}


def error(type_: str, message: str) -> dict[str, Any]:
    return {"type": type_, "message": message, "step": 2}


def diagnosis(view: RunView, **facts: Any) -> str:
    fault = culprit(view.ranks, view.rank_exits, view.rank_errors)
    return diagnose(EndFacts(facts.pop("returncode", 1), "", last_step=2, culprit=fault, **facts))[1]


def test_the_rank_killed_first_is_named_not_the_one_whose_peer_went_away(tmp_path: Path) -> None:
    view = record(
        tmp_path,
        [("gpu-a", 0, 0), ("gpu-a", 0, 1)],
        [
            (10.000, "rank_exit", 1, killed("SIGKILL", -9)),
            (10.003, "error", 0, error("RuntimeError", GLOO)),  # 3 ms later: its consequence
            (11.0, "rank_exit", 0, killed("SIGTERM", -15)),  # the launcher ending the others
        ],
    )
    assert diagnosis(view) == "rank 1 on gpu-a killed by SIGKILL after step 2"


def test_out_of_memory_names_the_rank_its_host_and_node(tmp_path: Path) -> None:
    view = record(
        tmp_path,
        [("gpu-a", 0, 0), ("gpu-a", 0, 1), ("gpu-b", 1, 0), ("gpu-b", 1, 1)],
        [
            (9.0, "error", 0, error("RuntimeError", GLOO)),  # earlier, but only a collective's complaint
            (9.5, "error", 2, error("OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB")),
            (9.6, "error", 3, error("DistBackendError", "NCCL error in: ProcessGroupNCCL.cpp")),
        ],
    )
    line = diagnosis(view, gpu_peak_mib={0: 70_000.0, 2: 79_000.0})
    assert (
        line
        == "CUDA out of memory in rank 2 on gpu-b (node 1) after step 2 (peak GPU0 68.4 GiB, GPU2 77.1 GiB)"
    )


def test_a_crash_quotes_the_ranks_own_error(tmp_path: Path) -> None:
    view = record(
        tmp_path,
        [("h", 0, 0), ("h", 0, 1)],
        [
            (5.0, "error", 1, error("ValueError", "tokenizer has no pad token")),
            (5.1, "error", 0, error("RuntimeError", GLOO)),
            (5.2, "rank_exit", 1, killed(None, 1)),
            (5.3, "rank_exit", 0, killed(None, 1)),
        ],
    )
    assert (
        diagnosis(view)
        == "rank 1 on h crashed after step 2 with exit code 1: ValueError: tokenizer has no pad token"
    )


def test_an_exit_code_without_an_error_is_named(tmp_path: Path) -> None:
    view = record(tmp_path, [("h", 0, 0), ("h", 0, 1)], [(3.0, "rank_exit", 0, killed(None, 3))])
    assert diagnosis(view) == "rank 0 on h crashed after step 2 with exit code 3"


def test_a_kill_near_the_ram_limit_is_host_oom_of_that_rank(tmp_path: Path) -> None:
    view = record(tmp_path, [("h", 0, 0), ("h", 0, 1)], [(3.0, "rank_exit", 1, killed("SIGKILL", -9))])
    line = diagnosis(view, host_ram_peak_fraction=0.97, host_ram_peak_mib=900 * 1024)
    assert line.startswith("rank 1 on h killed by SIGKILL after step 2 with host RAM at 900.0 GiB, 97%")


def test_aborts_after_an_nccl_timeout_are_not_the_cause(tmp_path: Path) -> None:
    """NCCL's watchdog aborts the ranks that waited; the one that stopped answering was ended by SIGTERM."""
    view = record(
        tmp_path,
        [("h", 0, 0), ("h", 0, 1)],
        [(8.0, "rank_exit", 0, killed("SIGABRT", -6)), (9.0, "rank_exit", 1, killed("SIGTERM", -15))],
    )
    fault = culprit(view.ranks, view.rank_exits, view.rank_errors)
    assert fault is not None and fault.kind == "collective"
    out = "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE)"
    line = diagnose(EndFacts(-6, out, last_step=2, culprit=fault))[1]
    assert line == "NCCL/collective timeout after step 2: a rank stopped answering"


def test_ranks_ended_by_sigterm_name_nobody(tmp_path: Path) -> None:
    """The supervisor (a stall, a stop) and the launcher end ranks by SIGTERM: none of them failed."""
    exits = [(4.0, "rank_exit", r, killed("SIGTERM", -15)) for r in (0, 1)]
    view = record(tmp_path, [("h", 0, 0), ("h", 0, 1)], exits)
    assert culprit(view.ranks, view.rank_exits, view.rank_errors) is None
    assert diagnosis(view, returncode=-15) == "terminated by SIGTERM after step 2"


def test_a_new_launch_forgets_the_last_attempts_ranks(tmp_path: Path) -> None:
    view = record(tmp_path, [("h", 0, 0), ("h", 0, 1)], [(3.0, "rank_exit", 1, killed("SIGKILL", -9))])
    view.apply([{"t": 20.0, "kind": "launch", "stage": "train", "argv": [], "pid": 2}])
    assert view.ranks == {} and view.rank_exits == {}
    assert culprit(view.ranks, view.rank_exits, view.rank_errors) is None


@pytest.mark.parametrize(
    ("ranks", "labels"),
    [
        ([("gpu-a", 0, 0), ("gpu-a", 0, 1)], ["r0", "r1"]),  # one node: as ever
        ([("gpu-a", 0, 0), ("gpu-a", 0, 1), ("gpu-b", 1, 0)], ["gpu-a:0", "gpu-a:1", "gpu-b:0"]),
        ([("vm", 0, 0), ("vm", 1, 0)], ["vm/n0:0", "vm/n1:0"]),  # two nodes simulated on one host
    ],
)
def test_each_rank_is_labelled_by_host_and_index(tmp_path: Path, ranks: list, labels: list[str]) -> None:
    view = record(tmp_path, ranks, [])
    assert [view.rank_label(r) for r in range(len(ranks))] == labels


# faulthandler's dumps of a real stall on two CPU ranks (hang:3:1), trimmed: rank 0 waits in the loss's
# all-gather, rank 1 sleeps in the test hook.
WAITING = """Current thread 0x00007f74f6666b80 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 4287 in all_gather
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/venv/lib/python3.11/site-packages/transformers/trainer_pt_utils.py", line 207 in distributed_concat
  File "/venv/lib/python3.11/site-packages/transformers/trainer.py", line 2257 in _maybe_log_save_evaluate
  File "/work/trainer/__main__.py", line 338 in train
"""
STUCK = """Thread 0x00007fd3e1a8a640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 629 in wait

Current thread 0x00007fd3efa8ab80 (most recent call first):
  File "/work/trainer/callbacks.py", line 259 in on_step_end
  File "/venv/lib/python3.11/site-packages/transformers/trainer_callback.py", line 545 in call_event
  File "/venv/lib/python3.11/site-packages/transformers/trainer.py", line 1957 in _run_epoch
"""


def test_the_stalled_rank_is_the_one_not_waiting_in_a_collective() -> None:
    ranks = {r: {"host": "vm", "node_rank": r, "nodes": 2} for r in (0, 1)}
    assert stall_where({0: WAITING, 1: STUCK}, ranks) == (
        "rank 1 on vm (node 1) is stuck in on_step_end (trainer/callbacks.py:259), "
        "the others wait in a collective"
    )
    assert main_stack(STUCK)[0] == ("/work/trainer/callbacks.py", 259, "on_step_end"), "the dumping thread"
    assert stall_where({0: WAITING, 1: WAITING}, ranks).startswith("every rank here waits in a collective")
    assert stall_where({0: STUCK, 1: STUCK}, ranks) == "", "all alike: nothing to tell them apart"
    assert stall_where({0: "", 1: STUCK}, ranks) == "", "a rank that did not dump says nothing"
