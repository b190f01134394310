"""Predicted against measured: the plan (`cockpit.plan`) next to what the real trainer uses.

Random-init slices of a real geometry (the story's Qwen3-235B-A22B on a GPU; a small Qwen3-MoE on the
CPU) at several depths are written once as a Hub-layout checkpoint (per-expert tensors, bf16), then
each case runs the cockpit trainer itself, exactly as `cockpit run` launches it (a run record, the
DeepSpeed launcher, `python -m trainer`), for a few steps. Measured figures come from that record:

- load-phase peak GPU allocation and RSS: the trainer's `load_peak` event (written once the DeepSpeed
  engine is built; `torch.cuda.max_memory_allocated` and `ru_maxrss` since the process started);
- training-phase peak GPU allocation: the last `step` event (its peak counter is reset after load);
- training-phase RSS: the largest `rss_mib` of the `step` events.

Predicted figures are the `plan.json` that `cockpit run` writes into the same run directory.

    python benchmarks/plan_vs_measured.py                 # GPU if NVML sees one, else the CPU
    python benchmarks/plan_vs_measured.py --device cpu    # the small CPU slice (a few minutes)
    python benchmarks/plan_vs_measured.py --device cuda --quantize-experts on --depths 1,4   # NF4, layerwise
    python benchmarks/plan_vs_measured.py --loader transformers --quantize-experts off      # the old path

`--loader` sets `model.loader` in every case's profile (default: layerwise, the trainer's default).

Writes plan_vs_measured.md and .json under $OUT (else the work directory). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STORY_CONFIG = ROOT / "profiles/models/qwen3-235b-a22b-thinking-2507/config.json"
# A small Qwen3-MoE for CPU runs: the same shape of model, a few hundred MB.
CPU_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 1024,
    "moe_intermediate_size": 256,
    "num_experts": 32,
    "num_experts_per_tok": 4,
    "vocab_size": 16384,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "norm_topk_prob": True,
    "torch_dtype": "bfloat16",
}
MIB = 1024**2
GIB = 1024**3
TOLERANCE = 0.15
METRICS = (
    ("gpu_load", "GPU load"),
    ("gpu_train", "GPU train"),
    ("rss_load", "RSS load"),
    ("rss_train", "RSS train"),
)


# --- the slice: weights, tokenizer, data ----------------------------------------------------------
def build_slice(out: Path, config: dict[str, Any], layers: int, device: str) -> None:
    """Random-init weights of the first `layers` layers saved like a Hub checkpoint, and a tokenizer.

    Runs in its own process so the benchmark's parent never holds GPU memory.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from cockpit.data.builtin import build_tokenizer

    cfg = AutoConfig.for_model(**{**config, "num_hidden_layers": layers})
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    weights = out / "weights"
    model.save_pretrained(weights)  # Transformers 5 writes the experts back one tensor per expert
    del model
    build_tokenizer(out / "tokenizer", seed=0, vocab_size=2048)


def slice_dir(work: Path, config: dict[str, Any], depth: int) -> Path:
    """A model directory for `depth` layers: its own config.json, links to the shared weights and tokenizer.

    Loading reads only the tensors of the first `depth` layers; the rest are unexpected keys, never read.
    """
    d = work / f"slice-{depth}"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({**config, "num_hidden_layers": depth}, indent=1))
    for src in [*sorted((work / "weights").glob("*.safetensors*")), *sorted((work / "tokenizer").iterdir())]:
        (d / src.name).symlink_to(src.resolve())
    return d


def write_data(path: Path, seq_len: int, count: int = 16) -> None:
    """Examples whose prompts are longer than seq_len: every sample is exactly seq_len tokens."""
    rng = random.Random(0)
    syllables = ("ka", "lo", "mi", "ren", "tas", "vo", "qui", "bel", "dor", "fen", "gal", "hur")
    with open(path, "w", encoding="utf-8") as f:
        for i in range(count):
            words = " ".join("".join(rng.choice(syllables) for _ in range(3)) for _ in range(2 * seq_len))
            f.write(
                json.dumps(
                    {
                        "tenant": "bench",
                        "id": f"b{i}",
                        "split": "train",
                        "system": "Classify the marked entity.",
                        "user": words,
                        "labels": ["A", "B"],
                        "gold": "A",
                        "reasoning": "The cue points to A.",
                    }
                )
                + "\n"
            )


