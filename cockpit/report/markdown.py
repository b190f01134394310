"""The report as Markdown (report.md, `cockpit report --format md`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cockpit.report.format import delta_cell, n_text, points, sample_line
from cockpit.report.model import Report, Row, Serving
from cockpit.report.production import Production, engine_line, production_lines


def _table_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def render_markdown(report: Report) -> str:
    """Macro F1 per tenant and system with the tuned model's deltas, the mean, precision, recall and
    micro F1 per system, and serving cost."""
    lines = [f"# Evaluation report: {report.run_id or ''}", ""]
    if report.model:
        lines += [f"Model: {report.model}. Held-out split, macro F1 in points (0-100).", ""]
    if report.adapter:
        lines += [adapter_line(report.adapter), ""]
    sampled = sample_line(report)
    if sampled:
        lines += [sampled, ""]
    header = ["tenant", "n", *[f"{s} macro F1" for s in report.systems]]
    header += [f"Δ vs {o} [95% CI]" for o in report.compared]
    lines += [_table_row(header), "|" + "---|" * len(header)]

    def cells(row: Row, bold: bool) -> list[str]:
        out = [points(row.metric(s, "macro_f1")) for s in report.systems]
        return out + [delta_cell(row.deltas.get(o), bold=bold) for o in report.compared]

    for t in report.tenants:
        lines.append(_table_row([t.name, n_text(t), *cells(t, bold=False)]))
    lines += [_table_row(["**mean**", "", *cells(report.mean, bold=True)]), ""]
    lines += ["## Precision, recall, micro F1 per system", ""]
    lines += ["| tenant | system | precision | recall | micro F1 | macro F1 |", "|---|---|---|---|---|---|"]
    for t in report.tenants:
        for s, m in t.metrics.items():
            figures = (m.precision, m.recall, m.micro_f1, m.macro_f1)
            lines.append(_table_row([t.name, s, *(points(x) for x in figures)]))
    if report.serving or report.production:
        lines += ["", "## Serving", ""]
    if report.serving:
        lines += serving_lines(report.serving)
    if report.production:
        lines += ["", *production_markdown(report.production)]
    return "\n".join(lines) + "\n"


def production_markdown(production: Production) -> list[str]:
    """The production path: its sentences, the command as a code block."""
    first, *rest = production_lines(production)
    return [first, "", "```bash", production.command, "```", "", " ".join(rest)]


def adapter_line(adapter: Mapping[str, Any]) -> str:
    """Which adapter the tuned model is: the one of lowest validation loss, and of which step."""
    step, last = adapter.get("step"), adapter.get("last_step")
    of = f" (training ran to step {last})" if last is not None and last != step else ""
    return (
        f"The tuned model's adapter is step {step}'s, the lowest validation loss of the run "
        f"({adapter.get('val_loss'):.4f}){of}."
    )


def serving_lines(serving: Serving) -> list[str]:
    """Plain sentences for the serving section."""
    ours, api = serving.usd_per_mtok, serving.api_usd_per_mtok
    lines = [
        f"Measured on {serving.measured_on} (the model as evaluated: 4-bit base + LoRA adapter): "
        f"time to first token {serving.ttft_ms:.1f} ms, {serving.per_token_ms:.2f} ms per token "
        f"({serving.stream_tokens_per_s} tok/s single stream), {serving.batch_tokens_per_s} tok/s "
        f"at batch {serving.batch_size}.",
    ]
    if serving.measured_on == "cpu":
        lines.append("These are real measurements of the tiny CPU model, not of a production model.")
    price = f"${serving.hour_usd:.2f} per machine-hour"
    ours_text = (
        f"${ours:,.2f} per million tokens at {price}"
        if ours is not None
        else "no hourly price in the profile"
    )
    api_text = (
        f"${api:,.2f} per million tokens ({serving.api_name})" if api else "no API price in the profile"
    )
    lines.append(f"Self-hosted: {ours_text}; API: {api_text}.")
    lines.append(engine_line(serving.batch_size))
    return lines
