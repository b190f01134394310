"""The short name a GPU's results are filed under: `NVIDIA H100 80GB HBM3` -> `h100`."""

from __future__ import annotations

import re


def card_tag(device: str | None) -> str:
    """The card's model (h100, h200, a100, ...) from a device name, else its last word; `cpu` for none."""
    name = (device or "").strip()
    if not name or name.lower().startswith("cpu"):
        return "cpu"
    found = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", name)
    return (found.group(1) if found else name.split()[-1]).lower()