# --- one case ------------------------------------------------------------------------------------
@dataclass
class Case:
    depth: int
    offload_param: str
    experts_4bit: bool
    loader: str = "layerwise"
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        offload = "offload" if self.offload_param != "none" else "nooffload"
        loader = "lw" if self.loader == "layerwise" else "tf"
        return f"d{self.depth}-{offload}-{'e4' if self.experts_4bit else 'e16'}-{loader}"


def profile_for(case: Case, model: Path, data: Path, gpu: bool, seq_len: int, steps: int) -> dict[str, Any]:
    dtype = "bfloat16" if gpu else "float32"
    return {
        "name": f"bench-{case.name}",
        "description": "plan_vs_measured benchmark slice",
        "model": {
            "path": str(model),
            "config": str(model / "config.json"),
            "name": model.name,
            "loader": case.loader,
        },
        "hardware": {"gpus": 1 if gpu else 0},
        "quantization": {
            "load_in_4bit": True,
            "quant_type": "nf4",
            "double_quant": True,
            "compute_dtype": dtype,
            "storage_dtype": dtype,
            "quantize_experts": case.experts_4bit,
        },
        "lora": {
            "r": 16,
            "alpha": 32,
            "dropout": 0.0,
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
        },
        "deepspeed": {"stage": 3, "offload_param": case.offload_param, "offload_optimizer": "cpu"},
        "training": {
            "seq_len": seq_len,
            "micro_batch_size": 1,
            "grad_accum": 1,
            "max_steps": steps,
            "learning_rate": 1e-4,
            "warmup_ratio": 0.0,
            "lr_scheduler": "constant",
            "gradient_checkpointing": True,
            "bf16": gpu,
            "save_steps": 0,
            "stall_timeout_s": 600,
        },
        "data": {"source": str(data)},
        "eval": {"enabled": False},
    }


def measured_from(run_dir: Path) -> dict[str, Any]:
    from cockpit.record import read_events

    events = read_events(run_dir)
    load = next((e for e in events if e["kind"] == "load_peak" and e.get("rank", 0) == 0), None)
    steps = [e for e in events if e["kind"] == "step" and e.get("rank", 0) == 0]
    audit = next((e for e in events if e["kind"] == "audit" and e.get("rank", 0) == 0), None)
    if load is None or not steps:
        return {}
    out: dict[str, Any] = {
        "rss_load": load["rss_peak_mib"] * MIB,
        "rss_train": max(e["rss_mib"] for e in steps) * MIB,
        "steps": len(steps),
    }
    if "cuda_peak_alloc_mib" in load:
        out["gpu_load"] = load["cuda_peak_alloc_mib"] * MIB
        out["gpu_train"] = max(e["cuda_peak_alloc_mib"] for e in steps) * MIB
        out["gpu_train_reserved"] = max(e["cuda_peak_reserved_mib"] for e in steps) * MIB
    times = [e["step_time_s"] for e in steps[1:] if e.get("step_time_s")]
    if times:
        out["step_s"] = statistics.median(times)
    if audit:
        experts = audit["groups"].get("experts", {})
        out["experts_4bit_fraction"] = (
            experts.get("params_4bit", 0) / experts["params"] if experts.get("params") else None
        )
        out["audit_warnings"] = audit.get("warnings", [])
    return out


def predicted_from(run_dir: Path) -> dict[str, Any]:
    from cockpit.plan.store import load_plan

    plan = load_plan(run_dir)
    if plan is None:
        return {}
    c = plan["configured"]
    return {
        "gpu_load": c["load"]["gpu_peak"] if c["setup"]["gpus"] else None,
        "gpu_train": c["train"]["gpu_peak"] if c["setup"]["gpus"] else None,
        "rss_load": c["load"]["rss_peak"],
        "rss_train": c["train"]["rss_peak"],
        "step_s": c["step_s"],
        "terms": {
            "load_gpu": c["load"]["gpu_terms"],
            "train_gpu": c["train"]["gpu_terms"],
            "load_rss": c["load"]["rss_terms"],
            "train_rss": c["train"]["rss_terms"],
        },
    }


