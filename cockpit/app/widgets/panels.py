"""The run header, the audit panel and the output-log pane: each draws one part of a Snapshot."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget
from textual.widgets import Static

from cockpit.app.model import Audit, Header
from cockpit.app.widgets.chart import fmt_elapsed

STATUS_STYLE = {
    "running": "bold green",
    "finished": "bold cyan",
    "planned": "bold",
    "failed": "bold red",
    "stopped": "bold yellow",
    "stalled": "bold red",
}


def _duration(seconds: float | None) -> str:
    return "--:--" if seconds is None else fmt_elapsed(seconds)


def header_text(h: Header) -> Text:
    """Two lines: which run and how far it is; how it is going and what the viewer is doing."""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(" cockpit ", "bold reverse")
    text.append(f" {h.run_id} ", "bold")
    text.append("· ")
    text.append(h.status.upper(), STATUS_STYLE.get(h.status, "bold"))
    if h.stop_requested and h.status == "running":
        text.append(" (stop requested)", "yellow")
    total = f"/{h.max_steps}" if h.max_steps else ""
    text.append(" · step ")
    text.append(f"{h.step}{total}", "bold")
    if h.epoch is not None:
        text.append(f" · epoch {h.epoch:.2f}")
    if h.profile not in h.run_id:  # run ids carry their profile's name: say it only when they do not
        text.append(f" · profile {h.profile}")
    text.append("\n")
    if h.live and h.following:
        text.append(" LIVE ", "bold reverse green")
    elif h.live and h.paused:
        text.append(" LIVE · PAUSED ", "bold reverse yellow")
    elif h.live:
        text.append(f" LIVE · BEHIND, {h.speed:g}× ", "bold reverse yellow")
    else:
        state = "PAUSED" if h.paused else "END" if h.following else "PLAYING"
        text.append(f" REPLAY {h.speed:g}× · {state} ", "bold reverse magenta")
    text.append(" elapsed ")
    text.append(_duration(h.elapsed_s), "bold")
    text.append(" · ETA ")
    text.append(_duration(h.eta_s), "bold")
    text.append(f" · phase {h.phase}")
    if h.phase_message:
        text.append(f" ({h.phase_message})", "italic yellow")
    if h.eval_progress:
        text.append(f" ({h.eval_progress})")
    if h.loss is not None:
        text.append(f" · loss {h.loss:.4f}")
    if h.tokens_per_s is not None:
        text.append(f" · {h.tokens_per_s:,.0f} tok/s")
    if h.loading is not None:
        text.append(f" · reading history {h.loading:.0%}", "italic yellow")
    if h.diagnosis:
        text.append(f" · {h.diagnosis}", STATUS_STYLE.get(h.status, ""))
    if h.warning:
        text.append(f" · ⚠ {h.warning}", "bold yellow")
    return text


def audit_text(a: Audit | None) -> Text:
    """What was applied next to what was asked, every dropped one in the warning colour."""
    text = Text()
    if a is None:
        text.append("waiting for the trainer's audit (written once the model is loaded)", "italic dim")
        return text
    req, app = a.requested, a.applied
    if a.fraction_4bit is not None:
        text.append(f"{a.fraction_4bit:.1%} in 4 bit", "bold")
    if a.params_trainable is not None:
        text.append(f" · {a.params_trainable:,} trainable")
    rows: list[tuple[str, object, object]] = [
        ("ZeRO", req.get("zero_stage"), app.get("zero_stage")),
        ("param offload", req.get("offload_param"), app.get("offload_param")),
        ("optim offload", req.get("offload_optimizer"), app.get("offload_optimizer")),
        ("grad ckpt", req.get("gradient_checkpointing"), app.get("gradient_checkpointing")),
    ]
    if req.get("zero_stage") == 3:
        rows.append(("partitioned at load", True, app.get("partitioned_at_load")))
    if a.lora_targets:
        matched = sum(1 for n in a.lora_targets.values() if n)
        rows.append(("LoRA targets", len(a.lora_targets), matched))
    text.append("\n")
    for name, asked, got in rows:
        if asked is None and got is None:
            continue
        ok = got is None or asked == got
        nb = "\u00a0"  # an item never breaks across lines
        text.append(f"✓{nb}" if ok else f"✗{nb}", "green" if ok else "bold yellow")
        text.append(f"{name}{nb}".replace(" ", nb), "" if ok else "yellow")
        value = f"{asked}" if ok else f"{got} (asked {asked})"
        text.append(value.replace(" ", nb), "bold" if ok else "bold yellow")
        text.append("  ")
    for warning in a.warnings:
        text.append("\n⚠ ", "bold yellow")
        text.append(warning, "yellow")
    return text


class RunHeader(Static):
    """Run id, profile, status, step/total, epoch, elapsed, ETA; and the viewer's mode."""

    def show(self, header: Header) -> None:
        self.update(header_text(header))


class AuditPanel(Static):
    """The trainer's audit: applied against asked, dropped settings as warnings."""

    def show(self, audit: Audit | None) -> None:
        self.update(audit_text(audit))


class LogPane(Widget):
    """The tail of `output.log`: as many of the last lines as fit."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.lines: tuple[str, ...] = ()
        self.border_title = "output.log"

    def show(self, lines: tuple[str, ...]) -> None:
        if lines != self.lines:
            self.lines = lines
            self.refresh()

    def render(self) -> Text:
        height = max(1, self.size.height)
        shown = self.lines[-height:]
        text = Text(no_wrap=True, overflow="ellipsis")
        for i, line in enumerate(shown):
            style = (
                "yellow" if "WARNING" in line else "red" if ("Error" in line or "Traceback" in line) else ""
            )
            text.append(line[: self.size.width + 1], style)
            if i < len(shown) - 1:
                text.append("\n")
        return text
