"""One rank's guard: runs the trainer as its child and records how it ended, in a `rank_exit` event.

A rank killed by a signal (SIGKILL from the kernel's OOM killer, a segfault) cannot say so itself, and
the DeepSpeed launcher reports only that some rank ended; the guard, a small process around each rank,
waits for it and writes its exit status, host and node into `events/guard-rank<R>.jsonl`. That is how
the supervisor names the rank that failed (`cockpit.service.diagnosis.culprit`). The guard exits as its
trainer did (the same code, or the same signal), so the launcher sees what it always saw.

Launched by the DeepSpeed launcher as `python -m cockpit.service.guard --run-dir DIR [trainer arguments]`,
once per rank, in place of `python -m trainer`; signals it receives go on to the trainer.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

from cockpit.ranks import rank_identity
from cockpit.record import EventWriter, RunPaths

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child: a guard killed by SIGKILL takes its trainer along (Linux; elsewhere nothing)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def exit_fields(returncode: int) -> dict[str, object]:
    """The event's account of a wait status: the exit code, or the signal by name."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return {"exit_code": returncode, "signal": name}
    return {"exit_code": returncode, "signal": None}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m cockpit.service.guard", add_help=False)
    parser.add_argument("--run-dir", required=True, type=Path)
    known, _ = parser.parse_known_args(args)
    me = rank_identity()
    child = subprocess.Popen([sys.executable, "-u", "-m", "trainer", *args], preexec_fn=_die_with_parent)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    returncode = child.wait()
    path = RunPaths(known.run_dir).events(f"guard-rank{me.rank}")
    # A full disk: the exit status still reaches the launcher.
    with contextlib.suppress(OSError), EventWriter(path, rank=me.rank) as events:
        events.write("rank_exit", pid=child.pid, **exit_fields(returncode), **me.fields())
    if returncode < 0:  # end as the trainer did: by the same signal
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's disposition cannot be set (nor needs to)
            signal.signal(-returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -returncode)
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    sys.exit(main())
