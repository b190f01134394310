"""Does a rehearsal predict? Depth 4 predicted from the 1- and 2-layer runs, beside its measurement.

For each configuration (NF4 or 16-bit experts, parameter offload or none) the story's architecture is
rehearsed at 1, 2 and 4 layers, or the depths `--depths` names (random weights, the story profile's
settings, `cockpit.rehearse`'s depth brackets in the record). The models fitted over depths 1 and 2
(`cockpit.rehearse.figures.fit_all`, as the rehearsal's forecast fits them) are read at the deepest
depth and set beside what it measured: GPU peak at load and in training, host RSS at load and in
training, median step time, and a validation forward (timed after each depth's steps; results from before
it have none). The deepest depth's figures are out of sample: they took no part in the fit.

    python benchmarks/rehearsal_accuracy.py                     # on the GPU
    python benchmarks/rehearsal_accuracy.py --configs nf4-none  # one configuration
    python benchmarks/rehearsal_accuracy.py --configs nf4-offload --depths 1,2,6  # predict depth 6
    python benchmarks/rehearsal_accuracy.py --cpu               # the tiny profile, a smoke test
    python benchmarks/rehearsal_accuracy.py --configs nf4-offload --set training.micro_batch_size=4 \
        --set training.grad_accum=2                             # another micro-batch, every depth

The depths run the profile's micro-batch and accumulation unless `--set` changes them; the output says
which. (The records in `results/forecast/records/` other than `offload_1-16_mb8` ran 4 rows and
accumulation 2: the story profile's until that record's call moved it to 8 rows and accumulation 1.)
Writes rehearsal_accuracy.md and .json under $OUT (else benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIGS = {
    "nf4-none": ("true", "none"),
    "nf4-offload": ("true", "cpu"),
    "bf16-none": ("false", "none"),
    "bf16-offload": ("false", "cpu"),
}
DEPTHS = (1, 2, 4)  # --depths: the last is the one predicted
FIT_DEPTHS = (1, 2)
STEPS = 8
TOLERANCE = 0.15
EXTRA: list[str] = []  # --set: profile overrides on top of every configuration's (e.g. another micro-batch)
FIGURES = (
    ("gpu_load", "GPU load GiB"),
    ("gpu_train", "GPU train GiB"),
    ("rss_load", "RSS load GiB"),
    ("rss_train", "RSS train GiB"),
    ("step_s", "step s"),
    ("validation_s", "validation fwd s"),
)


def config_overrides(config: str, gpu: bool, ranks: int | None = None) -> list[str]:
    """The profile overrides of one configuration; `ranks` ranks (GPUs, or CPU ranks) where given, else
    one rank."""
    experts, offload = CONFIGS[config]
    overrides = [
        f"quantization.quantize_experts={experts}",
        f'deepspeed.offload_param="{offload}"',
        f'deepspeed.offload_optimizer="{offload}"',
        f"hardware.gpus={ranks if ranks else 1 if gpu else 0}",
    ]
    if not gpu:
        overrides += ["training.bf16=false", "training.micro_batch_size=4", "data.mean_tokens=100"]
    return overrides + EXTRA


def ran_with(result: dict[str, Any], config: str, gpu: bool, ranks: int | None = None) -> list[str]:
    """The overrides a result's depths ran with: as it kept them, else (written before it kept them) the
    configuration's with the micro-batch and accumulation of then (`forecast_consistency.RAN_AT`: the story
    profile's 4 rows a micro-batch, and the accumulation of 2 this script forced)."""
    from benchmarks.forecast_consistency import RAN_AT

    kept = result.get("overrides")
    if kept is not None:
        return list(kept)
    return [o for o in config_overrides(config, gpu, ranks) if o not in EXTRA] + RAN_AT


def models(
    config: str, profile_name: str, gpu: bool, ranks: int | None = None, overrides: list[str] | None = None
) -> Any:
    """The configuration's shape terms on `ranks` ranks (else one): its prefetch window and a layer's
    copies, the knee of its gathered layers and the plan's growth a layer past it
    (`cockpit.rehearse.figures.terms_for`), from its plan's bytes and the plan's host-to-device bandwidth,
    exactly as the rehearsal's forecast makes them; for the profile with `overrides` where given (what the
    depths ran with: `ran_with`), else the configuration's now."""
    from cockpit.plan import Assumptions, build_plan
    from cockpit.profiles import load_profile
    from cockpit.rehearse.figures import terms_for
    from cockpit.rehearse.forecast import model_facts

    if overrides is None:
        overrides = config_overrides(config, gpu, ranks)
    profile, _ = load_profile(profile_name, overrides)
    plan = build_plan(profile).to_dict()
    facts = model_facts(plan)
    return terms_for(profile, plan, facts.layers, facts.layer_bytes, ranks or 1, Assumptions().h2d_gbps)


