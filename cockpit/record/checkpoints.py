"""Which checkpoint a resume starts from."""

from __future__ import annotations

import re
from pathlib import Path

_NAME = re.compile(r"^checkpoint-(\d+)$")


def last_complete_checkpoint(folder: Path) -> tuple[str | None, list[Path]]:
    """The newest `checkpoint-N` the Trainer finished writing, and the newer ones it did not.

    The Trainer writes `trainer_state.json` last; a checkpoint without it was cut short (killed while
    saving, disk full) and would resume from the wrong step or not load at all.
    """
    if not Path(folder).is_dir():
        return None, []
    found = sorted(
        (int(m.group(1)), p) for p in Path(folder).iterdir() if p.is_dir() and (m := _NAME.match(p.name))
    )
    incomplete: list[Path] = []
    for _, path in reversed(found):
        if (path / "trainer_state.json").is_file():
            return str(path), incomplete
        incomplete.append(path)
    return None, incomplete
