"""The evaluation report: one typed shape (`Report`), built from the predictions beside it, written to
report.json with `Report.to_dict`, and read back with `Report.from_dict` by every renderer.

- `model`: the dataclasses and their report.json form;
- `build`: the producer (scikit-learn metrics, paired bootstrap, means, serving cost);
- `store`: report.json and report.md in a run's record;
- `format`: how figures are written, for every renderer;
- `markdown`, `terminal`: the Markdown report and the terminal's rich table;
- `bars`: the delta chart's geometry, for the app's widget.
"""

from cockpit.report.bars import Cell, Scale, bar_cells, delta_scale
from cockpit.report.build import (
    build_report,
    macro_f1_batch,
    metrics_batch,
    paired_delta,
    paired_deltas,
    run_report,
    serving_cost,
    tenant_metrics,
)
from cockpit.report.format import VERDICT_COLOUR, ci_text, delta_cell, points, signed, summary_line, usd
from cockpit.report.markdown import render_markdown, serving_lines
from cockpit.report.model import (
    METRIC_NAMES,
    METRICS,
    REPORT_JSON,
    REPORT_VERSION,
    TUNED,
    Delta,
    Metrics,
    Report,
    ReportFormatError,
    Row,
    Serving,
    mean_metrics,
)
from cockpit.report.store import BUILT, has_report, load_report, read_report_json, write_report
from cockpit.report.terminal import macro_f1_table

__all__ = [
    "BUILT",
    "METRICS",
    "METRIC_NAMES",
    "REPORT_JSON",
    "REPORT_VERSION",
    "TUNED",
    "VERDICT_COLOUR",
    "Cell",
    "Delta",
    "Metrics",
    "Report",
    "ReportFormatError",
    "Row",
    "Scale",
    "Serving",
    "bar_cells",
    "build_report",
    "ci_text",
    "delta_cell",
    "delta_scale",
    "has_report",
    "load_report",
    "macro_f1_batch",
    "macro_f1_table",
    "mean_metrics",
    "metrics_batch",
    "paired_delta",
    "paired_deltas",
    "points",
    "read_report_json",
    "render_markdown",
    "run_report",
    "serving_cost",
    "serving_lines",
    "signed",
    "summary_line",
    "tenant_metrics",
    "usd",
    "write_report",
]
