"""Write the README's pictures: `screenshots/*.svg` of the app at 120×40 (and one at 80×24).

- `run-live.svg`: the run screen following the recorded tiny run, mid-run (the record cut at half
  its length, the clock at that moment);
- `run-80x24.svg`: the same moment in an 80x24 terminal;
- `replay.svg`: `cockpit replay` of the same record at 8×, paused at the same moment;
- `run-4gpu-26h.svg`: the run screen over a generated 26-hour, 4-GPU record (the benchmark's);
- `run-2xh200.svg`: the run screen over a tiny run recorded on two H200s (two ranks, real NVML telemetry),
  two thirds into its steps, the GPU chart on the run's range (`g`); `--record RUN` takes any record
  of several ranks instead (`benchmarks/two_gpus.py` shoots its runs so), `--out FILE` writes elsewhere;
- `prediction.svg`: the prediction screen (`p`) of a recorded tiny rehearsal (`cockpit rehearse`);
- `report.svg`: the report screen (`r`) of the finished tiny run, with the report.json of an evaluated
  tiny-cpu run (`tests/fixtures/reports/`: the recorded run predates the evaluation stage);
- `compare.svg`: `cockpit compare` of two recorded tiny-cpu runs (150 steps each, evaluated) that differ
  only in their learning rate, 5e-3 and 1e-3;
- `data.svg`: `cockpit data` on the built-in tiny tenants (built in a temporary cache if need be);
- `run-val.svg`: the run screen over a finished tiny run with validation loss, each tenant's shown (`v`);
- `run-load-80x24.svg`, `run-eval-80x24.svg`, `run-stopped-80x24.svg`, `report-micro-80x24.svg`: an
  80x24 terminal while the model loads, during the evaluation, once stopped, and the report with micro
  F1 chosen (`r`, `m`), over synthetic records (`tests/synthetic_run.py`, the snapshot tests' records);
- the walk through the app at 80x24 (`tests/walk_scenes.py`, the snapshot tests' scenes):
  `run-val-80x24.svg` (the validation loss in the legend), `run-val-tenants-80x24.svg` (`v`: each
  tenant named), `replay-log-clock-80x24.svg` (the log pane on the replay clock),
  `run-stopping-80x24.svg` (a stop confirmed), `compare-80x24.svg` and `compare-f1-80x24.svg` (whole run
  ids, a run still going, `f`: F1 per tenant), `run-resumed-80x24.svg` (the time stopped left out, the
  resume marked), `run-finished-80x24.svg` (the diagnosis on one line).

    python screenshots/make_screenshots.py                         # all of them
    python screenshots/make_screenshots.py compare                 # compare.svg only
    python screenshots/make_screenshots.py data.svg run-val.svg    # only these two
    python screenshots/make_screenshots.py walk                    # the walk's 80x24 scenes only
    python screenshots/make_screenshots.py run-2xh200.svg --record runs/RUN --out /tmp/two-gpus.svg
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from replay_large import generate  # noqa: E402
from synthetic_run import make_run  # noqa: E402
from tui_helpers import FIXTURE, add_report, copy_until, fixture_times  # noqa: E402
from walk_scenes import SCENES, SMALL, build  # noqa: E402

from cockpit.app.app import CockpitApp, make_app  # noqa: E402
from cockpit.app.compare import make_compare_app  # noqa: E402
from cockpit.record.playback import Playback  # noqa: E402

SIZE = (120, 40)
# A tiny-cpu run recorded on two H200s (hardware.gpus=2, bf16, 80 steps): real NVML telemetry of both GPUs.
GPU_FIXTURE = ROOT / "tests" / "fixtures" / "records" / "20261130-074646-tiny-cpu-5bc8"
# A tiny-cpu run with validation loss every 40 steps, evaluated.
VAL_FIXTURE = ROOT / "tests" / "fixtures" / "records" / "20261201-115430-tiny-cpu-d226"
REHEARSAL = ROOT / "tests" / "fixtures" / "records" / "20261201-023803-tiny-cpu-729e"
OUT = ROOT / "screenshots"
# Two tiny-cpu runs, 150 steps, learning rates 5e-3 and 1e-3, each evaluated (`cockpit run --no-ui`).
LR_RUNS = [
    ROOT / "tests" / "fixtures" / "records" / "20261201-071535-tiny-cpu-1e29",
    ROOT / "tests" / "fixtures" / "records" / "20261201-071844-tiny-cpu-5986",
]


async def shoot(
    app: CockpitApp,
    path: Path,
    keys: tuple[str, ...] = (),
    size: tuple[int, int] = SIZE,
    opens: str | None = "report",
) -> None:
    """`keys` open the screen held in the app's attribute `opens` (the report, or the prediction), or
    with `opens=None` change what the run screen shows (the next snapshot shows it)."""
    async with app.run_test(size=size) as pilot:
        deadline = time.monotonic() + 120
        while not (app.last_snapshot and app.last_snapshot.header.loading is None):
            if time.monotonic() > deadline:
                raise TimeoutError(path.name)
            await pilot.pause(0.05)
        seen = app.shown
        while app.shown < seen + 1:
            await pilot.pause(0.05)
        if keys and opens is None:
            await pilot.press(*keys)
            seen = app.shown
            while app.shown < seen + 2:
                await pilot.pause(0.05)
        elif keys:
            while getattr(app, opens) is None:  # wait until what the keys open is there
                if time.monotonic() > deadline:
                    raise TimeoutError(path.name)
                await pilot.pause(0.05)
            await pilot.press(*keys)
            await pilot.pause(0.2)
        await pilot.pause()
        app.save_screenshot(path.name, str(path.parent))
    print(f"wrote {shown(path)}")


def shown(path: Path) -> Path:
    """`path` as printed: relative to the repository when inside it."""
    return path.relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path


async def shoot_gpus(record: Path, path: Path, tmp: Path) -> None:
    """The run screen over `record` as it stood two thirds into its rank-0 steps, the GPU chart on the
    run's range (`g`)."""
    steps = [
        json.loads(line)["t"]
        for line in (record / "events" / "trainer-rank0.jsonl").open()
        if '"kind":"step"' in line
    ]
    if not steps:
        raise ValueError(f"{record}: no step events of rank 0 to show")
    mid = steps[len(steps) * 2 // 3]
    run = copy_until(tmp / "gpu", mid, src=record)
    await shoot(make_app(run, live=True, now=lambda: mid + 1.0), path, ("g",), opens=None)


def shoot_data(path: Path) -> None:
    """`cockpit data` on the tiny tenants, as the command prints it, 110 columns wide."""
    import os

    from rich.console import Console

    from cockpit.cache import cache_root
    from cockpit.data import load_examples
    from cockpit.data.inspection import count_tokens, inspect, source_path
    from cockpit.data.render import render
    from cockpit.profiles import load_profile

    profile, _ = load_profile("tiny-cpu")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("COCKPIT_CACHE", tmp)  # the tenants and tokenizer: built if not cached
        data = load_examples(
            source_path(profile), profile.data, strict=False, cache_dir=cache_root() / "datasets"
        )
        lengths, how = count_tokens(data.examples, profile.model.path)
        found = inspect(data, lengths, how, profile.training.seq_len)
        found.path = "builtin:tiny-tenants"  # not the cache folder it was generated into
        console = Console(record=True, width=110, file=open(os.devnull, "w"))  # noqa: SIM115
        console.print("$ cockpit data", style="bold")
        console.print(render(found))
        console.save_svg(str(path), title="cockpit data")
    print(f"wrote {shown(path)}")


async def main(only: set[str]) -> None:
    if "data.svg" in only or not only:
        shoot_data(OUT / "data.svg")
    if "run-val.svg" in only or not only:
        await shoot(make_app(VAL_FIXTURE, live=True), OUT / "run-val.svg", ("v",), opens=None)
    if "run-2xh200.svg" in only:
        await shoot_record(GPU_FIXTURE, OUT / "run-2xh200.svg")
    if not only:
        await app_pictures()


async def app_pictures() -> None:
    first, last = fixture_times()
    mid = first + (last - first) / 2
    with tempfile.TemporaryDirectory() as tmp:
        run = copy_until(Path(tmp), mid)
        await shoot(make_app(run, live=True, now=lambda: mid + 1.0), OUT / "run-live.svg")
        await shoot(make_app(run, live=True, now=lambda: mid + 1.0), OUT / "run-80x24.svg", size=(80, 24))

        finished = copy_until(Path(tmp) / "finished")
        add_report(finished)
        await shoot(make_app(finished, live=True, now=lambda: last + 60.0), OUT / "report.svg", ("r",))

        await shoot(make_app(REHEARSAL, live=True), OUT / "prediction.svg", ("p",), opens="prediction")

        pb = Playback(FIXTURE, live=False, speed=8.0, now=lambda: 0.0)
        pb.load()
        pb.command("seek", mid)
        pb.command("pause")
        await shoot(CockpitApp(playback=pb), OUT / "replay.svg")

        await shoot_gpus(GPU_FIXTURE, OUT / "run-2xh200.svg", Path(tmp))

        small = (80, 24)
        for moment, name in (("load", "run-load"), ("eval", "run-eval"), ("stopped", "run-stopped")):
            synthetic = make_run(Path(tmp) / moment, moment)
            app = make_app(synthetic.root, live=True, now=lambda s=synthetic: s.now + 0.5)
            await shoot(app, OUT / f"{name}-80x24.svg", size=small)
        reported = make_run(Path(tmp) / "reported", "report")
        app = make_app(reported.root, live=True, now=lambda: reported.now + 0.5)
        await shoot(app, OUT / "report-micro-80x24.svg", ("r", "m"), size=small)

        await shoot_walk(Path(tmp) / "walk")

        big = Path(tmp) / "20260101-000000-qwen3-235b-4xh100-0000"
        generate(big, steps=100_000, ranks=4, gpus=4, samples=100_000)
        await shoot(make_app(big, live=True), OUT / "run-4gpu-26h.svg")
        shutil.rmtree(big, ignore_errors=True)


async def shoot_walk(tmp: Path) -> None:
    """The walk's scenes at 80x24, as the snapshot tests build them."""
    for scene in SCENES:
        app, before = build(scene, tmp / scene)
        async with app.run_test(size=SMALL) as pilot:
            await before(pilot)
            await pilot.pause()
            app.save_screenshot(f"{scene}.svg", str(OUT))
        print(f"wrote {shown(OUT / f'{scene}.svg')}")


async def walk() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        await shoot_walk(Path(tmp))


async def shoot_compare() -> None:
    app = make_compare_app(LR_RUNS)
    async with app.run_test(size=SIZE) as pilot:
        deadline = time.monotonic() + 120
        while app.comparison is None or not all(c.data for c in app.screen.query("CompareChart")):
            if time.monotonic() > deadline:
                raise TimeoutError("compare.svg")
            await pilot.pause(0.05)
        await pilot.pause()
        app.save_screenshot("compare.svg", str(OUT))
    print(f"wrote {shown(OUT / 'compare.svg')}")


async def shoot_record(record: Path, out: Path) -> None:
    """`run-2xh200.svg`'s picture of `record`, written to `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        await shoot_gpus(record, out, Path(tmp))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("names", nargs="*", help="pictures to write (default: all; `compare`: compare.svg)")
    parser.add_argument("--record", type=Path, help="run-2xh200.svg: from this run record, not the fixture")
    parser.add_argument("--out", type=Path, help="with --record: write the picture here")
    args = parser.parse_args()
    names = set(args.names)
    if args.record is not None:
        if names - {"run-2xh200.svg"}:
            parser.error("--record makes run-2xh200.svg only")
        asyncio.run(shoot_record(args.record, args.out or OUT / "run-2xh200.svg"))
    elif names == {"compare"}:
        asyncio.run(shoot_compare())
    elif names == {"walk"}:
        asyncio.run(walk())
    elif names:
        asyncio.run(main(names))
    else:
        asyncio.run(main(set()))
        asyncio.run(shoot_compare())
