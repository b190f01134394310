"""The evaluation report: one typed shape (`Report`), built from the predictions beside it, written to
report.json with `Report.to_dict`, and read back with `Report.from_dict` by every renderer.

- `model`: the dataclasses and their report.json form;
- `build`: the producer (scikit-learn metrics, paired bootstrap, means, serving cost);
- `store`: report.json and report.md in a run's record;
- `format`: how figures are written, for every renderer;
- `markdown`, `terminal`: the Markdown report and the terminal's rich table and lines;
- `production`: the `vllm serve` command of the tuned adapter, and what the cockpit's serving figure is;
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
from cockpit.report.format import (
    VERDICT_COLOUR,
    ci_text,
    delta_cell,
    examples_text,
    n_text,
    points,
    sample_line,
    signed,
    summary_line,
    usd,
)
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
from cockpit.report.production import Production, engine_line, production_lines, vllm_max_lora_rank
from cockpit.report.store import BUILT, has_report, load_report, read_report_json, write_report
from cockpit.report.terminal import macro_f1_table, report_parts

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
    "Production",
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
    "engine_line",
    "examples_text",
    "has_report",
    "load_report",
    "macro_f1_batch",
    "macro_f1_table",
    "mean_metrics",
    "metrics_batch",
    "n_text",
    "paired_delta",
    "paired_deltas",
    "points",
    "production_lines",
    "read_report_json",
    "render_markdown",
    "report_parts",
    "run_report",
    "sample_line",
    "serving_cost",
    "serving_lines",
    "signed",
    "summary_line",
    "tenant_metrics",
    "usd",
    "vllm_max_lora_rank",
    "write_report",
]
