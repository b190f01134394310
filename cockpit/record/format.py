"""Where things live in a run directory, and the format's version.

```
runs/<run-id>/
  run.json                 manifest (status, profile, versions, argv, times, exit code, diagnosis)
  plan.json                the memory plan the run started with (cockpit.plan), for checking the audit
  events/<writer>.jsonl    append-only event streams, one per writing process
  output.log               every byte the training processes printed
  control/                 requests to the running trainer (stop)
  checkpoints/             trainer checkpoints
  adapter/                 the final LoRA adapter
  predictions/             per-system predictions on the held-out split
```
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FORMAT_VERSION = 1

STATUSES = ("planned", "running", "finished", "failed", "stopped", "stalled")
TERMINAL_STATUSES = ("finished", "failed", "stopped", "stalled")


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

    @property
    def output_log(self) -> Path:
        return self.root / "output.log"

    @property
    def control_dir(self) -> Path:
        return self.root / "control"

    @property
    def stop_request(self) -> Path:
        return self.control_dir / "stop"

    @property
    def kill_request(self) -> Path:
        return self.control_dir / "kill"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def adapter(self) -> Path:
        return self.root / "adapter"

    @property
    def predictions(self) -> Path:
        return self.root / "predictions"
