"""The plan as rich tables, for `cockpit plan` (text) and anything else that prints one."""

from __future__ import annotations

from rich import box
from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cockpit.plan.configuration import DEQUANTIZED_AGAIN
from cockpit.plan.estimator import Estimate
from cockpit.plan.eval_time import evaluation_words
from cockpit.plan.inputs import GiB
from cockpit.plan.measured import CONFIGURED, Measured, fastest_measured
from cockpit.plan.options import overrides_for
from cockpit.plan.planner import Plan
from cockpit.units import common_unit, size


def _in(n: float, unit: int) -> str:
    """A figure of a table whose unit is in its header or caption."""
    return f"{n / unit:,.1f}"


def _params(n: float) -> str:
    if n >= 1e9:
        return f"{n / 1e9:,.2f} B"
    if n >= 1e6:
        return f"{n / 1e6:,.1f} M"
    return f"{n / 1e3:,.1f} K"


def _mark(ok: bool) -> str:
    return "[green]ok[/]" if ok else "[bold red]over[/]"


def _speed(e: Estimate, ref: Estimate) -> str:
    if not e.tokens_per_s:
        return "-"
    rel = f" ({e.tokens_per_s / ref.tokens_per_s:.2f}x)" if ref.tokens_per_s else ""
    return f"{e.tokens_per_s:,.0f}{rel}"


def header(plan: Plan, measured: dict[str, Measured] | None = None) -> Text:
    g, hw = plan.geometry, plan.hardware
    arch = f"{g.model_type}, {g.layers} layers, hidden {g.hidden}"
    if g.is_moe:
        arch += f", {g.experts} experts top-{g.top_k}"
    where = f"{hw.gpus} x {hw.gpu_name or 'GPU'} ({hw.gpu_mem_gib:g} GiB)" if hw.gpus else "CPU only"
    if hw.nodes > 1:
        where = f"{hw.nodes} nodes x {where} = {hw.ranks} ranks"
    src = ", ".join(f"{k} from {v}" for k, v in hw.source.items() if v != "profile")
    t = Text.from_markup(f"[bold]Plan for {plan.profile_name}[/]: {g.name} ({arch})\n")
    t.append_text(
        Text.from_markup(
            f"Hardware: {where}, host RAM {hw.host_ram_gib:,.0f} GiB" + (f"  [dim]({src})[/]" if src else "")
        )
    )
    t.append("\n")
    t.append_text(in_short(plan, measured))
    return t


def in_short(plan: Plan, measured: dict[str, Measured] | None = None) -> Text:
    """The verdict and the run's hours in one line, first (the tables and the reasons come after); the
    hours from a rehearsal's measured step where one calibrated the configuration."""
    verdict = plan.verdict()
    style = "green" if verdict.startswith("FITS") else "yellow" if verdict.startswith("NOT") else "red"
    run = plan.run
    hours = ""
    mine = (measured or {}).get(CONFIGURED)
    if run is not None and run.train_s and run.with_validation_s is not None:
        both = " and validation" if run.validation_s else ""
        seconds, how = run.with_validation_s, "modelled"
        if mine is not None and run.optimizer_step_s:
            ratio = mine.step_s / run.optimizer_step_s
            validation = (
                mine.validation_s if mine.validation_s is not None else (run.validation_s or 0.0) * ratio
            )
            seconds = run.train_s * ratio + validation
            how = (
                f"step{' and validation' if mine.validation_s is not None else ''} measured by {mine.source}"
            )
        hours = f"; training{both} ~{seconds / 3600:.2f} h ({how})"
    line = Text("In short: ", style="bold")
    line.append(verdict, style=style)
    line.append(f"{hours} (details below)")
    return line


