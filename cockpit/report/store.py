"""report.json and report.md in a run's record: writing them, reading the report back, or building it
in memory when the record has predictions but no report yet."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from cockpit.record import RunPaths
from cockpit.report.build import run_report
from cockpit.report.markdown import render_markdown
from cockpit.report.model import REPORT_JSON, Report

REPORT_MD = "report.md"
BUILT = "built from predictions"  # `Report.source` of a report built in memory (never written)


def write_report(run_dir: Path, report: Report) -> tuple[Path, Path]:
    """`report.json` and `report.md` beside the run's predictions."""
    root = RunPaths(Path(run_dir)).root
    json_path, md_path = root / REPORT_JSON, root / REPORT_MD
    json_path.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
    md_path.write_text(render_markdown(report), encoding="utf-8")
    return json_path, md_path


def read_report_json(run_dir: Path) -> Report | None:
    """The report the run wrote (its report.json); None when there is none. Raises ReportFormatError
    (a ValueError) for a file that is not a report, and ValueError for broken JSON."""
    path = Path(run_dir) / REPORT_JSON
    if not path.is_file():
        return None
    return Report.from_dict(json.loads(path.read_text(encoding="utf-8")))


def has_report(run_dir: Path) -> bool:
    """Whether the run has a report, or predictions to build one from (two stats; call off the UI thread)."""
    paths = RunPaths(Path(run_dir))
    return (paths.root / REPORT_JSON).is_file() or (
        paths.predictions.is_dir() and any(paths.predictions.glob("*.jsonl"))
    )


def load_report(run_dir: Path) -> Report | None:
    """The run's report: its report.json, else built in memory from its predictions (nothing is written);
    None when it has neither. Reads files and may run the bootstrap: call it on a worker thread."""
    report = read_report_json(run_dir)
    if report is not None:
        return report
    built = run_report(Path(run_dir))
    return replace(built, source=BUILT) if built.tenants else None
