"""The audit panel and the output-log pane: each draws one part of a Snapshot."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text
from textual.widget import Widget

from cockpit.app.model import Audit


def _rows(a: Audit) -> list[tuple[str, object, object]]:
    req, app = a.requested, a.applied
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
    return [(name, asked, got) for name, asked, got in rows if not (asked is None and got is None)]


def _ok(asked: object, got: object) -> bool:
    return got is None or asked == got


WAITING_AUDIT = "waiting for the trainer's audit (written once the model is loaded)"


def audit_text(a: Audit | None) -> Text:
    """What was applied next to what was asked, every dropped one in the warning colour."""
    text = Text()
    if a is None:
        text.append(WAITING_AUDIT, "italic dim")
        return text
    if a.fraction_4bit is not None:
        text.append(f"{a.fraction_4bit:.1%} in 4 bit", "bold")
    if a.params_trainable is not None:
        text.append(f" · {a.params_trainable:,} trainable")
    text.append("\n")
    for name, asked, got in _rows(a):
        ok = _ok(asked, got)
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


def headline(warning: str) -> str:
    """A warning's first clause: the text before its first parenthesis (the detail)."""
    return warning.split(" (", 1)[0].rstrip(":; ")


def _word(value: object) -> str:
    return (
        {True: "yes", False: "no", None: "none"}.get(value, str(value))
        if isinstance(value, bool | None)
        else str(value)
    )


def applied_summary(rows: list[tuple[str, object, object]]) -> str:
    """The settings applied as asked, in few words: `ZeRO 3, offload cpu, ckpt, LoRA 4/4`."""
    ok = {name: (asked, got) for name, asked, got in rows if _ok(asked, got)}
    words = []
    if "ZeRO" in ok:
        words.append(f"ZeRO {ok['ZeRO'][0]}")
    offload = [ok[k][0] for k in ("param offload", "optim offload") if k in ok]
    if offload:
        words.append(
            f"offload {offload[0]}" if len(set(offload)) == 1 else f"offload {'/'.join(map(str, offload))}"
        )
    if "grad ckpt" in ok:
        words.append("ckpt" if ok["grad ckpt"][0] else "no ckpt")
    if "partitioned at load" in ok:
        words.append("partitioned")
    if "LoRA targets" in ok:
        asked, got = ok["LoRA targets"]
        words.append(f"LoRA {got}/{asked}")
    return ", ".join(words)


def _pack(words: list[str], width: int, rows: int) -> list[str]:
    """`words` joined by ", " into at most `rows` lines of `width` (the last one cut if need be)."""
    lines: list[str] = []
    for word in words:
        if lines and len(lines[-1]) + 2 + len(word) <= width:
            lines[-1] += f", {word}"
        elif len(lines) < rows:
            lines[-1:] = [lines[-1] + ","] if lines else []
            lines.append(word)
        else:
            lines[-1] += f", {word}"  # no row left: the pane cuts it with an ellipsis
    return lines


def audit_lines(a: Audit, width: int = 1000, height: int = 1000) -> list[Text]:
    """The audit in one line an item, for a small pane of `width` × `height`: the settings applied as
    asked (on the rows the rest leaves), each dropped one on its own line, each warning's headline."""
    lines = []
    first = Text()
    if a.fraction_4bit is not None:
        first.append(f"{a.fraction_4bit:.1%} in 4 bit", "bold")
    if a.params_trainable is not None:
        first.append(f"{' · ' if first else ''}{a.params_trainable:,} trainable")
    if first:
        lines.append(first)
    rows = _rows(a)
    dropped = sum(1 for _, asked, got in rows if not _ok(asked, got))
    room = max(1, height - len(lines) - dropped - len(a.warnings))
    words = applied_summary(rows)
    for i, part in enumerate(_pack(words.split(", ") if words else [], width - 2, room)):
        line = Text("✓ " if i == 0 else "  ", "green")
        line.append(part)
        lines.append(line)
    for name, asked, got in rows:
        if not _ok(asked, got):
            line = Text("✗ ", "bold yellow")
            line.append(f"{name}: ", "yellow")
            line.append(f"{_word(got)} (asked {_word(asked)})", "bold yellow")
            lines.append(line)
    for warning in a.warnings:
        line = Text("⚠ ", "bold yellow")
        line.append(headline(warning), "yellow")
        lines.append(line)
    return lines


class AuditPanel(Widget):
    """The trainer's audit: applied against asked, dropped settings as warnings. Where the whole text does
    not fit, one line an item (`audit_lines`), so nothing needs scrolling."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.audit: Audit | None = None
        self.compact = False  # the last render was the one-line-an-item form

    def show(self, audit: Audit | None) -> None:
        if audit != self.audit:
            self.audit = audit
            self.refresh()

    def render(self) -> Text:
        width, height = max(1, self.size.width), max(1, self.size.height)
        wrapped = list(audit_text(self.audit).wrap(self.app.console, width))
        self.compact = self.audit is not None and len(wrapped) > height
        if self.audit is None or not self.compact:
            lines = wrapped
        else:
            lines = audit_lines(self.audit, width, height)
            if len(lines) > height:
                more = len(lines) - height + 1
                lines = [
                    *lines[: height - 1],
                    Text(f"+{more} more: a taller terminal shows them", "italic dim"),
                ]
        text = Text("\n").join(lines)  # one row a line: the pane does not wrap (`text-wrap: nowrap`)
        text.no_wrap, text.overflow = True, "ellipsis"
        return text


CONTINUED = "  "  # a folded line's next rows are indented: where a line goes on reads at a glance


def fold_log_line(line: str, width: int, console: Console) -> list[str]:
    """A log line in rows of `width` cells: broken at spaces, so that a number stays whole (`1,862
    tok/s`, not `18` / `62 tok/s`); a word longer than a row is folded. Rows after the first are
    indented."""
    rows = Text(line).wrap(console, width, overflow="fold")
    if len(rows) <= 1:
        return [line]
    first = rows[0].plain
    rest = line[len(first) :].lstrip() if line.startswith(first) else ""
    if not rest or width <= 2 * len(CONTINUED):
        return [row.plain.rstrip() for row in rows]
    tail = Text(rest).wrap(console, width - len(CONTINUED), overflow="fold")
    return [first.rstrip(), *(CONTINUED + row.plain.rstrip() for row in tail)]


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
        """The last lines that fit, each folded over as many rows as it needs (nothing is cut off, no
        number broken: `fold_log_line`)."""
        width, height = max(1, self.size.width), max(1, self.size.height)
        rows: list[tuple[str, str]] = []
        for line in reversed(self.lines):
            style = (
                "yellow" if "WARNING" in line else "red" if ("Error" in line or "Traceback" in line) else ""
            )
            parts = fold_log_line(line, width, self.app.console) or [""]
            rows[:0] = [(part, style) for part in parts]
            if len(rows) >= height:
                break
        text = Text(no_wrap=True, overflow="crop")
        for i, (part, style) in enumerate(rows[-height:]):
            if i:
                text.append("\n")
            text.append(part, style)
        return text
