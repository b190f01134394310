"""report.json and report.md in a run's record: writing them, reading the report back, or building it
in memory when the record has predictions but no report yet."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from cockpit.record import RunPaths
from cockpit.record.atomic import write_json_atomic, write_text_atomic
from cockpit.report.build import run_report
from cockpit.report.markdown import render_markdown
from cockpit.report.model import Report

BUILT = "built from predictions"  # `Report.source` of a report built in memory (never written)


def write_report(run_dir: Path, report: Report) -> tuple[Path, Path]:
    """`report.json` and `report.md` beside the run's predictions."""
    paths = RunPaths(Path(run_dir))
    json_path = write_json_atomic(paths.report_json, report.to_dict())
    return json_path, write_text_atomic(paths.report_md, render_markdown(report))


def read_report_json(run_dir: Path) -> Report | None:
    """The report the run wrote (its report.json); None when there is none. Raises ReportFormatError
    (a ValueError) for a file that is not a report, and ValueError for broken JSON."""
    path = RunPaths(Path(run_dir)).report_json
    if not path.is_file():
        return None
    return Report.from_dict(json.loads(path.read_text(encoding="utf-8")))


def has_report(run_dir: Path) -> bool:
    """Whether the run has a report, or predictions to build one from (two stats; call off the UI thread)."""
    paths = RunPaths(Path(run_dir))
    return paths.report_json.is_file() or bool(paths.prediction_files())


def load_report(run_dir: Path) -> Report | None:
    """The run's report: its report.json, else built in memory from its predictions (nothing is written);
    None when it has neither. Reads files and may run the bootstrap: call it on a worker thread."""
    report = read_report_json(run_dir)
    if report is not None:
        return report
    built = run_report(Path(run_dir))
    return replace(built, source=BUILT) if built.tenants else None