def weights_table(plan: Plan) -> Table:
    prec = plan.inputs.precision
    table = Table(title="Parameters and weight bytes", title_justify="left", header_style="bold")
    for col in ("kind", "params", "bf16", "NF4", "NF4 + double quant", "as planned"):
        table.add_column(col, justify="left" if col == "kind" else "right")
    rows = plan.kind_table()
    for r in rows:
        fmt = (
            "4 bit"
            if r["planned_4bit_params"] and r["planned_4bit_params"] == r["params"]
            else prec.compute_dtype
        )
        if 0 < r["planned_4bit_params"] < r["params"]:
            fmt = "mixed"
        table.add_row(
            r["kind"],
            _params(r["params"]),
            size(r["bf16"], binary=False),
            size(r["nf4"], binary=False),
            size(r["nf4_dq"], binary=False),
            f"{size(r['planned'], binary=False)} [dim]{fmt}[/]",
        )
    total = {k: sum(r[k] for r in rows) for k in ("params", "bf16", "nf4", "nf4_dq", "planned")}
    table.add_row(
        "[bold]total[/]",
        _params(total["params"]),
        size(total["bf16"], binary=False),
        size(total["nf4"], binary=False),
        size(total["nf4_dq"], binary=False),
        f"[bold]{size(total['planned'], binary=False)}[/]",
    )
    table.caption = (
        "NF4 columns: every matrix of the kind in 4 bit (0.5 B/param + absmax: fp32 per 64, or 8-bit per 64 "
        "and fp32 per 256 blocks with double quant). As planned: bitsandbytes quantizes nn.Linear only "
        "(never lm_head)"
        + (
            "; the trainer packs the fused experts (NF4, per-expert double quant) only with "
            "quantization.quantize_experts."
            if plan.geometry.is_moe
            else "."
        )
    )
    table.caption_justify = "left"
    return table