def rehearse(
    config: str,
    profile_name: str,
    gpu: bool,
    runs: Path,
    deadline: float,
    depths: tuple[int, ...] = DEPTHS,
    ranks: int | None = None,
    env: dict[str, str] | None = None,
    sampler: bool = False,
) -> dict[str, Any]:
    """Every depth of one configuration in one record, bracketed as the rehearsal command brackets them.

    One rank by default (`run_depth`); with `ranks`, that many through DeepSpeed's runner as `cockpit run`
    launches them (`run_ranks`), the telemetry sampler beside them if `sampler`. `env` goes to the ranks.
    """
    from benchmarks.trainer_runs import log_tail, new_run, run_depth, run_ranks
    from cockpit.record import EventWriter, RunPaths, read_events
    from cockpit.rehearse.measure import BEGIN, END, depth_measures
    from cockpit.service.spawn import rehearsal_args

    name = f"accuracy-{config}" + (f"-{ranks}r" if ranks else "")
    overrides = config_overrides(config, gpu, ranks)
    run_dir, profile = new_run(profile_name, overrides, runs, name)
    marks = EventWriter(RunPaths(run_dir).events("supervisor"))
    offset = 0
    for layers in depths:
        if time.time() > deadline:
            break
        marks.write(BEGIN, layers=layers, steps=STEPS, step_offset=offset)
        timeout = max(60, deadline - time.time())
        if ranks:
            extra = rehearsal_args(layers, STEPS, offset)
            code = run_ranks(run_dir, profile, extra, env, timeout=timeout, sampler=sampler)
        else:
            code = run_depth(run_dir, layers, STEPS, env, offset, timeout, sampler)
        ok = code == 0
        marks.write(
            END, layers=layers, status="ok" if ok else "failed", message="" if ok else log_tail(run_dir)
        )
        offset += STEPS
        if not ok:
            break
    marks.close()
    measures = depth_measures(read_events(run_dir))
    return {"run_dir": str(run_dir), "overrides": overrides, "measures": [m.to_dict() for m in measures]}


def compare(result: dict[str, Any], terms: Any = None) -> list[dict[str, Any]]:
    """Per figure: the rehearsal's fits over FIT_DEPTHS (`cockpit.rehearse.figures.fit_all` with the
    configuration's shape terms, `terms`) read at the deepest depth measured beyond them, beside its
    measurement."""
    from cockpit.rehearse.figures import Terms, fit_all
    from cockpit.rehearse.measure import DepthMeasure

    measures = [DepthMeasure.from_dict(m) for m in result["measures"]]
    by_depth = {m.layers: m for m in measures if m.complete}
    fits = fit_all([by_depth[d] for d in FIT_DEPTHS if d in by_depth], terms or Terms(full=max(by_depth)))
    check = max((d for d in by_depth if d not in FIT_DEPTHS), default=0)
    rows = []
    for key, label in FIGURES:

        def value(m: DepthMeasure, key: str = key) -> float | None:
            return getattr(m, key) if key in ("step_s", "validation_s") else m.peak(key)

        model = fits.get(key)
        measured = value(by_depth[check]) if check else None
        predicted = model.at(check) if model and check else None
        error = (predicted - measured) / measured if predicted is not None and measured else None
        rows.append(
            {"figure": label, "depth": check, "predicted": predicted, "measured": measured, "error": error}
        )
    return rows


def table(results: dict[str, dict[str, Any]], note: str, terms: dict[str, Any] | None = None) -> str:
    out = [
        "# Rehearsal accuracy: the deepest slice predicted from depth"
        + (f"s {', '.join(map(str, FIT_DEPTHS[:-1]))} and " if len(FIT_DEPTHS) > 1 else " ")
        + f"{FIT_DEPTHS[-1]} (out of sample)",
        "",
        note,
        "",
        "| configuration | " + " | ".join(label for _, label in FIGURES) + " | within 15% |",
        "|---|" + "---|" * (len(FIGURES) + 1),
    ]
    total = inside = 0
    for config, result in results.items():
        cells, ok = [], 0
        rows = compare(result, (terms or {}).get(config))
        for row in rows:
            if row["error"] is None:
                cells.append("-")
                continue
            flag = "" if abs(row["error"]) <= TOLERANCE else " !"
            ok += abs(row["error"]) <= TOLERANCE
            total += 1
            cells.append(f"{row['predicted']:.3g} / {row['measured']:.3g} ({row['error']:+.0%}){flag}")
        inside += ok
        depth = next((r["depth"] for r in rows if r["depth"]), None)
        if depth is None:  # no depth beyond the fitted ones: nothing to check
            continue
        out.append(
            f"| {config} (depth {depth}) | "
            + " | ".join(cells)
            + f" | {ok} of {sum(c != '-' for c in cells)} |"
        )
    out += ["", f"{inside} of {total} figures within 15% (predicted / measured, error against measured)."]
    return "\n".join(out) + "\n"


