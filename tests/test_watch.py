"""End-to-end waits go by progress, not by a fixed time (`devtools.faults.Watch`): a command that keeps
writing its record, or keeps working, is waited for however long it takes; an idle one is a hang."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from devtools.faults import Watch, record_bytes, run_watched

# Writes a line into its record every tenth of a second, `sys.argv[2]` lines in all.
WRITER = """
import sys, time
from pathlib import Path
events = Path(sys.argv[1]) / "events" / "trainer-rank0.jsonl"
events.parent.mkdir(parents=True, exist_ok=True)
for n in range(int(sys.argv[2])):
    with open(events, "a") as f:
        f.write(f'{{"n": {n}}}\\n')
    time.sleep(0.1)
print("done")
"""


def test_a_command_writing_its_record_is_waited_for_past_its_quiet_limit(tmp_path: Path) -> None:
    """Runs ten times longer than the quiet limit: never cut off while the record grows."""
    done = run_watched([sys.executable, "-c", WRITER, str(tmp_path), "100"], Watch(tmp_path, quiet_s=1.0))
    assert done.returncode == 0 and done.stdout.strip() == "done"


def test_an_idle_command_is_a_hang_and_is_ended(tmp_path: Path) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    with pytest.raises(TimeoutError, match="showed no progress for 1 s"):
        run_watched(sleeper, Watch(tmp_path, quiet_s=1.0))


def test_the_samplers_file_is_no_progress(tmp_path: Path) -> None:
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "trainer-rank0.jsonl").write_text("x\n")
    before = record_bytes(tmp_path)
    (tmp_path / "events" / "telemetry.jsonl").write_text("the sampler writes while a run hangs\n")
    assert record_bytes(tmp_path) == before
    (tmp_path / "output.log").write_text("printed\n")
    assert record_bytes(tmp_path) > before