def facts_table(plan: Plan) -> Table:
    e, w = plan.configured, plan.inputs.weights
    s = e.setup
    acts = plan.inputs.activations(s)
    lora = plan.lora_params
    table = Table(title="Training state", title_justify="left", show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row(
        "LoRA", f"r={plan.inputs.lora_r} on {', '.join(plan.inputs.lora_targets)}: {_params(lora)} trainable"
    )
    table.add_row(
        "optimizer state", f"{size(16 * lora)} (fp32 master + 2 Adam moments + fp32 grads, 16 B/param)"
    )
    table.add_row(
        "activations / micro-batch",
        f"seq {s.seq_len} x {s.micro_batch}: {size(acts.total(True))} with gradient checkpointing, "
        f"{size(acts.total(False))} without (logits + loss {size(acts.logits)})",
    )
    if s.gpus:
        layer, layer_bytes = w.largest_layer()
        table.add_row(
            "ZeRO-3",
            f"{s.ranks} partition(s) of {size(w.data_bytes / s.ranks)}; largest gathered layer {layer}: "
            f"{size(layer_bytes)}; Linear4bit quantization state {size(w.state_bytes)} stays whole on every "
            "GPU"
            + (
                "; the packed experts' scales are parameters, partitioned"
                if plan.inputs.precision.experts_4bit
                else ""
            ),
        )
        if e.pinned_rounded:
            table.add_row(
                "pinned offload buffers",
                f"{size(e.pinned_rounded)} per rank ({size(e.pinned_exact)} of partitions; "
                "the pinned allocator rounds each up to a power of two)",
            )
    disk = plan.disk()
    table.add_row(
        "disk",
        f"model files {size(disk['model_files'], binary=False)}; "
        f"each checkpoint {size(disk['per_checkpoint'])} "
        f"(LoRA + optimizer), {plan.save_total_limit} kept: {size(disk['checkpoints_kept'])}",
    )
    if plan.load is not None:
        table.add_row("load", escape(plan.load.words()))
    return table


def phases_table(plan: Plan) -> Table:
    e, hw = plan.configured, plan.hardware
    a = plan.inputs.assumptions
    table = Table(
        title=f"Memory as configured: {e.setup.describe()}", title_justify="left", header_style="bold"
    )
    # One unit for the table, the one that fits its largest peak (the usable limits follow it).
    name, unit = common_unit(
        [
            e.load.gpu_peak,
            e.train.gpu_peak,
            e.load.host_peak,
            e.train.host_peak,
            e.load.rss_peak,
            e.train.rss_peak,
        ]
    )

    def fig(n: float) -> str:
        return _in(n, unit)

    for col in (name, "load", "training", "usable", "what dominates"):
        table.add_column(col, justify="left" if col in (name, "what dominates") else "right")

    def top(terms: dict[str, int]) -> str:
        items = sorted(((v, k) for k, v in terms.items() if v > 0), reverse=True)[:2]
        return ", ".join(f"{k} {fig(v)}" for v, k in items)

    checks = {c.name: c for c in e.checks}
    gpu_limit = hw.gpu_mem_gib * GiB * a.gpu_usable_fraction
    host_limit = hw.host_ram_gib * GiB * a.host_usable_fraction
    if e.setup.gpus:
        load_ok, train_ok = checks["GPU memory at load"].ok, checks["GPU memory in training"].ok
        table.add_row(
            "GPU peak, per GPU",
            f"{fig(e.load.gpu_peak)} {_mark(load_ok)}",
            f"{fig(e.train.gpu_peak)} {_mark(train_ok)}",
            fig(gpu_limit) if gpu_limit else "?",
            f"load: {top(e.load.gpu)}; training: {top(e.train.gpu)}",
        )
    table.add_row(
        "host RAM, whole machine",
        f"{fig(e.load.host_peak)} {_mark(checks['host RAM at load'].ok)}",
        f"{fig(e.train.host_peak)} {_mark(checks['host RAM in training'].ok)}",
        fig(host_limit),
        f"load: {top(e.load.host)}; training: {top(e.train.host)}",
    )
    table.add_row(
        "RSS, per rank process",
        fig(e.load.rss_peak),
        fig(e.train.rss_peak),
        "",
        f"load: {top(e.load.rss)}; training: {top(e.train.rss)}",
    )
    table.caption = (
        f"Plus {size(e.load.page_cache)} of page cache while the checkpoint is read (shared by the "
        "ranks, reclaimable; each rank's RSS counts the pages it maps)."
    )
    table.caption_justify = "left"
    return table


def options_table(plan: Plan, measured: dict[str, Measured] | None = None) -> Table:
    ref = plan.configured
    measured = measured or {}
    mine = measured.get(CONFIGURED)
    table = Table(
        title="Options (each row: its fastest variant that fits, else the closest)",
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    loaders = {o.estimate.setup.loader for o in plan.options}
    columns = ["option", "loader", "fits", "GPU\nload", "GPU\ntrain", "host\nload", "host\ntrain"]
    columns += ["copies\ns/step", "tokens/s", "speed"]
    if len(loaders) <= 1:  # said once in the caption instead
        columns.remove("loader")
    for col in columns:
        text = col in ("option", "loader", "fits")
        table.add_column(
            col,
            justify="left" if text else "right",
            no_wrap=col not in ("option", "fits", "tokens/s"),  # tokens/s: its ratio below when narrow
            min_width={"option": 14, "fits": 4, "tokens/s": 7, "speed": 8}.get(col),
        )
    name, unit = common_unit(
        v
        for o in plan.options
        for v in (
            o.estimate.load.gpu_peak,
            o.estimate.train.gpu_peak,
            o.estimate.load.host_peak,
            o.estimate.train.host_peak,
        )
    )

    def fig(n: float) -> str:
        return _in(n, unit)

    for o in plan.options:
        e = o.estimate
        s, b = e.setup, e.binding
        row = CONFIGURED if s == ref.setup else o.label
        m = measured.get(row) or measured.get(o.label)
        fits = "[green]yes[/]" if e.fits else f"[red]no[/]: {b.name}" if b else "[red]no[/]"
        # an offload mode's own row is named for it; the others say which mode their fastest uses, and
        # each where it gives the experts' kept weights back
        again = f", {DEQUANTIZED_AGAIN}" if ref.setup.keep_dequant and not s.keep_dequant else ""
        cells = [(o.label if o.label == s.offload else f"{o.label}, {s.offload}") + again]
        if len(loaders) > 1:
            cells.append(_loader(s.loader))
        cells += [
            fits,
            fig(e.load.gpu_peak),
            fig(e.train.gpu_peak),
            fig(e.load.host_peak),
            fig(e.train.host_peak),
            f"{e.transfer_s:.2f}" if e.transfer_s is not None else "-",
            _speed(e, ref) if m is None else _measured_speed(m, mine),
            "modelled" if m is None else ("measured" if m.step_measured else "bound"),
        ]
        table.add_row(*cells)
    a = plan.inputs.assumptions
    sp = a.speed
    network = (
        f", plus {a.internode_gbps:g} GB/s a node between its {ref.setup.nodes} nodes (assumed)"
        if ref.setup.nodes > 1
        else ""
    )
    table.caption = (
        f"{name} per GPU and for the whole host; {ref.setup.gpus} GPU(s) and seq {ref.setup.seq_len} unless "
        f"the option says. A micro-batch's step = max(compute, all-gathers at {a.nvlink_gbps:g} GB/s"
        f"{network}, {sp.copy_factor:.2f} x host-to-device copies at {a.h2d_gbps:g} GB/s per GPU: overlapped "
        "as measured on one rank, assumed on several); "
        f"compute = {sp.fixed_s * 1000:.0f} ms + {sp.layer_s * 1000:.1f} ms a layer + model FLOPs at "
        f"{sp.efficiency:.0%} of the bf16 rate, all measured on {sp.gpu} (benchmarks/fit_speed.py); each "
        "layer moves twice a step, the embeddings and lm_head "
        + ("not at all (kept on the GPU). " if ref.setup.keeps_embeddings else "once. ")
        + "copies: host-to-device and all-gather seconds a step. tokens/s relative to the configuration "
        "as written. speed: modelled, or measured by a rehearsal (cockpit plan --rehearsal RUN)"
        + "".join(f"; {label}: {m.source}" for label, m in measured.items())
        + "."
        + (f" Loader: {_loader(next(iter(loaders)))} in every row." if len(loaders) == 1 else "")
    )
    table.caption_justify = "left"
    return table


def _measured_speed(m: Measured, mine: Measured | None) -> str:
    """A measured row's tokens/s, relative to the measured configuration where there is one."""
    rel = f" ({m.tokens_per_s / mine.tokens_per_s:.2f}x)" if mine is not None else ""
    return f"{m.tokens_per_s:,.0f}{rel}"


def _loader(loader: str) -> str:
    return "layer by layer" if loader == "layerwise" else "from_pretrained"


def _row(plan: Plan, label: str) -> Estimate:
    """A row of the options table by its label (`CONFIGURED`: the configuration as written)."""
    return next((o.estimate for o in plan.options if o.label == label), plan.configured)


def _take_it(sets: list[str]) -> str:
    return "  take it: " + escape(" ".join(f"--set '{x}'" for x in sets))


def _fastest_lines(plan: Plan, measured: dict[str, Measured]) -> list[str]:
    """The fastest that fits: from measured rows only; the plan's modelled pick is named as a guess
    unless a rehearsal measured it."""
    e, bs = plan.configured, plan.best
    lines = []
    accum = plan.run.micro_batches if plan.run else 1
    found = fastest_measured(plan, measured)
    if found is not None:
        label, m = found
        row = _row(plan, label)
        lines.append(
            f"[bold]Fastest that fits, measured[/] ({escape(m.source)}): {row.setup.describe()}: "
            f"~{m.tokens_per_s:,.0f} tokens/s, {m.step_s:.2f} s an optimizer step"
            + (f", GPU {m.gpu_train_gib:.1f} GiB in training" if m.gpu_train_gib else "")
        )
        sets = overrides_for(e.setup, row.setup, accum)
        if sets:
            lines.append(_take_it(sets))
    if bs is None or bs.setup in [_row(plan, label).setup for label in measured]:
        return lines
    sets = plan.best_overrides()
    guess = "a guess: modelled, not rehearsed" + (
        f"; measure it with `cockpit rehearse --profile {plan.profile_name} "
        + " ".join(f"--set '{x}'" for x in sets)
        + "`"
        if sets
        else ""
    )
    unknown = f" (not checked: {' and '.join(e.unchecked)})" if e.unchecked else ""
    lines.append(
        f"[bold]Fastest that fits{unknown}[/] ({escape(guess)}): {bs.setup.describe()}: "
        f"GPU {size(bs.load.gpu_peak)} at load, "
        f"{size(bs.train.gpu_peak)} in training; host {size(bs.load.host_peak)} at load, "
        f"{size(bs.train.host_peak)} in training; ~{bs.tokens_per_s:,.0f} tokens/s"
    )
    lines.extend(f"  note: {escape(n)}" for n in bs.notes)
    if sets and found is None:
        lines.append(_take_it(sets))
    return lines


def verdict_text(plan: Plan, measured: dict[str, Measured] | None = None) -> Text:
    e = plan.configured
    colour = "yellow" if e.fits and e.unchecked else "green" if e.fits else "red"
    lines = [f"[bold {colour}]{escape(plan.verdict())}[/]"]
    b = e.binding
    if b and not e.fits and b.name == "GPU memory at load" and e.setup.loader == "transformers":
        lines.append(
            "  from_pretrained skips zero.Init for a quantized model: each rank's whole model lands on its "
            'GPU before ZeRO-3 partitions it (model.loader = "layerwise" loads one layer at a time).'
        )
    for r in plan.requirements:
        lines.append(f"[bold]Required:[/] {escape(r)}.")
    if plan.best is not None:
        lines += _fastest_lines(plan, measured or {})
    elif e.setup.gpus and not e.fits:
        lines.append("[bold red]No option fits on this hardware.[/]")
    run = plan.run
    mine = (measured or {}).get(CONFIGURED)
    if run is not None and run.train_s:
        step, how = run.optimizer_step_s, "modelled"
        if mine is not None:
            step, how = mine.step_s, f"measured by {mine.source}, the plan's {run.optimizer_step_s:.2f} s"
        lines.append(
            f"[bold]Training time for the data, as configured:[/] {run.steps:,} optimizer steps x "
            f"{step:.2f} s ({escape(how)}; {run.micro_batches} micro-batch(es) a rank each) = "
            f"{run.steps * step / 3600:.2f} h, without load, saves and evaluation; tokens: {escape(run.how)}"
        )
    elif run is not None and e.setup.gpus:
        lines.append(f"Training time for the data: unknown ({escape(run.how)})")
    elif not e.setup.gpus:
        lines.append(
            "Training time: not predicted on the CPU (the step-time model is measured on GPUs); "
            "a run's ETA shows from its first steps"
        )
    if run is not None and run.validation is not None and (run.train_s or e.setup.gpus):
        v = run.validation
        lines.append(f"[bold]Validation loss, on top:[/] {escape(v.words())}")
        if mine is not None and mine.validation_s is not None:
            lines.append(
                f"  measured by {escape(mine.source)}: {mine.validation_s / 3600:.2f} h (its forwards timed)"
            )
        if run.train_s and v.total_s and run.with_validation_s is not None:
            lines.append(
                f"[bold]Training and validation: {run.with_validation_s / 3600:.2f} h[/] on "
                f"{e.setup.gpus} GPU(s); the load and checkpoint saves are not modelled here "
                "(`cockpit rehearse` measures them, and predicts the whole run's wall clock)"
            )
    if run is not None and (words := evaluation_words(run.evaluation, mine)):
        lines.append(f"[bold]Evaluation, after training:[/] {escape(words)}")
    return Text.from_markup("\n".join(lines))


def experts_text(plan: Plan) -> Text | None:
    alt = plan.alt_experts
    if alt is None:
        return None
    planned_4bit = plan.inputs.precision.experts_4bit
    mine = plan.inputs.weights.stored_bytes
    other = plan.inputs.with_experts_4bit(not planned_4bit).weights.stored_bytes
    e = plan.configured
    if planned_4bit:
        head = (
            "[bold]Experts:[/] planned in NF4, packed by the trainer (quantization.quantize_experts = true). "
            "Transformers 5 fuses them into 3-D parameters that bitsandbytes does not quantize: if they stay "
            "in 16 bit, "
        )
    else:
        head = (
            "[bold yellow]Experts: left in 16 bit[/] (Transformers 5 fuses them into 3-D parameters that "
            "bitsandbytes does not quantize; quantization.quantize_experts = false). In 4 bit instead, "
        )
    # What, theirs, ours, theirs' unit.
    pairs = [("weights", size(other, binary=False), size(mine, binary=False), "")]
    if alt.load.gpu_peak or e.load.gpu_peak:  # a CPU plan has no GPU to load onto
        pairs.append(("GPU at load", size(alt.load.gpu_peak), size(e.load.gpu_peak), ""))
    pairs.append(("host in training", size(alt.train.host_peak), size(e.train.host_peak), ""))
    if alt.transfer_s is not None and e.transfer_s is not None:
        pairs.append(("host-to-device", f"{alt.transfer_s:.2f}", f"{e.transfer_s:.2f}", " s/step"))
    parts = [f"{what} {theirs}{u} instead of {ours}" for what, theirs, ours, u in pairs if theirs != ours]
    found = plan.alt_found
    if found and found.best is not None:
        parts.append(f"fastest that fits: {found.best.setup.describe()}")
    elif found and found.closest is not None:
        c = found.closest
        b = c.binding
        parts.append(
            f"[bold red]no option fits[/]: the closest ({c.setup.describe()})"
            + (f" needs {size(b.need)} of {size(b.limit)} for {b.name}" if b else "")
        )
    return Text.from_markup(head + "; ".join(parts) + ".")


def render(plan: Plan, measured: dict[str, Measured] | None = None) -> Group:
    """Everything `cockpit plan` prints; `measured`: the rows rehearsals measured (`--rehearsal`)."""
    parts = [header(plan, measured), weights_table(plan), facts_table(plan), phases_table(plan)]
    if plan.options:
        parts.append(options_table(plan, measured))
    parts.append(verdict_text(plan, measured))
    experts = experts_text(plan)
    if experts is not None:
        parts.append(experts)
    if plan.notes:
        parts.append(Text("\n".join(f"note: {n}" for n in plan.notes)))
    return Group(*parts)
