"""The second load against the first: the NF4 cache (`trainer/weights/nf4_cache.py`) on a checkpoint read
from disk.

An N-layer slice of a profile's architecture gets random weights (`trainer.weights.random_weights`, drawn on
the GPU where there is one) written as a real checkpoint: bf16 safetensors shards of --shard-gib with the
hub's index and per-expert tensors (`mlp.experts.<e>.gate_proj.weight`, as the story's checkpoint has
them). Then two loads, each a process of its own (its own RSS high-water mark and I/O counters), each
after the checkpoint's and the cache's files are dropped from the page cache (fsync, then
`posix_fadvise(DONTNEED)`), so what they read comes from the disk:

  first    the checkpoint read and quantized, the cache written ($COCKPIT_CACHE under --dir)
  cached   the cache read

A load is the trainer's layer-by-layer loader (`trainer.weights.loader.load_layerwise`) on one device without
ZeRO, then LoRA attached as a run attaches it (`trainer.model.attach_lora`) and --steps AdamW steps on
one fixed batch. Per load: seconds, bytes read from disk (`/proc/self/io` read_bytes), the host RSS peak
(VmHWM), the GPU peak (`torch.cuda.max_memory_allocated`), what the cache did (the load's facts), and
the losses of the steps, the same either way.

    python benchmarks/load_cache.py --profile tiny-cpu --layers 2            # the CPU, seconds
    python benchmarks/load_cache.py --layers 8 --dir /big/disk --out $OUT    # the story's, on a GPU

The story's layer is about 5 GB in bf16 and its cache about 1.3 GB: the script says before writing
anything whether the checkpoint and the cache fit on --dir's disk (and how many layers would). Writes
load_cache_<host>.md and .json under --out (default benchmarks/results) and prints the table;
--dir's files are removed at the end unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STORY = "qwen3-235b-a22b-thinking-4xh100"
GiB = 2**30
CACHE_RATIO = 0.3  # the cache's bytes against a bf16 checkpoint's, at most (NF4 and its scales: ~0.27)
ROOM_BYTES = 2 * GiB  # left free on --dir's disk, and the cache's write margin in this benchmark
BATCH_ROWS, BATCH_TOKENS = 2, 256


def profile_of(name: str, sets: list[str]) -> Any:
    from cockpit.profiles import load_profile

    return load_profile(name, sets)[0]


def config_dir(profile: Any) -> Path:
    """Where the profile's config.json is: the built-in tiny model's, `model.path`, else `model.config`'s."""
    from cockpit.profiles import BUILTIN_PREFIX

    if profile.model.path.startswith(BUILTIN_PREFIX):
        from trainer.inputs import tiny

        return tiny.model_path(0)
    if (Path(profile.model.path) / "config.json").is_file() or not profile.model.config:
        return Path(profile.model.path)
    return Path(profile.model.config).parent


def meta_model(profile: Any, layers: int) -> tuple[Any, Any]:
    """The sliced config and its model on the meta device."""
    import torch
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from trainer.weights.random_weights import sliced_config

    config = sliced_config(AutoConfig.from_pretrained(config_dir(profile)), layers)
    with torch.device("meta"):
        model = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)](config)
    return config, model


def hub_tensors(name: str, shape: tuple[int, ...], draw: Any) -> Any:
    """(name, tensor) as the hub stores it: a fused experts weight as per-expert Linear weights."""
    prefix, _, which = name.rpartition(".")
    if prefix.endswith(".experts") and which in ("gate_up_proj", "down_proj"):
        for e in range(shape[0]):
            row = draw(name, e)
            if which == "down_proj":
                yield f"{prefix}.{e}.down_proj.weight", row
            else:
                half = row.shape[0] // 2
                yield f"{prefix}.{e}.gate_proj.weight", row[:half]
                yield f"{prefix}.{e}.up_proj.weight", row[half:]
    else:
        yield name, draw(name, None)


def evict(paths: list[Path]) -> None:
    """Drop the files' pages from the page cache (written back first): the next read is from the disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def write_checkpoint(profile: Any, layers: int, folder: Path, shard_bytes: int) -> int:
    """The slice with random bf16 weights as hub-style safetensors shards and index; its bytes."""
    import torch
    from safetensors.torch import save_file

    from trainer.weights.random_weights import RandomWeights

    config, model = meta_model(profile, layers)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    weights = RandomWeights(model, device, torch.bfloat16)

    def draw(name: str, row: int | None) -> torch.Tensor:
        return (weights.get(name) if row is None else weights.get_row(name, row)).cpu()

    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    weight_map: dict[str, str] = {}
    shard: dict[str, torch.Tensor] = {}
    files: list[Path] = []

    def flush() -> None:
        path = folder / f"model-{len(files) + 1:05d}.safetensors"
        save_file(shard, str(path), metadata={"format": "pt"})
        evict([path])
        files.append(path)
        weight_map.update(dict.fromkeys(shard, path.name))
        shard.clear()

    total = held = 0
    for name, shape in weights.shapes.items():
        for key, tensor in hub_tensors(name, shape, draw):
            shard[key] = tensor.contiguous()
            total, held = total + tensor.nbytes, held + tensor.nbytes
            if held >= shard_bytes:
                flush()
                held = 0
    if shard:
        flush()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    return total


def slice_bytes(profile: Any, layers: int) -> int:
    """The bf16 bytes of the slice's checkpoint."""
    _, model = meta_model(profile, layers)
    return 2 * sum(p.numel() for p in model.parameters())


