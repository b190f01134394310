"""How the app copes with a 26-hour record: open time, refresh time, memory.

Generates the record of a 4-GPU run of 100,000 optimizer steps at 0.936 s a step (26 h): every
rank's step events (as the trainer writes them, 4 × 100,000 lines), 100,000 telemetry samples of
4 GPUs each, checkpoints, the audit; then opens the app on it headless at 120×40 in a fresh
process, first live (`cockpit attach`), then as a replay jumped to the end, and prints a table.

    python benchmarks/replay_large.py                 # generate in a temporary folder, measure, delete
    python benchmarks/replay_large.py --keep DIR      # keep (or reuse) the record in DIR

Figures: open = from process start (imports included) to the first frame on screen with data;
history = to the frame with every line of the record read and folded; refresh = one live update
(read the new lines, fold, bucket all four charts, show them, repaint the screen); RSS = the app
process, now and at its peak.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]
STEP_S = 0.936
REPLAY_SPEED = 64.0  # the replay's first step comes 6 s of record time after its first event


# --- the record ---------------------------------------------------------------------------------
def _step_line(t: float, rank: int, step: int, steps: int, rng: random.Random) -> str:
    loss = 2.2 * (0.25 + 0.75 * 2.718 ** (-step / (steps / 6))) + rng.gauss(0, 0.05)
    lr = 1e-4 * min(1.0, step / 1000) * (1 - step / steps) + 1e-7
    tps = 4380 + rng.gauss(0, 120) - (1500 if rng.random() < 0.002 else 0)
    peak = 61000 + 900 * rank + rng.random() * 40
    grad_norm = abs(rng.gauss(1, 0.3))
    return (
        f'{{"t":{t:.4f},"kind":"step","rank":{rank},"step":{step},"max_steps":{steps},'
        f'"epoch":{step / (steps / 3):.4f},"loss":{loss!r},"learning_rate":{lr!r},"grad_norm":{grad_norm!r},'
        f'"step_time_s":{STEP_S + rng.gauss(0, 0.01):.4f},"tokens_per_s":{tps:.2f},"samples_per_s":1.068,'
        f'"tokens":4096,"rss_mib":{118000 + rng.random() * 500:.1f},"rss_peak_mib":{119000.0:.1f},'
        f'"cuda_alloc_mib":{52000 + rng.random() * 100:.1f},"cuda_reserved_mib":{64000.0:.1f},'
        f'"cuda_peak_alloc_mib":{peak:.1f},"cuda_peak_reserved_mib":{66000.0:.1f}}}\n'
    )


def _telemetry_line(t: float, gpus: int, rng: random.Random) -> str:
    used = [f"{60000 + 900 * g + rng.random() * 3000:.1f}" for g in range(gpus)]
    return (
        f'{{"t":{t:.4f},"kind":"telemetry","gpu_mem_used_mib":[{",".join(used)}],'
        f'"gpu_mem_total_mib":[{",".join(["81559.0"] * gpus)}],'
        f'"gpu_util_pct":[{",".join(f"{90 + rng.random() * 9:.0f}" for _ in range(gpus))}],'
        f'"gpu_power_w":[{",".join(f"{600 + rng.random() * 80:.1f}" for _ in range(gpus))}],'
        f'"gpu_temp_c":[{",".join(f"{68 + rng.random() * 6:.0f}" for _ in range(gpus))}],'
        f'"ram_used_mib":{610000 + rng.random() * 20000:.1f},"ram_available_mib":{370000.0:.1f},'
        f'"ram_total_mib":983040.0,"swap_used_mib":0.0,"swap_total_mib":0.0,'
        f'"cpu_pct":{40 + rng.random() * 20:.1f},"run_processes":6,'
        f'"run_rss_mib":{480000 + rng.random() * 10000:.1f},"run_cpu_pct":{900 + rng.random() * 200:.1f}}}\n'
    )


def generate(run_dir: Path, steps: int, ranks: int, gpus: int, samples: int) -> None:
    rng = random.Random(0)
    events = run_dir / "events"
    events.mkdir(parents=True, exist_ok=True)
    t0 = time.time() - steps * STEP_S - 120
    manifest = {
        "format_version": 1,
        "run_id": run_dir.name,
        "status": "running",
        "profile_name": "qwen3-235b-a22b-thinking-4xh100",
        "profile": {},
        "created_at": t0 - 5,
        "started_at": t0 - 5,
    }
    (run_dir / "run.json").write_text(json.dumps(manifest, indent=2))
    with open(events / "supervisor.jsonl", "w") as f:
        f.write(json.dumps({"t": t0 - 4, "kind": "supervisor_start", "pid": 1, "resume": False}) + "\n")
        f.write(
            json.dumps({"t": t0 - 3.9, "kind": "launch", "argv": ["python"], "pid": 2, "world_size": ranks})
            + "\n"
        )
    audit = {
        "params_total": 235_000_000_000,
        "params_4bit": 231_000_000_000,
        "fraction_4bit": 0.983,
        "params_trainable": 86_000_000,
        "lora_targets": {"q_proj": 94, "k_proj": 94, "v_proj": 94, "o_proj": 94},
        "requested": {"zero_stage": 3, "offload_param": "cpu", "offload_optimizer": "cpu",
                      "gradient_checkpointing": True},
        "applied": {"zero_stage": 3, "offload_param": "cpu", "offload_optimizer": "cpu",
                    "gradient_checkpointing": True, "params_partitioned": True, "partitioned_at_load": False},
        "warnings": ["ZeRO-3 did not partition at load (Transformers skips zero.Init for quantized models): "
                     "each of 4 rank(s) held the whole model in host RAM before partitioning"],
    }  # fmt: skip
    for rank in range(ranks):
        with open(events / f"trainer-rank{rank}.jsonl", "w") as f:
            head = [
                {"t": t0, "kind": "phase", "rank": rank, "phase": "train"},
                {"t": t0 + 0.01, "kind": "audit", "rank": rank, **audit},
                {"t": t0 + 0.02, "kind": "train_begin", "rank": rank, "max_steps": steps, "start_step": 0},
            ]
            f.writelines(json.dumps(e, separators=(",", ":")) + "\n" for e in head)
            lines = []
            for step in range(1, steps + 1):
                t = t0 + 1 + step * STEP_S
                lines.append(_step_line(t, rank, step, steps, rng))
                if step % 500 == 0:
                    lines.append(
                        f'{{"t":{t + 0.5:.4f},"kind":"checkpoint","rank":{rank},'
                        f'"step":{step},"path":"ckpt"}}\n'
                    )
                if len(lines) >= 20000:
                    f.writelines(lines)
                    lines = []
            f.writelines(lines)
    with open(events / "telemetry.jsonl", "w") as f:
        f.write(json.dumps({"t": t0 - 3, "kind": "telemetry_start", "nvml": "ok", "gpus": []}) + "\n")
        f.writelines(
            _telemetry_line(t0 + 1 + i * (steps * STEP_S / samples), gpus, rng) for i in range(samples)
        )
    with open(run_dir / "output.log", "w") as f:
        f.writelines(
            f"step {s}/{steps} loss 0.5 lr 1e-05 4380 tok/s (0.94 s/step)\n" for s in range(1, steps + 1)
        )


# --- measuring (in a fresh process) ------------------------------------------------------------------
def _rss_mib() -> tuple[float, float]:
    import psutil

    return psutil.Process().memory_info().rss / 2**20, resource.getrusage(
        resource.RUSAGE_SELF
    ).ru_maxrss / 1024


def append_live(run_dir: Path, ranks: int, gpus: int, step: int, steps: int, rng: random.Random) -> None:
    """What a running 4-GPU job adds in one second: a step on every rank and a telemetry sample."""
    t = time.time()
    for rank in range(ranks):
        with open(run_dir / "events" / f"trainer-rank{rank}.jsonl", "a") as f:
            f.write(_step_line(t, rank, step, steps, rng))
    with open(run_dir / "events" / "telemetry.jsonl", "a") as f:
        f.write(_telemetry_line(t, gpus, rng))


async def _measure(run_dir: Path, live: bool, ranks: int, gpus: int, refreshes: int) -> dict[str, float]:
    t_import = time.perf_counter()
    import numpy as np

    from cockpit.app.app import CockpitApp

    imported = time.perf_counter() - START
    app = CockpitApp(run_dir, live=live, speed=1.0 if live else REPLAY_SPEED)
    out: dict[str, float] = {"import_s": imported, "import_only_s": time.perf_counter() - t_import}
    async with app.run_test(size=(120, 40)) as pilot:
        while app.shown == 0:
            await asyncio.sleep(0.005)
        out["first_frame_s"] = time.perf_counter() - START

        def has_data() -> bool:
            snap = app.last_snapshot
            return snap is not None and any(
                np.any(~np.isnan(t.ymax)) for c in snap.charts.values() for t in c.traces
            )

        while not has_data():
            await asyncio.sleep(0.005)
        out["first_data_s"] = time.perf_counter() - START
        if not live:
            app.action_jump_end()
        while not (app.playback.loaded and app.last_snapshot and app.last_snapshot.header.loading is None):
            await asyncio.sleep(0.01)
        if not live:
            while not (app.playback.follow and app.last_snapshot.header.following):
                await asyncio.sleep(0.01)
        out["history_s"] = time.perf_counter() - START
        await pilot.pause()
        out["rss_after_open_mib"], _ = _rss_mib()
        rng = random.Random(1)
        step0 = app.playback.view.step
        ticks, builds, shows, paints, totals = [], [], [], [], []
        for i in range(refreshes):
            append_live(run_dir, ranks, gpus, step0 + i + 1, step0 + refreshes, rng)
            before = app.shown
            t = time.perf_counter()
            app._wake.set()
            while app.shown == before:
                await asyncio.sleep(0.001)
            t_paint = time.perf_counter()
            app.screen._compositor.render_full_update()
            paint = time.perf_counter() - t_paint
            tick, build, show = app.timings[-1]
            ticks.append(tick)
            builds.append(build)
            shows.append(show)
            paints.append(paint * 1000)
            totals.append(tick + build + show + paint * 1000)
            del t
        out["refresh_parts_worst"] = {
            "tick": max(ticks),
            "build": max(builds),
            "show": max(shows),
            "paint": max(paints),
        }
        out["refresh_ms_median"] = statistics.median(totals)
        out["refresh_ms_max"] = max(totals)
        out["tick_ms"] = statistics.median(ticks)
        out["build_ms"] = statistics.median(builds)
        out["show_ms"] = statistics.median(shows)
        out["paint_ms"] = statistics.median(paints)
        out["rss_mib"], out["rss_peak_mib"] = _rss_mib()
        out["steps_seen"] = app.playback.view.step
        out["series_kib"] = app.playback.series.nbytes() / 1024
    return out


def measure_main(run_dir: Path, live: bool, ranks: int, gpus: int, refreshes: int) -> None:
    result = asyncio.run(_measure(run_dir, live, ranks, gpus, refreshes))
    print(json.dumps(result))


# --- the table ----------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--samples", type=int, default=100_000, help="telemetry samples")
    parser.add_argument("--refreshes", type=int, default=20)
    parser.add_argument("--keep", type=Path, default=None, help="generate into (or reuse) this run directory")
    parser.add_argument("--measure", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--replay", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure_main(args.measure, not args.replay, args.ranks, args.gpus, args.refreshes)
        return 0

    tmp = None
    if args.keep is not None:
        run_dir = args.keep
    else:
        tmp = Path(tempfile.mkdtemp(prefix="cockpit-bench-"))
        run_dir = tmp / "20260101-000000-large-0000"
    try:
        if not (run_dir / "run.json").exists():
            t = time.perf_counter()
            generate(run_dir, args.steps, args.ranks, args.gpus, args.samples)
            print(f"generated {run_dir} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        size = sum(p.stat().st_size for p in (run_dir / "events").glob("*.jsonl"))
        lines = sum(p.read_bytes().count(b"\n") for p in (run_dir / "events").glob("*.jsonl"))
        results = {}
        for mode in ("live", "replay"):
            work = Path(tempfile.mkdtemp(prefix="cockpit-bench-copy-")) / run_dir.name
            shutil.copytree(run_dir, work)  # the refresh test appends lines: leave the original alone
            try:
                cmd = [sys.executable, __file__, "--measure", str(work), "--ranks", str(args.ranks),
                       "--gpus", str(args.gpus), "--refreshes", str(args.refreshes)]  # fmt: skip
                if mode == "replay":
                    cmd.append("--replay")
                env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
                results[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
            finally:
                shutil.rmtree(work.parent, ignore_errors=True)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    load = os.getloadavg()
    print(
        f"\nmachine: {os.cpu_count()} CPUs, load average "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1/5/15 min)"
    )
    print(
        f"record: {args.steps:,} steps x {args.ranks} ranks, "
        f"{args.samples:,} telemetry samples x {args.gpus} GPUs; "
        f"{lines:,} lines, {size / 2**20:.0f} MiB of events; app at 120x40, headless\n"
    )
    rows = [
        ("imports (python + textual + cockpit)", "import_s", "{:.2f} s"),
        ("open: first frame on screen", "first_frame_s", "{:.2f} s"),
        ("open: first frame with curves", "first_data_s", "{:.2f} s"),
        ("history: every line read and folded", "history_s", "{:.2f} s"),
        ("refresh, median (tick+build+show+paint)", "refresh_ms_median", "{:.1f} ms"),
        ("refresh, worst of the run", "refresh_ms_max", "{:.1f} ms"),
        ("  read new lines + fold (worker)", "tick_ms", "{:.1f} ms"),
        ("  bucket 4 charts to width (worker)", "build_ms", "{:.1f} ms"),
        ("  show snapshot (UI thread)", "show_ms", "{:.1f} ms"),
        ("  repaint whole screen (UI thread)", "paint_ms", "{:.1f} ms"),
        ("RSS after open", "rss_after_open_mib", "{:.0f} MiB"),
        ("RSS at the end / peak", None, ""),
        ("curves held (bounded)", "series_kib", "{:.0f} KiB"),
    ]
    print(f"| {'figure':<42} | {'live (attach)':>15} | {'replay 64x, then end':>20} |")
    print(f"|{'-' * 44}|{'-' * 17}|{'-' * 22}|")
    for label, key, spec in rows:
        if key is None:
            cells = [
                f"{r['rss_mib']:.0f} / {r['rss_peak_mib']:.0f} MiB"
                for r in (results["live"], results["replay"])
            ]
        else:
            cells = [spec.format(results[m][key]) for m in ("live", "replay")]
        print(f"| {label:<42} | {cells[0]:>15} | {cells[1]:>20} |")
    worst = {m: results[m]["refresh_parts_worst"] for m in results}
    print(
        "\nworst parts (ms): "
        + "; ".join(f"{m}: " + ", ".join(f"{k} {v:.1f}" for k, v in w.items()) for m, w in worst.items())
    )
    print(
        "\nLive: the first frame with curves is a preview (both ends of each event file read whole, 400"
        " lines sampled between), replaced by the exact fold once every line is read. Replay: files are"
        " read side by side in time order, so playback starts from the first chunk; 'history' is the"
        " time until a jump to the end shows the last event."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
