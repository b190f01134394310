"""`python -m tests.launch_over_record RECORD ARGS...`: the `cockpit ARGS` command, in a process of its own,
with the lifecycle's launches (`run`, `resume`, `rehearse`) handing back RECORD, a run that has ended,
instead of starting a supervisor and a trainer.

Everything after the launch is the real front end: the rule that decides between the full-screen app,
the headless follow and a refusal, the follow itself and what it prints where. A test gives the process
whatever stdin and stdout it needs (/dev/null, pipes) and waits for it to exit.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cockpit import cli
from cockpit.service import lifecycle


def main(argv: list[str]) -> int:
    record = Path(argv[0])

    def launched(*_args: object, **_how: object) -> lifecycle.Launch:
        return lifecycle.Launch(record, None)  # no process: the follow reads the record's own end

    def resumed(*_args: object, **_how: object) -> lifecycle.Resumed:
        return lifecycle.Resumed(record, None, checkpoint=None)

    lifecycle.start = launched
    lifecycle.start_rehearsal = launched
    lifecycle.resume = resumed
    return cli.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
