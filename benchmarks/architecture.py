"""Architecture figures: the five largest modules by lines, and how many modules import each layer.

    python benchmarks/architecture.py                       # this checkout
    python benchmarks/architecture.py --before REV          # and a revision beside it (via git worktree)

Layers as ARCHITECTURE.md names them; a module counts once per layer it imports (lazy imports included,
`if TYPE_CHECKING:` imports not). Writes architecture.md and .json under $OUT (else benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LAYERS = {
    "record": ("cockpit.record",),
    "contract + profiles": ("cockpit.contract", "cockpit.profiles"),
    "plan": ("cockpit.plan",),
    "report": ("cockpit.report", "cockpit.app.report_model"),
    "rehearse": ("cockpit.rehearse",),
    "service": (
        "cockpit.service.lifecycle",
        "cockpit.service.supervisor",
        "cockpit.service.runs",
        "cockpit.service.telemetry",
        "cockpit.service.stall",
        "cockpit.service.liveness",
        "cockpit.record.control",
        "cockpit.service.diagnosis",
    ),
    "cli + headless": ("cockpit.cli", "cockpit.headless"),
    "app": ("cockpit.app",),
    "trainer": ("trainer",),
}


def in_layer(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def figures(root: Path) -> dict:
    from devtools.import_graph import graph, modules

    mods = modules(root, ("cockpit", "trainer"))
    lines = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in mods.items()}
    largest = sorted(lines.items(), key=lambda kv: -kv[1])[:5]
    edges = graph(root, ("cockpit", "trainer", "benchmarks"))
    importers = {}
    for layer, prefixes in LAYERS.items():
        importers[layer] = sorted(
            m for m, targets in edges.items()
            if not in_layer(m, prefixes) and any(in_layer(t, prefixes) for t in targets)
        )  # fmt: skip
    return {
        "modules": len(mods),
        "lines": sum(lines.values()),
        "largest": largest,
        "importers": {k: len(v) for k, v in importers.items()},
        "importer_names": importers,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--before", help="a git revision to compare with (checked out in a temporary worktree)"
    )
    args = parser.parse_args(argv)
    results = {"after": figures(ROOT)}
    if args.before:
        with tempfile.TemporaryDirectory() as tmp:
            where = Path(tmp) / "before"
            subprocess.run(
                ["git", "worktree", "add", "-q", "--detach", str(where), args.before], cwd=ROOT, check=True
            )
            try:
                results["before"] = figures(where)
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=ROOT, check=True)
    out = ["# Architecture figures", ""]
    for when, fig in results.items():
        rev = args.before if when == "before" else "HEAD"
        out.append(
            f"## {when} ({rev}): {fig['modules']} modules, {fig['lines']:,} lines in cockpit/ and trainer/"
        )
        out += ["", "| largest module | lines |", "|---|---|"]
        out += [f"| {name} | {n} |" for name, n in fig["largest"]]
        out += ["", "| layer | modules importing it (outside it) |", "|---|---|"]
        out += [f"| {layer} | {n} |" for layer, n in fig["importers"].items()]
        out.append("")
    text = "\n".join(out)
    print(text)
    dest = Path(os.environ.get("OUT") or ROOT / "benchmarks/results")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "architecture.md").write_text(text)
    (dest / "architecture.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
