"""The house in figures: modules, layers, loops, imports that run up a floor, the largest rooms, and who
imports each layer, read from the one table of layers (`devtools/layers.py`).

    python benchmarks/architecture.py                  # this checkout
    python benchmarks/architecture.py --before REV     # and a revision beside it (a git worktree)

A revision from before the moves of issue 28 has its modules at their old names: `RENAMED` maps them to
where they went, so one table reads both trees. Imports include lazy and type-checking ones (as the
architecture test reads them). Writes architecture.md and .json under $OUT (else benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SERVICE = ("lifecycle", "supervisor", "node", "telemetry", "stall", "liveness", "ramguard", "shm")
SERVICE += ("diagnosis", "runs", "doctor", "lost", "disk_space")
# The trainer's modules that moved into its rooms (issue 29's session), by room.
TRAINER_ROOMS = {
    "layers": "attention flash4 rope fused_norm routing lora_forward experts4bit experts_model "
    "frozen_experts loss",
    "weights": "loader nf4_cache load_share quant random_weights placement zero3_fetch",
    "evaluation": "evaluate scoring decode decode_blocks eval_batch eval_timing serving validation "
    "best_adapter",
    "inputs": "data packing tiny assets",
}
# Old module prefix -> its home after issue 28's moves and the trainer's rooms (the before tree read
# through the same table).
RENAMED = {
    **{f"trainer.{m}": f"trainer.{room}.{m}" for room, ms in TRAINER_ROOMS.items() for m in ms.split()},
    **{f"cockpit.{m}": f"cockpit.service.{m}" for m in SERVICE},
    "trainer.guard": "cockpit.service.guard",
    "cockpit.control": "cockpit.record.control",
    "trainer.checkpoints": "cockpit.record.checkpoints",
    "cockpit.downsample": "cockpit.record.downsample",
    "cockpit.faults": "devtools.faults",
    "cockpit.import_graph": "devtools.import_graph",
    "cockpit.dsops": "cockpit.ops.dsops",
    "cockpit.extcache": "cockpit.ops.extcache",
}
TOP = 5


def renamed(module: str) -> str:
    for old, new in RENAMED.items():
        if module == old or module.startswith(old + "."):
            return new + module[len(old) :]
    return module


def figures(root: Path) -> dict[str, Any]:
    """The house at `root`, read through the one table of layers."""
    from devtools import checks
    from devtools.import_graph import graph, modules
    from devtools.layers import LAYERS, claims, layer_of

    every = {renamed(name): path for name, path in modules(root, ("cockpit", "trainer")).items()}
    # development tools that sat in the package before (their home is devtools/ now, not shipped)
    shipped_tools = sorted(name for name in every if claims("devtools", name))
    mods = {name: path for name, path in every.items() if name not in shipped_tools}
    raw = graph(root, ("cockpit", "trainer"), type_checking=True)  # the names as they were in that tree
    edges = {renamed(name): {renamed(t) for t in targets} for name, targets in raw.items()}
    lines = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in mods.items()}
    rank = {name: (layer_of(name) or ("unclaimed", -1)) for name in mods}
    per_layer = {name: sorted(m for m in mods if rank[m][0] == name) for name, _, _ in LAYERS}
    importers = {
        name: sorted(
            a
            for a, ts in edges.items()
            if rank.get(a, ("", 0))[0] != name and any(rank.get(b, ("",))[0] == name for b in ts)
        )
        for name, _, _ in LAYERS
    }
    return {
        "modules": len(mods),
        "lines": sum(lines.values()),
        "unclaimed": sorted(m for m in mods if rank[m][1] < 0),
        "over_500": sorted((n, c) for n, c in lines.items() if c > 500),
        "largest": sorted(lines.items(), key=lambda kv: -kv[1])[:TOP],
        "module_loops": checks.module_loops(edges),
        "room_loops": checks.room_loops(edges),
        "upward": checks.upward(edges),
        "trainer_imports": checks.into_started(raw),
        "shipped_tools": shipped_tools,
        "layers": {name: len(ms) for name, ms in per_layer.items()},
        "importers": {name: len(v) for name, v in importers.items()},
        "importer_names": importers,
    }


def report(results: dict[str, Any], revs: dict[str, str]) -> str:
    out = ["# The house in figures (devtools/layers.py)", ""]
    for when, fig in results.items():
        out += [
            f"## {when} ({revs[when]}): {fig['modules']} modules, {fig['lines']:,} lines in cockpit/ and "
            "trainer/",
            "",
            f"- loops between modules: {len(fig['module_loops'])} {fig['module_loops'] or ''}",
            f"- loops between rooms: {len(fig['room_loops'])} {fig['room_loops'] or ''}",
            f"- imports that run up a floor: {len(fig['upward'])}"
            + "".join(f"\n  - {a} -> {b}" for a, b in fig["upward"]),
            f"- imports of the trainer from cockpit/ (a process): {len(fig['trainer_imports'])}"
            + "".join(f"\n  - {a} -> {b}" for a, b in fig["trainer_imports"]),
            f"- modules no layer claims: {len(fig['unclaimed'])} {', '.join(fig['unclaimed'])}",
            f"- development tools shipped in the package: {len(fig['shipped_tools'])} "
            + ", ".join(fig["shipped_tools"]),
            f"- modules over 500 lines: {len(fig['over_500'])} "
            + ", ".join(f"{n} ({c})" for n, c in fig["over_500"]),
            "",
            "| largest module | lines |",
            "|---|---|",
            *[f"| {name} | {n} |" for name, n in fig["largest"]],
            "",
            "| layer | modules in it | modules importing it (from outside it) |",
            "|---|---|---|",
            *[f"| {layer} | {fig['layers'][layer]} | {fig['importers'][layer]} |" for layer in fig["layers"]],
            "",
        ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--before", help="a git revision to compare with (checked out in a temporary worktree)"
    )
    args = parser.parse_args(argv)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    revs = {"after": head.stdout.strip() or "HEAD"}
    results: dict[str, Any] = {}
    if args.before:
        revs["before"] = args.before
        with tempfile.TemporaryDirectory() as tmp:
            where = Path(tmp) / "before"
            subprocess.run(
                ["git", "worktree", "add", "-q", "--detach", str(where), args.before], cwd=ROOT, check=True
            )
            try:
                results["before"] = figures(where)
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=ROOT, check=True)
    results["after"] = figures(ROOT)
    text = report(results, revs)
    print(text)
    dest = Path(os.environ.get("OUT") or ROOT / "benchmarks/results")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "architecture.md").write_text(text)
    (dest / "architecture.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
