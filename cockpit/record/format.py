"""Where things live in a run directory, and the format's version.

```
runs/<run-id>/
  run.json                 manifest (status, profile, versions, argv, times, exit code, diagnosis)
  plan.json                the memory plan the run started with (cockpit.plan), for checking the audit
  events/<writer>.jsonl    append-only event streams, one per writing process
  output.log               every byte the training processes printed
  output-node<N>.log       the same, of node N's ranks in a launch without ssh (`cockpit join`)
  supervisor.log           the detached supervisor's own messages
  supervisor-node<N>.log   node N's supervisor's own messages
  telemetry.log            the telemetry sampler's own messages
  control/{stop,kill}      requests to the running trainer
  stacks/rank<N>.txt       rank N's Python stacks, dumped when the supervisor asks (a stall)
  checkpoints/             trainer checkpoints
  adapter/                 the run's LoRA adapter: the best (lowest validation loss) when validation ran
  adapter-last/            the last step's adapter, when the best one is of an earlier step
  adapter-best/            while training: a copy of the best adapter so far (step-<N>/, best.json)
  predictions/<system>.jsonl  per-system predictions on the held-out split
  report.json, report.md   the evaluation report
  .reserve                 disk space the supervisor holds back for its last words
```

Every name above is spelled here only: the rest of the cockpit asks `RunPaths`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FORMAT_VERSION = 1

TERMINAL_STATUSES = ("finished", "failed", "stopped", "stalled")


def jsonl_files(folder: Path) -> list[Path]:
    """The `*.jsonl` files in a folder, sorted by name (none when the folder is missing)."""
    return sorted(folder.glob("*.jsonl")) if folder.is_dir() else []


@dataclass(frozen=True)
class RunPaths:
    """The paths inside one run directory."""

    root: Path

    @property
    def run_id(self) -> str:
        return self.root.name

    @property
    def manifest(self) -> Path:
        return self.root / "run.json"

    @property
    def events_dir(self) -> Path:
        return self.root / "events"

    def events(self, writer: str) -> Path:
        """The event file owned by one writer (`supervisor`, `trainer-rank0`, `telemetry`, ...)."""
        return self.events_dir / f"{writer}.jsonl"

    def event_files(self) -> list[Path]:
        """Every writer's event file, sorted by name (none when there is no `events/` yet)."""
        return jsonl_files(self.events_dir)

    @property
    def plan(self) -> Path:
        return self.root / "plan.json"

    @property
    def output_log(self) -> Path:
        return self.root / "output.log"

    @property
    def supervisor_log(self) -> Path:
        return self.root / "supervisor.log"

    def node_output_log(self, node_rank: int) -> Path:
        """What node N's ranks printed, in a launch without ssh (node 0's is `output_log`)."""
        return self.root / f"output-node{node_rank}.log"

    def node_supervisor_log(self, node_rank: int) -> Path:
        """Node N's supervisor's own messages (`cockpit.service.node`)."""
        return self.root / f"supervisor-node{node_rank}.log"

    @property
    def telemetry_log(self) -> Path:
        return self.root / "telemetry.log"

    @property
    def reserve(self) -> Path:
        return self.root / ".reserve"

    @property
    def control_dir(self) -> Path:
        return self.root / "control"

    @property
    def stop_request(self) -> Path:
        return self.control_dir / "stop"

    @property
    def kill_request(self) -> Path:
        return self.control_dir / "kill"

    def stack(self, rank: int) -> Path:
        """Where rank N dumps its Python stacks on SIGUSR1 (the supervisor asks when it judges a stall)."""
        return self.root / "stacks" / f"rank{rank}.txt"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def adapter(self) -> Path:
        return self.root / "adapter"

    @property
    def last_adapter(self) -> Path:
        """The last step's adapter, kept beside `adapter` when that one is an earlier step's (the best)."""
        return self.root / "adapter-last"

    @property
    def best_adapter(self) -> Path:
        """While training: the best adapter so far (`trainer.evaluation.best_adapter`); `adapter` at the
        end."""
        return self.root / "adapter-best"

    @property
    def predictions(self) -> Path:
        return self.root / "predictions"

    def prediction(self, system: str) -> Path:
        """One system's predictions file."""
        return self.predictions / f"{system}.jsonl"

    def prediction_files(self) -> list[Path]:
        """Every system's predictions file, sorted by name (none before the evaluation)."""
        return jsonl_files(self.predictions)

    @property
    def report_json(self) -> Path:
        return self.root / "report.json"

    @property
    def report_md(self) -> Path:
        return self.root / "report.md"

    @property
    def rehearsal(self) -> Path:
        """A rehearsal's measured depths and its prediction of the whole run (`cockpit.rehearse`)."""
        return self.root / "rehearsal.json"
