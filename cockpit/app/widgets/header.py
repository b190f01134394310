"""The run header: which run and how far (line 1); what the viewer shows and what the run is doing
(line 2); an ended run's diagnosis (line 3). Each line fits the width it is given: what matters most is
always there, the rest only where it fits whole."""

from __future__ import annotations

import re

from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.text import Text
from textual.widgets import Static

from cockpit.app.model import Header
from cockpit.units import clock

STATUS_STYLE = {
    "running": "bold green",
    "stopping": "bold yellow",
    "finished": "bold cyan",
    "planned": "bold",
    "failed": "bold red",
    "stopped": "bold yellow",
    "stalled": "bold red",
}
MODE_BADGE = {  # what the viewer is doing, and its colour
    "live": ("LIVE", "bold reverse green"),
    "paused": ("LIVE · PAUSED", "bold reverse yellow"),
    "ended": ("ENDED", "bold reverse"),
}
UNLIMITED = 10_000
_ASIDE = re.compile(r" \([^()]*\)")  # a parenthesised detail: `... 75.6 (finetuned vs base +62.6 points)`


def _fit(parts: list[tuple[Text, bool]], width: int) -> Text:
    """The parts in order, each optional one (`False`) only where it fits whole after the others."""
    room = width - sum(cell_len(t.plain) for t, needed in parts if needed)
    line = Text(no_wrap=True, overflow="ellipsis")
    for text, needed in parts:
        if not needed:
            if cell_len(text.plain) > room:
                continue
            room -= cell_len(text.plain)
        line.append_text(text)
    return line


def _part(*pieces: str | tuple[str, str]) -> Text:
    return Text.assemble(*pieces)


def first_line(h: Header) -> Text:
    """` cockpit  RUN · RUNNING · step 120/324 · epoch 1.48` (and the profile where the id has not)."""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(" cockpit ", "bold reverse")
    text.append(f" {h.run_id} ", "bold")
    text.append("· ")
    status = "stopping" if h.stopping else h.status
    text.append(status.upper(), STATUS_STYLE.get(status, "bold"))
    total = f"/{h.max_steps}" if h.max_steps else ""
    text.append(" · step ")
    text.append(f"{h.step}{total}", "bold")
    if h.epoch is not None:
        text.append(f" · epoch {h.epoch:.2f}")
    if h.profile not in h.run_id:  # run ids carry their profile's name: say it only when they do not
        text.append(f" · profile {h.profile}")
    return text


def badge(h: Header) -> tuple[str, str]:
    """What the viewer shows (LIVE, REPLAY 8× · PLAYING, ENDED...) and its style."""
    mode = h.mode
    if mode == "replay":
        state = "PAUSED" if h.paused else "END" if h.following else "PLAYING"
        return f"REPLAY {h.speed:g}× · {state}", "bold reverse magenta"
    if mode == "behind":
        return f"LIVE · BEHIND, {h.speed:g}×", "bold reverse yellow"
    text, style = MODE_BADGE[mode]
    if mode == "ended":
        style = f"{style} {STATUS_STYLE.get(h.status, '').replace('bold', '').strip()}".strip()
    return text, style


def second_line(h: Header, width: int = UNLIMITED) -> Text:
    """The viewer's mode, elapsed time, ETA, a warning, what the run is doing (or how to go on from its
    end); the training figures after them where they fit (the charts' legends give them too)."""
    name, style = badge(h)
    parts: list[tuple[Text, bool]] = [(_part((f" {name} ", style)), True)]
    if h.catching_up:
        parts.append((_part((" jumping to the end…", "italic yellow")), True))
    parts.append((_part(" elapsed ", (clock(h.elapsed_s), "bold")), True))
    if not h.ended and (h.eta_s is not None or h.eta_note):  # an unknown ETA leaves room for the rest
        parts.append(
            (_part(" · ETA ", (clock(h.eta_s), "bold"), f" {h.eta_note}" if h.eta_note else ""), True)
        )
    if h.warning:
        parts.append((_part((f" · ⚠ {h.warning}", "bold yellow")), True))
    if h.activity:
        parts.append((_part(" · ", (h.activity, "" if h.activity == "training" else "italic yellow")), True))
    if h.resume_hint:
        parts.append((_part(" · next: ", (h.resume_hint, "bold")), True))
        if h.resume_from is not None:
            parts.append((_part(f" (from step {h.resume_from})"), False))
    if h.loss is not None:
        parts.append((_part(f" · loss {h.loss:.4f}"), False))
    if h.tokens_per_s is not None:
        parts.append((_part(f" · {h.tokens_per_s:,.0f} tok/s"), False))
    if h.loading is not None:
        parts.append((_part((f" · reading history {h.loading:.0%}", "italic yellow")), True))
    return _fit(parts, width)


def header_text(h: Header, width: int = UNLIMITED) -> Text:
    """The first two lines (cut at the width, never wrapped)."""
    return Text("\n").join([first_line(h), second_line(h, width)])


def diagnosis_line(diagnosis: str, width: int = UNLIMITED, status: str = "finished") -> str:
    """An ended run's diagnosis for one line of `width`: whole where it fits; a run that finished or was
    stopped without its parenthesised details (`(finetuned vs base +62.6 points)`: the report has them).
    Otherwise it is kept whole (it wraps): why a run failed or stalled is never cut."""
    if cell_len(diagnosis) + 1 <= width or status not in ("finished", "stopped"):
        return diagnosis
    short = _ASIDE.sub("", diagnosis)
    return short if cell_len(short) + 1 <= width else diagnosis


def ending_text(h: Header, width: int = UNLIMITED) -> Text:
    """An ended run's diagnosis, on one line where it can be (`diagnosis_line`)."""
    text = Text(" ")
    text.append(diagnosis_line(h.diagnosis or h.status, width, h.status), STATUS_STYLE.get(h.status, ""))
    return text


def header_renderable(h: Header, width: int = UNLIMITED) -> RenderableType:
    """The header: its two lines and an ended run's diagnosis under them."""
    lines = header_text(h, width)
    return Group(lines, ending_text(h, width)) if h.ended else Group(lines)


class RunHeader(Static):
    """Run id, profile, status, step/total, epoch, elapsed, ETA; the viewer's mode; an ended run's
    diagnosis. Drawn to its width: shown again when that changes."""

    header: Header | None = None

    def show(self, header: Header) -> None:
        self.header = header
        self.update(header_renderable(header, self.size.width or UNLIMITED))

    def on_resize(self) -> None:
        if self.header is not None:
            self.show(self.header)
