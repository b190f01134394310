"""The supervisor of a node that joined a run launched without ssh (`cockpit join RUN --node-rank N`).

With `launcher.no_ssh`, node 0's supervisor (`cockpit.service.supervisor`) owns the run: its manifest, its
diagnosis, the evaluation. Every other node runs one of these on that node, over the same run
directory (a file system both see). It waits for node 0's training launch, starts this node's ranks
with the very same runner arguments but `--node_rank N`, and says in its own event file
(`events/supervisor-node<N>.jsonl`) that it joined (`node_start`) and how its ranks ended
(`node_end`); each rank's guard writes its `rank_exit` as on node 0. The ranks' output goes to
`output-node<N>.log`. It never writes `run.json`.

It follows node 0: a kill request kills its ranks at once; once node 0's ranks have ended (its
`launch_end`, or a final status), this node's are ended too after a grace period, so none is left
waiting in a collective. A later training launch of node 0 (a rehearsal's next depth) is joined too,
until the run ends.

Usage: `python -m cockpit.service.node RUN_DIR --node-rank N`. Started by `cockpit.service.lifecycle.join`.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cockpit.record import EventWriter, RunPaths, RunReader, load_manifest
from cockpit.record.format import TERMINAL_STATUSES
from cockpit.service.diagnosis import describe_exit, read_tail
from cockpit.service.shm import remove_allreduce_buffers
from cockpit.service.spawn import KILL_GRACE_S, POLL_S, GroupEnd, node_argv, popen_logged

# How long a node waits for node 0's training launch before it gives up.
JOIN_WAIT_S = 600.0


class NodeSupervisor:
    """Joins node 0's training launches on this node until the run ends."""

    def __init__(self, run_dir: Path, node_rank: int, clock: Callable[[], float] = time.time) -> None:
        self.paths = RunPaths(Path(run_dir).resolve())
        self.node_rank = node_rank
        self.clock = clock
        self.events = EventWriter(self.paths.events(f"supervisor-node{node_rank}"))
        self.reader = RunReader(self.paths.root, strict=False)
        self.proc: subprocess.Popen[bytes] | None = None
        self.host = socket.gethostname()
        self._launch: dict[str, Any] | None = None  # node 0's latest training launch
        self._launch_ended_t: float | None = None
        self._ending = GroupEnd()

    # --- node 0's state, from the record ------------------------------------------------------------
    def _follow(self) -> None:
        for e in self.reader.poll():
            kind = e.get("kind")
            if kind == "launch" and e.get("stage") == "train" and "rank" not in e:
                self._launch, self._launch_ended_t = e, None
            elif kind == "launch_end" and e.get("stage") == "train":
                self._launch_ended_t = e["t"]

    def _run_over(self) -> bool:
        return load_manifest(self.paths.root).get("status") in TERMINAL_STATUSES

    def _next_launch(self, after: float | None, timeout: float) -> dict[str, Any] | None:
        """Node 0's first training launch later than `after`; None when the run ends or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._follow()
            launch = self._launch
            if launch is not None and (after is None or launch["t"] > after) and self._launch_ended_t is None:
                return launch
            if self._run_over():
                return None
            time.sleep(POLL_S)
        return None

    # --- this node's ranks ----------------------------------------------------------------------------
    def _start(self, launch: dict[str, Any]) -> list[str]:
        argv = node_argv(list(launch["argv"]), self.node_rank)
        self.proc = popen_logged(argv, self.paths.node_output_log(self.node_rank))
        self._ending = GroupEnd()
        self.events.write("node_launch", node_rank=self.node_rank, argv=argv, pid=self.proc.pid)
        return argv

    def _signal(self, sig: signal.Signals) -> None:
        self._ending.signal(self.proc, sig, self.clock())

    def _watch(self) -> int:
        assert self.proc is not None
        while (rc := self.proc.poll()) is None:
            self._follow()
            now = self.clock()
            if self.paths.kill_request.exists() and not self._ending.killed:
                self._signal(signal.SIGKILL)
            node0_done = self._launch_ended_t is not None or self._run_over()
            if node0_done and self._ending.terminated_at is None:
                ended = self._launch_ended_t or now
                if now - ended > KILL_GRACE_S:  # node 0's ranks are gone: these would wait for ever
                    self._signal(signal.SIGTERM)
            elif self._ending.overdue(now):
                self._signal(signal.SIGKILL)
            time.sleep(POLL_S)
        return rc

    def run(self) -> int:
        """Join each training launch of node 0 until the run ends; 0 when this node's ranks all ended well."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._signal(signal.SIGTERM))
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        worst, after, first = 0, None, True
        while True:
            launch = self._next_launch(after, JOIN_WAIT_S if first else 24 * 3600.0)
            if launch is None:
                if first:
                    self.events.write("note", message=f"node {self.node_rank}: no training launch to join")
                    worst = 1
                break
            first, after = False, launch["t"]
            self.events.write(
                "node_start", node_rank=self.node_rank, host=self.host, pid=os.getpid(), launch_t=launch["t"]
            )
            argv = self._start(launch)
            rc = self._watch()
            if "--master_port" in argv:  # DeepSpeed leaves its CPU all-reduce buffers in /dev/shm
                remove_allreduce_buffers(int(argv[argv.index("--master_port") + 1]))
            tail = read_tail(self.paths.node_output_log(self.node_rank))
            self.events.write(
                "node_end",
                node_rank=self.node_rank,
                host=self.host,
                exit_code=rc,
                exit=describe_exit(rc, tail),
                launch_t=launch["t"],
            )
            worst = worst or rc
        self.events.close()
        return 0 if worst == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cockpit.service.node", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--node-rank", type=int, required=True, help="this node's index in the hostfile")
    args = parser.parse_args(argv)
    return NodeSupervisor(args.run_dir, args.node_rank).run()


if __name__ == "__main__":
    sys.exit(main())
