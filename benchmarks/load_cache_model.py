"""The forecast's model of a load from the NF4 cache, checked against the H200 measurement.

The forecast (`cockpit.rehearse.forecast.cached_load`) says a load from the cache reads the plan's stored
bytes (`cockpit.plan.load_read`) at the assumed disk rate and does at most the first load's work (the
rehearsal's load of random weights: drawn, quantized, placed). Here that model meets what
`benchmarks/load_cache.py` measured on one H200 (`results/load_cache_h200.json`: the story's 8-layer
slice as a real checkpoint, one device, no ZeRO), with the work of the same slice's load from the
rehearsal without offload (`results/forecast/records/none_1-16`, one H200, ZeRO-3 on one GPU):

  bytes      the plan's stored bytes of the slice against the cache's bytes read (out of sample: the plan's
             formats are checked against the trainer, never against the cache)
  model      the cache at the assumed 2 GB/s plus 0 to the rehearsal's work: a range, and the measured
             second load in it or not (out of sample: nothing here was fitted to this measurement)
  bound      the disk rate is at least the first load's bytes over its seconds (that load read them and
             did more): the cache read at that rate plus the work bounds the second load from above (in
             sample: the rate comes from the same measurement)
  first      the same model of the first load (the checkpoint at 2 GB/s plus the work) against it

No GPU needed. Writes load_cache_model.md and .json under --out (default benchmarks/results).

    python benchmarks/load_cache_model.py
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MEASURED = ROOT / "benchmarks/results/load_cache_h200.json"
REHEARSAL = "none_1-16"  # the story without offload: one GPU, as load_cache.py loads


def slice_bytes(profile_name: str, layers: int) -> tuple[int, int, float]:
    """The plan's checkpoint and NF4-cache bytes of the profile sliced to `layers`, and its disk rate."""
    from cockpit.plan import build_plan
    from cockpit.plan.inputs import resolve_geometry
    from cockpit.profiles import load_profile

    profile, _ = load_profile(profile_name, [])
    plan = build_plan(profile, geometry=resolve_geometry(profile).with_layers(layers))
    assert plan.load is not None
    return plan.load.checkpoint_bytes, plan.load.cache_bytes, plan.load.disk_gbps


def rehearsed_work(layers: int) -> float | None:
    """The rehearsal's load of the slice at `layers` (random weights, no offload), its seconds."""
    from benchmarks.forecast_consistency import measures_of

    m = measures_of([REHEARSAL]).get(layers)
    return float(m.load_s) if m is not None and m.load_s is not None else None


def check(
    measured: dict[str, Any], checkpoint: int, cache: int, disk_gbps: float, work: float
) -> dict[str, Any]:
    """The model's figures beside the measured loads (see the module's docstring)."""
    from cockpit.rehearse.forecast import cached_load

    first, second = measured["rows"][0], measured["rows"][1]
    rate = disk_gbps * 1e9
    _, (lo, hi) = cached_load(cache, disk_gbps, work, work)
    floor_gbps = first["read_bytes"] / first["seconds"] / 1e9  # the disk gave the first load at least this
    bound = cache / (floor_gbps * 1e9) + work
    first_model = checkpoint / rate + work
    return {
        "layers": measured["layers"],
        "device": measured["device"],
        "plan_cache_bytes": cache,
        "cache_bytes_read": second["cache_bytes_read"],
        "bytes_error": (cache - second["cache_bytes_read"]) / second["cache_bytes_read"],
        "plan_checkpoint_bytes": checkpoint,
        "checkpoint_bytes": measured["checkpoint_bytes"],
        "disk_gbps": disk_gbps,
        "work_s": work,
        "cached_model_s": [lo, hi],
        "cached_s": second["seconds"],
        "cached_in_range": lo <= second["seconds"] <= hi,
        "cached_read_gbps": second["read_bytes"] / second["seconds"] / 1e9,
        "first_floor_gbps": floor_gbps,
        "cached_bound_s": bound,
        "cached_within_bound": second["seconds"] <= bound,
        "first_model_s": first_model,
        "first_s": first["seconds"],
        "first_beyond_model_s": first["seconds"] - first_model,
        "byte_ratio": cache / checkpoint,
        "time_ratio": second["seconds"] / first["seconds"],
    }


def table(r: dict[str, Any]) -> str:
    gb = 1e9
    rows = [
        (
            "bytes (out of sample)",
            f"plan {r['plan_cache_bytes']:,}",
            f"read {r['cache_bytes_read']:,}",
            f"{r['bytes_error']:+.4%}",
        ),
        (
            "cached load, model (out of sample)",
            f"{r['plan_cache_bytes'] / gb:.1f} GB at {r['disk_gbps']:g} GB/s + 0 to {r['work_s']:.1f} s "
            "work: "
            f"{r['cached_model_s'][0]:.1f}-{r['cached_model_s'][1]:.1f} s",
            f"{r['cached_s']:.1f} s",
            "in range" if r["cached_in_range"] else "OUTSIDE",
        ),
        (
            "cached load, bound (in sample)",
            f"at the first load's {r['first_floor_gbps']:.2f} GB/s (the disk's least) + work: "
            f"<= {r['cached_bound_s']:.1f} s",
            f"{r['cached_s']:.1f} s",
            "within" if r["cached_within_bound"] else "OVER",
        ),
        (
            "first load, the same model",
            f"{r['plan_checkpoint_bytes'] / gb:.1f} GB at {r['disk_gbps']:g} GB/s + {r['work_s']:.1f} s: "
            f"{r['first_model_s']:.1f} s",
            f"{r['first_s']:.1f} s",
            f"{r['first_beyond_model_s']:+.1f} s beyond it",
        ),
    ]
    lines = ["| figure | model | measured | |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--measured", type=Path, default=MEASURED, help="load_cache.py's JSON")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    args = parser.parse_args(argv)
    measured = json.loads(args.measured.read_text())
    layers = int(measured["layers"])
    checkpoint, cache, disk = slice_bytes(measured["profile"], layers)
    work = rehearsed_work(layers)
    if work is None:
        print(f"{REHEARSAL}: no rehearsed load at {layers} layers", file=sys.stderr)
        return 2
    r = check(measured, checkpoint, cache, disk, work)
    text = (
        f"# The NF4 cache's load: the forecast's model against the H200\n\n"
        f"{measured['profile']} sliced to {layers} layers on {r['device']} "
        f"(`{args.measured.name}`); the work: the rehearsal's load of the same slice, random weights, no "
        f"offload, {r['work_s']:.1f} s (`forecast/records/{REHEARSAL}`). "
        "`python benchmarks/load_cache_model.py`.\n\n"
        f"{table(r)}\n\n"
        f"The second load read its {r['cache_bytes_read'] / 1e9:.1f} GB at {r['cached_read_gbps']:.2f} "
        f"GB/s or faster (all of its {r['cached_s']:.1f} s counted as reading). The first load took "
        f"{r['first_beyond_model_s']:.0f} s more than the checkpoint's read at {r['disk_gbps']:g} GB/s and "
        f"the rehearsal's work: its {r['checkpoint_bytes']:,} bytes came at {r['first_floor_gbps']:.2f} "
        "GB/s all told, the real checkpoint's tensor reads, stacking the experts and quantizing them not "
        "told apart from a slower read of scattered tensors. So the forecast's first load is a lower "
        f"figure, its cached load fits; the cache's load time is {r['time_ratio']:.0%} of the first's, "
        f"its bytes {r['byte_ratio']:.0%}.\n"
    )
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "load_cache_model.md").write_text(text)
    (args.out / "load_cache_model.json").write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
