"""Where the cockpit keeps what it builds once and reuses: the tiny model, the generated tenants,
`datasets`' Arrow copies of data files and tokenized data. `$COCKPIT_CACHE`, default `~/.cache/cockpit`."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The cockpit's cache folder (not created here)."""
    return Path(os.environ.get("COCKPIT_CACHE", Path.home() / ".cache" / "cockpit")).expanduser()