def room(profile: Any, layers: int, free: int) -> tuple[int, int, int]:
    """What the slice's checkpoint and cache need on the disk (bytes, with `ROOM_BYTES` left free), the
    checkpoint's bytes, and how many layers `free` bytes would hold."""
    one, two = slice_bytes(profile, 1), slice_bytes(profile, 2)
    # the rest (embeddings, norm, head) is not quantized: its cache as large as its bf16 checkpoint (fp32: 2x)
    twice = 3 if profile.quantization.compute_dtype == "float32" else 2
    layer, rest = (two - one) * (1 + CACHE_RATIO), (2 * one - two) * twice + ROOM_BYTES
    checkpoint = slice_bytes(profile, layers)
    return int(rest + layers * layer), checkpoint, max(0, int((free - rest) // layer))


# --- one load, in a process of its own ----------------------------------------------------------------
def proc_io() -> int | None:
    try:
        text = Path("/proc/self/io").read_text()
    except OSError:
        return None
    return next(int(line.split()[1]) for line in text.splitlines() if line.startswith("read_bytes"))


def vm_hwm_bytes() -> int | None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None


def child(args: argparse.Namespace) -> int:
    """Load the checkpoint at --child-dir, then the steps; write the figures to --result."""
    import torch

    from trainer.model import attach_lora
    from trainer.weights import nf4_cache
    from trainer.weights.loader import load_layerwise

    nf4_cache.MARGIN_BYTES = ROOM_BYTES  # the benchmark's disk is small: leave less than a run would
    profile = profile_of(args.profile, args.sets)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    import bitsandbytes  # noqa: F401  (imports and the model's classes before the clock starts)
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(args.child_dir))]
    if cuda:
        torch.zeros(1, device=device)  # the CUDA context too
    read0, t0 = proc_io(), time.perf_counter()
    base, facts = load_layerwise(profile, args.child_dir, device, None)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    read = None if read0 is None else proc_io() - read0
    rss_peak = vm_hwm_bytes()
    gpu_peak = torch.cuda.max_memory_allocated(device) if cuda else None
    base.config.use_cache = False
    model = attach_lora(profile, base)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=profile.training.learning_rate)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, base.config.vocab_size, (BATCH_ROWS, BATCH_TOKENS), generator=generator).to(device)
    losses = []
    for _ in range(args.steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    cache = facts.get("nf4_cache") or {}
    result = {
        "seconds": round(seconds, 3),
        "read_bytes": read,
        "rss_peak_bytes": rss_peak,
        "gpu_peak_bytes": gpu_peak,
        "weights": facts["weights"],
        "checkpoint_tensors_read": facts["checkpoint_tensors_read"],
        "units_read": cache.get("units_read"),
        "units_written": cache.get("units_written"),
        "cache_bytes_read": cache.get("bytes_read"),
        "cache_bytes_written": cache.get("bytes_written"),
        "refused": cache.get("refused", []),
        "not_written": cache.get("not_written", ""),
        "losses": losses,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
    }
    Path(args.result).write_text(json.dumps(result, indent=1))
    return 0


def run_child(
    args: argparse.Namespace, model_dir: Path, cache: Path, label: str, work: Path
) -> dict[str, Any]:
    result = work / f"{label}.json"
    argv = [sys.executable, __file__, "--profile", args.profile, "--steps", str(args.steps)]
    argv += [f"--set={s}" for s in args.sets]
    argv += ["--child-dir", str(model_dir), "--result", str(result)]
    from cockpit.service.spawn import child_env

    env = child_env()  # the parent's environment passed through (its PYTHONPATH too), the repository first
    env.update(
        COCKPIT_CACHE=str(cache), PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    )
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0 or not result.is_file():
        raise SystemExit(f"{label} load: exit {done.returncode}\n{(done.stdout + done.stderr)[-4000:]}")
    return json.loads(result.read_text())


# --- the whole benchmark --------------------------------------------------------------------------------
def host_name(device: str) -> str:
    if device == "cpu":
        return "cpu"
    return "h200" if "H200" in device else "".join(c for c in device.lower() if c.isalnum())


def table(rows: dict[str, dict[str, Any]]) -> str:
    from cockpit.units import size

    def num(value: Any) -> str:
        return "-" if value is None else size(value)

    lines = [
        "| load | s | read from disk | host RSS peak | GPU peak | weights | units from cache | losses |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, r in rows.items():
        losses = ", ".join(f"{x:.6f}" for x in r["losses"])
        lines.append(
            f"| {label} | {r['seconds']:.3f} | {num(r['read_bytes'])} | {num(r['rss_peak_bytes'])} | "
            f"{num(r['gpu_peak_bytes'])} | {r['weights']} | {r['units_read']} | {losses} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", default=STORY, help=f"profile name or TOML path (default {STORY})")
    parser.add_argument("--layers", type=int, default=8, help="decoder layers of the slice (default 8)")
    parser.add_argument("--dir", help="where the checkpoint and the cache go (default: a temporary folder)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="results folder")
    parser.add_argument("--steps", type=int, default=3, help="training steps after each load (default 3)")
    parser.add_argument("--shard-gib", type=float, default=4.0, help="checkpoint shard size (default 4)")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint and the cache")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a load may take")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="K=V")
    parser.add_argument("--child-dir", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_dir:
        return child(args)
    from cockpit.units import size

    profile = profile_of(args.profile, args.sets)
    work = Path(args.dir or tempfile.mkdtemp(prefix="load-cache-"))
    work.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(work).free
    need, checkpoint, fits = room(profile, args.layers, free)
    print(
        f"{args.layers} layers: a checkpoint of {size(checkpoint)} and its cache need about {size(need)} on "
        f"{work}'s disk, {size(free)} free (room for {fits} layers)",
        file=sys.stderr,
    )
    if free < need:
        print(f"not enough room: try --layers {fits} or another --dir", file=sys.stderr)
        return 2
    model_dir, cache = work / "checkpoint", work / "cache"
    try:
        t0 = time.perf_counter()
        written = write_checkpoint(profile, args.layers, model_dir, int(args.shard_gib * GiB))
        print(f"checkpoint written: {size(written)} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        rows: dict[str, dict[str, Any]] = {}
        for label in ("first: checkpoint, quantize, cache written", "second: the cache"):
            evict([p for p in [*model_dir.rglob("*"), *cache.rglob("*")] if p.is_file()])
            rows[label] = run_child(args, model_dir, cache, label.split(":")[0], work)
            print(f"{label}: {rows[label]['seconds']:.1f} s", file=sys.stderr)
    finally:
        if not args.keep:
            for folder in (model_dir, cache) if args.dir else (work,):
                shutil.rmtree(folder, ignore_errors=True)
    first, second = rows.values()
    device = first["device"]
    result = {
        "profile": profile.name,
        "layers": args.layers,
        "device": device,
        "checkpoint_bytes": written,
        "shard_bytes": int(args.shard_gib * GiB),
        "steps": args.steps,
        "speedup": round(first["seconds"] / second["seconds"], 1) if second["seconds"] else None,
        "same_losses": first["losses"] == second["losses"],
        "same_first_loss": first["losses"][:1] == second["losses"][:1],
        "max_loss_difference": max(
            abs(a - b) for a, b in zip(first["losses"], second["losses"], strict=True)
        ),
        "rows": [{"load": label, **r} for label, r in rows.items()],
    }
    text = table(rows)
    differ = f"not the same (at most {result['max_loss_difference']:.2e} apart, the first "
    differ += "equal)." if result["same_first_loss"] else "NOT equal)."
    verdict = (
        f"The second load took {second['seconds']:.3f} s against {first['seconds']:.3f} s "
        f"({result['speedup']}x); it read {second['cache_bytes_read']:,} bytes of cache against a "
        f"{written:,}-byte checkpoint; the losses of the {args.steps} steps are "
        + ("the same." if result["same_losses"] else differ)
    )
    md = (
        f"# The NF4 cache: a second load against the first\n\n{profile.name}, its architecture sliced "
        f"to {args.layers} layers, random bf16 weights written as a hub-style checkpoint ({size(written)}, "
        f"shards of {args.shard_gib:g} GiB) on {device}; each load a process of its own, after the files "
        f"were dropped from the page cache. `python benchmarks/load_cache.py --profile {args.profile} "
        f"--layers {args.layers}`.\n\n{text}\n\n{verdict}\n"
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"load_cache_{host_name(device)}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    stem.with_suffix(".md").write_text(md)
    print(text)
    print(verdict)
    return 0 if result["same_first_loss"] else 1  # later steps may differ by GPU atomics, the first never


if __name__ == "__main__":
    sys.exit(main())
