"""A rehearsal's prediction as rich tables (`rehearsal.json` in, renderables out), for terminal and app."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cockpit.rehearse.forecast import LABELS
from cockpit.rehearse.serving import serving_lines
from cockpit.units import hours, size

MEMORY = (
    ("gpu_load", "GPU load"),
    ("gpu_train", "GPU train"),
    ("rss_load", "RSS load"),
    ("rss_train", "RSS train"),
)


def _num(value: Any, fmt: str = ".3g") -> str:
    return "-" if value is None else format(value, fmt)


def depths_table(data: dict[str, Any]) -> Table:
    """What each depth measured (GiB per rank, the largest rank; seconds)."""
    table = Table(title="measured (random weights, the profile's settings)", header_style="bold")
    columns = ("step s", "validation fwd s", "load s", "save s")
    for col in ("layers", "status", *(label + " GiB" for _, label in MEMORY), *columns):
        table.add_column(col, justify="right" if col != "status" else "left")
    for d in data.get("depths", []):
        peaks = [max(d[f"{key}_gib"].values()) if d.get(f"{key}_gib") else None for key, _ in MEMORY]
        table.add_row(
            str(d["layers"]),
            escape(d["status"]),
            *(_num(p, ".2f") for p in peaks),
            _num(d.get("step_s"), ".3f"),
            _num(d.get("validation_s"), ".3f"),
            _num(d.get("load_s"), ".1f"),
            _num(d.get("save_s"), ".1f"),
        )
    return table


def _range(r: Any, fmt: str) -> str:
    return "" if not r else f"{format(r[0], fmt)}-{format(r[1], fmt)}"


def prediction_table(data: dict[str, Any]) -> Table:
    """The whole model: fitted at full depth here, scaled to the profile's machine (with its range, and
    whether the depths measured it or only bound it), beside the plan."""
    table = Table(title=f"predicted at {data['layers']} layers", header_style="bold")
    for col in ("figure", "this machine", "the profile's machine", "range", "how", "plan (modelled)", ""):
        table.add_column(col, justify="left" if col in ("figure", "how") else "right")
    flagged = {line.split(":")[0] for line in data.get("disagreements", [])}
    ranges = (data.get("ranges") or {}).get("target", {})
    measured = data.get("measured") or {}
    for key, label in LABELS.items():
        here, there, plan = data["here"].get(key), data["target"].get(key), data["plan"].get(key)
        mark = Text("differs > 15%", style="yellow") if label in flagged else Text("")
        fmt = ",.0f" if key == "tokens_per_s" else ".3g"
        source = "step_s" if key == "tokens_per_s" else ("rss_train" if key == "host_gib" else key)
        how = "" if source not in measured else ("measured" if measured[source] else "bound/modelled")
        table.add_row(
            label, _num(here, fmt), _num(there, fmt), _range(ranges.get(key), fmt), how, _num(plan, fmt), mark
        )
    return table


def wall_lines(data: dict[str, Any]) -> list[str]:
    """The wall clock on the profile's machine, part by part, with its range and what dominates it."""
    w = data["wall"]
    wall_range = (data.get("ranges") or {}).get("wall", {})
    total = wall_range.get("total_s")
    span = f" ({total[0] / 3600:.2f}-{total[1] / 3600:.2f} h)" if total else ""
    # A rehearsal from before the validation term has none: say nothing of it rather than a blank.
    validation = (
        f"{_num(w.get('validations'), '.0f')} validations {hours(w.get('validation_s'))} + "
        if "validation_s" in w
        else ""
    )
    start = f"start-up {hours(w.get('start_s'))} + " if w.get("start_s") else ""
    lines = [
        f"wall clock on the profile's machine: {hours(w.get('total_s'))}{span} = load "
        f"{hours(w.get('load_s'))} + {start}{_num(w.get('steps'), '.0f')} steps "
        f"{hours(w.get('train_s'))} + "
        f"{_num(w.get('saves'), '.0f')} checkpoint saves {hours(w.get('save_s'))} + {validation}evaluation "
        f"{hours(w.get('eval_s'))}",
    ]
    cache, cached = data.get("load_cache"), w.get("total_cached_s")
    if cache and cached is not None:
        lo, hi = wall_range.get("total_cached_s") or (cached, cached)
        gb = size(cache["cache_bytes"], binary=False)
        lines.append(
            f"a second run (a resume, evaluation's reload) loads from the NF4 cache: {hours(cached)} "
            f"({lo / 3600:.2f}-{hi / 3600:.2f} h), load {hours(w.get('load_cached_s'))} ({gb} at "
            f"{cache['disk_gbps']:g} GB/s, {cache['read_s']:.0f} s, + at most the first load's "
            f"{cache['work_bound_s']:.0f} s of work, no quantization); the cache needs {gb} of disk"
        )
    runs = (("without_eval_s", "a first run"), ("without_eval_cached_s", "a second, from the cache"))
    alone = [
        f"{words} {hours(w[key])} ({lo / 3600:.2f}-{hi / 3600:.2f} h)"
        for key, words in runs
        if w.get(key) is not None and w.get("eval_s")
        for lo, hi in [wall_range.get(key) or (w[key], w[key])]
    ]
    if alone:
        lines.append(f"the training run alone, its load included (evaluation apart): {', '.join(alone)}")
    top = data.get("dominant")
    if top:
        lines.append(f"what dominates it: {top['part']}, {top['share']:.0%} of the wall clock")
    evaluation = data.get("evaluation") or {}
    if w.get("eval_s") and w.get("total_s"):
        lo, hi = wall_range.get("eval_s") or (w["eval_s"], w["eval_s"])
        how = "timed on the slices, scaled" if evaluation.get("measured") else "modelled, not rehearsed"
        lines.append(
            f"evaluation (base and tuned on the held-out split): {hours(w['eval_s'])} ({lo / 3600:.2f}-"
            f"{hi / 3600:.2f} h), {w['eval_s'] / w['total_s']:.0%} of the wall clock ({how})"
        )
    return lines + serving_lines(data.get("serving"))


def render(data: dict[str, Any]) -> RenderableType:
    """Everything a user needs to judge the prediction: measured, predicted, assumptions, disagreements."""
    parts: list[RenderableType] = [depths_table(data), prediction_table(data)]
    parts += [Text(line) for line in wall_lines(data)]
    for line in data.get("disagreements", []):
        parts.append(Text(f"plan and rehearsal differ: {line}", style="yellow"))
    parts.append(Text("assumptions:", style="bold"))
    parts += [Text(f"  {line}") for line in data.get("assumptions", [])]
    parts += [Text(f"note: {line}", style="dim") for line in data.get("notes", [])]
    parts.append(Text(data.get("summary", ""), style="bold"))
    return Group(*parts)