def merged(files: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Configurations of several results: each depth from the first file that completed it (else the
    first that has it; `DepthMeasure.complete`, what the fits take)."""
    from cockpit.rehearse.measure import DepthMeasure

    out: dict[str, dict[str, Any]] = {}
    for result in files:
        for config, run in result.items():
            have = out.setdefault(config, {"run_dir": run.get("run_dir", ""), "by_depth": {}})
            for m in run["measures"]:
                old = have["by_depth"].get(m["layers"])
                complete = DepthMeasure.from_dict(m).complete
                if old is None or (complete and not DepthMeasure.from_dict(old).complete):
                    have["by_depth"][m["layers"]] = m
    return {
        config: {"run_dir": run["run_dir"], "measures": [run["by_depth"][d] for d in sorted(run["by_depth"])]}
        for config, run in out.items()
    }


def accumulation(profile_name: str, overrides: list[str]) -> str:
    """The micro-batch and gradient accumulation depths ran with `overrides`, against the profile's own."""
    from cockpit.profiles import load_profile

    own = load_profile(profile_name)[0].training
    used = load_profile(profile_name, overrides)[0].training
    words = f"{used.micro_batch_size} rows a micro-batch, gradient accumulation {used.grad_accum}"
    if (used.micro_batch_size, used.grad_accum) == (own.micro_batch_size, own.grad_accum):
        return words + " (the profile's own)"
    return words + f" (the profile's: {own.micro_batch_size} and {own.grad_accum})"


def keep_record(run_dir: Path, target: Path) -> None:
    """The parts of a run's record a forecast reads (manifest, plan, event streams), copied to target."""
    import shutil

    (target / "events").mkdir(parents=True, exist_ok=True)
    for name in ("run.json", "plan.json"):
        if (run_dir / name).is_file():
            shutil.copy2(run_dir / name, target / name)
    for stream in (run_dir / "events").glob("*.jsonl"):
        shutil.copy2(stream, target / "events" / stream.name)


def main(argv: list[str] | None = None) -> int:
    from cockpit.cli.arguments import add_overrides

    global FIT_DEPTHS
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cpu", action="store_true", help="the tiny profile on the CPU (a smoke test)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated configurations")
    parser.add_argument("--budget-s", type=float, default=480)
    parser.add_argument("--note", default="", help="a line added under the table (how the runs were made)")
    parser.add_argument("--name", default="rehearsal_accuracy", help="the results' file name, without suffix")
    parser.add_argument(
        "--depths", default=",".join(map(str, DEPTHS)), help="depths run; the last is predicted"
    )
    parser.add_argument("--runs-dir", type=Path, default=Path("/tmp/rehearsal-accuracy-runs"))
    parser.add_argument(
        "--records",
        type=Path,
        help="copy each configuration's record (run.json, plan.json, events/) into this folder, as "
        "results/forecast/records/ keeps them",
    )
    add_overrides(parser)  # on top of each configuration's, e.g. --set training.grad_accum=1
    parser.add_argument(
        "--merge",
        type=Path,
        action="append",
        default=[],
        help="an earlier rehearsal_accuracy.json: its configurations are kept (repeatable: a later file's "
        "depths join those of the same configuration it lacks)",
    )
    parser.add_argument(
        "--fit-depths",
        default="1,2",
        help="the depths the models are fitted on (default 1,2); the deepest other depth is predicted",
    )
    args = parser.parse_args(argv)
    gpu = not args.cpu
    profile_name = "qwen3-235b-a22b-thinking-4xh100" if gpu else "tiny-cpu"
    if gpu and any("offload" in c for c in args.configs.split(",")):  # the op build stays out of the depths
        from benchmarks.trainer_runs import prepare_ops

        print(f"DeepSpeed ops ready ({prepare_ops(profile_name)} s spent building)", flush=True)
    deadline = time.time() + args.budget_s
    FIT_DEPTHS = tuple(int(d) for d in args.fit_depths.split(","))
    EXTRA[:] = args.overrides
    results = merged([json.loads(path.read_text()) for path in args.merge])
    for config in filter(None, args.configs.split(",")):  # --configs "" --merge F: report F again
        t0 = time.time()
        depths = tuple(int(d) for d in args.depths.split(","))
        results[config] = rehearse(config, profile_name, gpu, args.runs_dir, deadline, depths)
        done = [m["layers"] for m in results[config]["measures"] if m["status"] == "ok"]
        if args.records:
            keep_record(
                Path(results[config]["run_dir"]), args.records / f"{config}_{args.depths.replace(',', '-')}"
            )
        print(f"{config}: depths {done} in {time.time() - t0:.0f} s", flush=True)
    ran = {c: ran_with(results[c], c, gpu) for c in CONFIGS if c in results}
    batches = sorted({accumulation(profile_name, o) for o in ran.values()})
    note = (
        f"Profile {profile_name}, random weights, {STEPS} steps a depth (median of the last {STEPS - 2}), "
        f"{'; '.join(batches)}, one GPU."
        if gpu
        else "The tiny profile on the CPU (a smoke test of the method, not a claim)."
    )
    terms = {c: models(c, profile_name, gpu, overrides=o) for c, o in ran.items()}
    report = table({c: results[c] for c in CONFIGS if c in results}, note, terms)
    if args.note:
        report += "\n" + args.note + "\n"
    print(report)
    out = Path(os.environ.get("OUT") or ROOT / "benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    suffix = "" if gpu else "_cpu"
    (out / f"{args.name}{suffix}.md").write_text(report)
    (out / f"{args.name}{suffix}.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