def run_case(
    case: Case, model: Path, data: Path, runs: Path, gpu: bool, seq_len: int, steps: int, timeout: float
) -> None:
    from cockpit.profiles import parse_profile
    from cockpit.service.runs import create_run
    from cockpit.service.spawn import child_env, free_port, trainer_argv

    profile = parse_profile(profile_for(case, model, data, gpu, seq_len, steps), case.name)
    run_dir = create_run(runs, profile, Path(__file__), [sys.executable, *sys.argv])
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    argv = trainer_argv(profile, run_dir, False, free_port())
    t0 = time.time()
    with open(run_dir / "output.log", "wb") as log:
        try:
            rc = subprocess.run(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    case.result = {
        "case": case.name,
        "depth": case.depth,
        "offload_param": case.offload_param,
        "experts_4bit_requested": case.experts_4bit,
        "loader": case.loader,
        "returncode": rc,
        "wall_s": round(time.time() - t0, 1),
        "run_dir": str(run_dir),
        "predicted": predicted_from(run_dir),
        "measured": measured_from(run_dir),
    }
    if not case.result["measured"]:
        tail = (run_dir / "output.log").read_text(errors="replace")[-3000:]
        case.result["error_tail"] = tail
    status = "ok" if case.result["measured"] else f"FAILED (rc {rc})"
    print(f"  {case.name}: {status} in {case.result['wall_s']} s", flush=True)


# --- the table -----------------------------------------------------------------------------------
def _cell(pred: float | None, meas: float | None) -> tuple[str, float | None]:
    if pred is None or meas is None:
        return "-", None
    err = (pred - meas) / meas if meas else None
    flag = "" if err is None or abs(err) <= TOLERANCE else " !"
    return f"{pred / GIB:.2f} / {meas / GIB:.2f} ({err:+.0%}){flag}", err


def table(cases: list[Case], device: str) -> tuple[str, dict[str, Any]]:
    lines = [
        f"Predicted / measured (GiB, error against measured; `!` beyond {TOLERANCE:.0%}), device: {device}",
        "",
        "| depth | loader | param offload | experts asked (in 4 bit) "
        "| GPU load | GPU train | RSS load | RSS train | step s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    errors: list[float] = []
    for c in cases:
        r = c.result
        pred, meas = r.get("predicted", {}), r.get("measured", {})
        frac = meas.get("experts_4bit_fraction")
        experts = (
            f"{'4 bit' if c.experts_4bit else '16 bit'} ({frac:.0%})"
            if frac is not None
            else ("4 bit" if c.experts_4bit else "16 bit")
        )
        if not meas:
            lines.append(
                f"| {c.depth} | {c.loader} | {c.offload_param} | {experts} "
                f"| failed: see {r.get('run_dir')}/output.log | | | | |"
            )
            continue
        cells = []
        for key, _label in METRICS:
            text, err = _cell(pred.get(key), meas.get(key))
            cells.append(text)
            if err is not None:
                errors.append(err)
        step = (
            f"{pred['step_s']:.2f} / {meas['step_s']:.2f}"
            if pred.get("step_s") and meas.get("step_s")
            else "-"
        )
        lines.append(
            f"| {c.depth} | {c.loader} | {c.offload_param} | {experts} | "
            + " | ".join(cells)
            + f" | {step} |"
        )
    within = sum(abs(e) <= TOLERANCE for e in errors)
    lines += ["", f"{within} of {len(errors)} figures within {TOLERANCE:.0%}."]
    # What one process costs before any weight: measured training RSS minus the plan's other terms.
    implied = [
        c.result["measured"]["rss_train"]
        - (c.result["predicted"]["rss_train"] - c.result["predicted"]["terms"]["train_rss"]["process"])
        for c in cases
        if c.result.get("measured") and c.result.get("predicted")
    ]
    if implied:
        assumed = cases[0].result["predicted"]["terms"]["train_rss"]["process"]
        lines.append(
            f"Per-process RSS before weights implied by the measurements: {min(implied) / GIB:.2f} to "
            f"{max(implied) / GIB:.2f} GiB (the plan assumes {assumed / GIB:.2f} GiB)."
        )
    summary = {"within_tolerance": within, "figures": len(errors), "tolerance": TOLERANCE}
    return "\n".join(lines), summary


def trainer_quantizes_experts() -> bool:
    """Whether the trainer acts on quantization.quantize_experts (another engineer's change)."""
    return "quantize_experts" in (ROOT / "trainer/model.py").read_text(encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument(
        "--depths", default="", help="slice depths, e.g. 1,2,4 (default: 1,2,4 on a GPU, 1,2 on the CPU)"
    )
    parser.add_argument("--seq-len", type=int, default=0, help="default: 1024 on a GPU, 256 on the CPU")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument(
        "--offload", choices=("both", "on", "off"), default="both", help="parameter offload cases"
    )
    parser.add_argument(
        "--quantize-experts",
        choices=("auto", "off", "on", "both"),
        default="auto",
        help="auto: both if the trainer implements quantization.quantize_experts, else off",
    )
    parser.add_argument(
        "--loader",
        choices=("layerwise", "transformers", "both"),
        default="layerwise",
        help="model.loader of every case (layerwise: the trainer's default; transformers: from_pretrained)",
    )
    parser.add_argument(
        "--jobs", type=int, default=0, help="cases run at once (default: 2 on a GPU, 1 on the CPU)"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    parser.add_argument("--budget-s", type=float, default=420.0, help="start no case after this many seconds")
    parser.add_argument(
        "--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "cockpit-plan-bench"
    )
    parser.add_argument("--build-slice", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, default=1, help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args()

    if args.build_slice:
        config = json.loads(Path(args.build_slice / "source-config.json").read_text())
        build_slice(args.build_slice, config, args.layers, args.device)
        return 0

    from cockpit.hostinfo import gpu_inventory

    gpu = args.device == "cuda" or (args.device == "auto" and bool(gpu_inventory()))
    device = "cuda" if gpu else "cpu"
    depths = [int(d) for d in (args.depths or ("1,2,4" if gpu else "1,2")).split(",")]
    seq_len = args.seq_len or (1024 if gpu else 256)
    jobs = args.jobs or (2 if gpu else 1)
    config = json.loads(STORY_CONFIG.read_text()) if gpu else dict(CPU_CONFIG)
    experts = {"off": [False], "on": [True], "both": [False, True]}.get(args.quantize_experts)
    if experts is None:
        experts = [False, True] if trainer_quantizes_experts() else [False]
    offloads = {"both": ["cpu", "none"], "on": ["cpu"], "off": ["none"]}[args.offload]

    work = args.work
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    t0 = time.time()
    print(f"building a {max(depths)}-layer random-init slice on {device} in {work} ...", flush=True)
    (work / "source-config.json").write_text(json.dumps(config))
    build = [
        sys.executable,
        __file__,
        "--build-slice",
        str(work),
        "--layers",
        str(max(depths)),
        "--device",
        device,
    ]
    subprocess.run(
        build,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT), os.environ.get("PYTHONPATH", "")))},
    )
    data = work / "data.jsonl"
    write_data(data, seq_len)
    models = {d: slice_dir(work, config, d) for d in depths}
    print(f"slice ready in {time.time() - t0:.0f} s; running the trainer ...", flush=True)

    loaders = ["layerwise", "transformers"] if args.loader == "both" else [args.loader]
    cases = [Case(d, o, e, ld) for ld in loaders for e in experts for d in depths for o in offloads]
    # Pair heavy with light cases when running several at once.
    by_size = sorted(cases, key=lambda c: -c.depth)
    order = (
        [c for pair in zip(by_size, reversed(by_size), strict=True) for c in pair][: len(cases)]
        if jobs > 1
        else by_size
    )
    out = Path(os.environ.get("OUT") or work)
    out.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()

    def write(done: list[Case]) -> str:
        """The table so far: rewritten after every case, so a run cut short still leaves its results."""
        text, summary = table(done, device)
        result = {"device": device, "seq_len": seq_len, "steps": args.steps, "summary": summary}
        result["cases"] = [c.result for c in done]
        (out / "plan_vs_measured.md").write_text(text + "\n", encoding="utf-8")
        (out / "plan_vs_measured.json").write_text(
            json.dumps(result, indent=1, default=str), encoding="utf-8"
        )
        return text

    def one(case: Case) -> None:
        if time.time() - t0 > args.budget_s:
            case.result = {"case": case.name, "skipped": f"over the {args.budget_s:.0f} s budget"}
            print(f"  {case.name}: skipped (budget)", flush=True)
            return
        run_case(case, models[case.depth], data, work / "runs", gpu, seq_len, args.steps, args.timeout)
        with lock:
            write([c for c in cases if c.result.get("measured") or c.result.get("error_tail")])

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, order))
    ran = [c for c in cases if "skipped" not in c.result]
    text = write(ran)
    print()
    print(text)
    for c in ran:
        if "error_tail" in c.result:
            print(
                f"\n--- {c.name}: last lines of {c.result['run_dir']}/output.log ---\n"
                f"{c.result['error_tail']}"
            )
    print(f"\nwrote {out / 'plan_vs_measured.md'} and .json in {time.time() - t0:.0f} s")
    return 0 if ran and all(c.result.get("measured") for c in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
