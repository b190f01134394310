"""Benchmark: MoE experts in bf16 (today's load path) against NF4 experts (layer-by-layer load path).

The story's geometry (Qwen3-235B-A22B: hidden 4096, 64 heads, 4 KV heads, head dim 128, 128 experts,
top-8, expert width 1536, vocab 151,936), random init, sliced to 1, 2 and 4 layers, trained a few steps
the way the trainer does it (PEFT LoRA r=16 on q/k/v/o, DeepSpeed ZeRO-3 with CPU AdamW, gradient
checkpointing, bf16, sequence 1024, micro-batch 1), with and without parameter offload. Every
configuration runs in its own process, so GPU and host peaks are its own. Per configuration:

  host RSS after load and at its peak, GPU peak during load (model built, LoRA attached, DeepSpeed
  engine built) and during training (peak statistics reset between the two), median step time.

Variants:
  bf16 : experts left in bf16, loaded by `from_pretrained` (model.loader = "transformers": today's path)
  nf4  : experts packed in NF4, loaded and partitioned one layer at a time (model.loader = "layerwise")
  bf16-layerwise (extra rows, if time allows): bf16 experts through the layer-by-layer loader

Run from the repository root:
  python benchmarks/experts4bit.py                # GPU, story geometry; writes $OUT/experts4bit.{md,json}
  python benchmarks/experts4bit.py --smoke        # CPU, tiny geometry, a minute or two
The checkpoint it generates (22 GB for 4 layers) goes to --workdir (default /tmp/experts4bit-bench).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
GIB = 1024**3

STORY = {
    "hidden_size": 4096,
    "num_attention_heads": 64,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 1536,
    "intermediate_size": 12288,
    "vocab_size": 151936,
}
SMOKE = {
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 128,
    "intermediate_size": 512,
    "vocab_size": 4096,
}


# --- the checkpoint ---------------------------------------------------------------------------------


def model_config(geometry: dict[str, int], layers: int) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        **geometry,
        "num_hidden_layers": layers,
        "max_position_embeddings": 4096,
        "rope_theta": 5000000,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "attention_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
        "use_cache": False,
    }


def make_checkpoint(out: Path, geometry: dict[str, int], layers: int) -> None:
    """Random-init bf16 weights in the original Qwen3-MoE layout (one Linear per expert), a shard a layer."""
    import torch
    from safetensors.torch import save_file

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(0)
    g = geometry
    h, heads, kv, hd, e, inter = (
        g[k]
        for k in (
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "num_experts",
            "moe_intermediate_size",
        )
    )

    def rand(*shape: int, std: float = 0.02) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=device, dtype=torch.bfloat16) * std).cpu()

    out.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    shards = layers + 1
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors = {
            p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "self_attn.q_proj.weight": rand(heads * hd, h),
            p + "self_attn.k_proj.weight": rand(kv * hd, h),
            p + "self_attn.v_proj.weight": rand(kv * hd, h),
            p + "self_attn.o_proj.weight": rand(h, heads * hd),
            p + "self_attn.q_norm.weight": torch.ones(hd, dtype=torch.bfloat16),
            p + "self_attn.k_norm.weight": torch.ones(hd, dtype=torch.bfloat16),
            p + "mlp.gate.weight": rand(e, h),
        }
        for x in range(e):
            tensors[p + f"mlp.experts.{x}.gate_proj.weight"] = rand(inter, h)
            tensors[p + f"mlp.experts.{x}.up_proj.weight"] = rand(inter, h)
            tensors[p + f"mlp.experts.{x}.down_proj.weight"] = rand(h, inter)
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
        del tensors
    rest = {
        "model.embed_tokens.weight": rand(g["vocab_size"], h, std=0.1),
        "model.norm.weight": torch.ones(h, dtype=torch.bfloat16),
        "lm_head.weight": rand(g["vocab_size"], h),
    }
    name = f"model-{shards:05d}-of-{shards:05d}.safetensors"
    save_file(rest, str(out / name), metadata={"format": "pt"})
    weight_map.update(dict.fromkeys(rest, name))
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (out / "config.json").write_text(json.dumps(model_config(geometry, layers), indent=1))


def sliced_dir(full: Path, geometry: dict[str, int], layers: int) -> Path:
    """A model directory for the first `layers` layers: the same shards, a config with fewer layers."""
    d = full.parent / f"{full.name}-L{layers}"
    d.mkdir(exist_ok=True)
    for f in full.iterdir():
        if f.name != "config.json" and not (d / f.name).exists():
            (d / f.name).symlink_to(f)
    (d / "config.json").write_text(json.dumps(model_config(geometry, layers), indent=1))
    return d


# --- one configuration (child process) --------------------------------------------------------------


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    import psutil
    import torch
    from transformers import Trainer, TrainerCallback

    from cockpit.profiles import parse_profile
    from trainer.arguments import training_arguments
    from trainer.model import attach_lora, load_base, parameter_census

    cuda = torch.cuda.is_available()
    proc = psutil.Process()

    def rss() -> float:
        return proc.memory_info().rss / GIB

    def rss_anon() -> float:
        """Anonymous resident memory: what the process owns, without mapped checkpoint pages."""
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024 / GIB
        except OSError:
            pass
        return float("nan")

    def peak_rss() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2

    def gpu_peak() -> float:
        return torch.cuda.max_memory_allocated() / GIB if cuda else 0.0

    variant = spec["variant"]
    profile = parse_profile(
        {
            "name": "experts4bit-bench",
            "model": {
                "path": spec["model_dir"],
                "loader": "transformers" if variant == "bf16" else "layerwise",
            },
            "hardware": {"gpus": 1 if cuda else 0},
            "quantization": {
                "load_in_4bit": True,
                "quant_type": "nf4",
                "double_quant": True,
                "compute_dtype": "bfloat16" if cuda else "float32",
                "storage_dtype": "bfloat16" if cuda else "float32",
                "quantize_experts": variant == "nf4",
            },
            "lora": {
                "r": 16,
                "alpha": 32,
                "dropout": 0.05,
                "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
            },
            "deepspeed": {"stage": 3, "offload_param": spec["offload"], "offload_optimizer": "cpu"},
            "training": {
                "seq_len": spec["seq"],
                "micro_batch_size": 1,
                "grad_accum": 1,
                "learning_rate": 1e-4,
                "warmup_ratio": 0.0,
                "lr_scheduler": "constant",
                "max_steps": spec["steps"],
                "gradient_checkpointing": True,
                "bf16": cuda,
                "save_steps": 0,
            },
            "data": {"source": "builtin:tiny-tenants"},
        },
        "benchmark",
    )
    out_dir = Path(spec["scratch"])
    args = training_arguments(profile, out_dir, out_dir.name)  # the trainer's own (registers DeepSpeed's)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    rss_start = rss()
    t0 = time.perf_counter()
    base = load_base(profile, spec["model_dir"])
    facts = dict(getattr(base, "cockpit_load_facts", {}))
    model = attach_lora(profile, base)
    load_s = time.perf_counter() - t0
    census = parameter_census(model)
    rss_loaded, anon_loaded = rss(), rss_anon()
    expert_bytes = sum(
        p.ds_numel * p.element_size() if hasattr(p, "ds_numel") else p.numel() * p.element_size()
        for n, p in model.named_parameters()
        if ".experts." in n and "lora_" not in n
    )

    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    data = []
    for _ in range(spec["steps"]):
        ids = torch.randint(0, vocab, (spec["seq"],), generator=gen)
        data.append({"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)})

    result: dict[str, Any] = {}

    class Probe(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.cpu_times: list[float] = []
            self.losses: list[float] = []
            self.t = self.c = 0.0

        def on_train_begin(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
            # The DeepSpeed engine exists now: everything so far is the load phase.
            result["gpu_peak_load_gib"] = gpu_peak()
            result["rss_after_engine_gib"] = rss()
            result["rss_anon_after_engine_gib"] = rss_anon()
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()

        def on_step_begin(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
            if cuda:
                torch.cuda.synchronize()
            self.t, self.c = time.perf_counter(), time.process_time()

        def on_step_end(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
            if cuda:
                torch.cuda.synchronize()
            self.times.append(time.perf_counter() - self.t)
            self.cpu_times.append(time.process_time() - self.c)

        def on_log(self, a: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                self.losses.append(float(logs["loss"]))

    probe = Probe()
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[probe])
    t1 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t1
    timed = probe.times[1:] or probe.times  # the first step warms up
    median = statistics.median(timed)
    n4 = sum(g["params_4bit"] for g in census.values())
    total = sum(g["params"] for k, g in census.items() if k != "lora")
    result.update(
        {
            "load_s": round(load_s, 1),
            "train_s": round(train_s, 1),
            "rss_start_gib": rss_start,
            "rss_after_load_gib": rss_loaded,
            "rss_anon_after_load_gib": anon_loaded,
            "rss_peak_gib": peak_rss(),
            "gpu_peak_train_gib": gpu_peak(),
            "median_step_s": median,
            "step_times_s": [round(t, 4) for t in probe.times],
            "median_step_cpu_s": statistics.median(probe.cpu_times[1:] or probe.cpu_times),
            "tokens_per_s": spec["seq"] / median if median else 0.0,
            "losses": probe.losses,
            "expert_bytes_per_layer_gib": expert_bytes / spec["layers"] / GIB,
            "params_total": total,
            "fraction_4bit": n4 / total if total else 0.0,
            "load_facts": {k: v for k, v in facts.items() if k != "unused_examples"},
        }
    )
    return result


# --- the driver -------------------------------------------------------------------------------------


def child_env(smoke: bool) -> dict[str, str]:
    env = dict(os.environ)
    if smoke:  # one thread: CPU step times that shared, busy machines do not scramble
        env["OMP_NUM_THREADS"] = "1"
    from cockpit.service.spawn import single_rank_env

    env.update(single_rank_env())
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    return env


def run_config(spec: dict[str, Any], timeout: float, smoke: bool) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=child_env(smoke), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stdout or b"")[-1500:] if isinstance(exc.stdout, bytes) else (exc.stdout or "")[-1500:]
        return {"status": f"timeout after {timeout:.0f} s", "wall_s": timeout, "log_tail": str(tail)}
    wall = time.perf_counter() - t0
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            return {"status": "ok", "wall_s": round(wall, 1), **json.loads(line[len("RESULT ") :])}
    tail = (done.stdout + done.stderr)[-3000:]
    return {"status": f"failed (exit {done.returncode})", "wall_s": round(wall, 1), "log_tail": tail}


def fmt(x: Any, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) else "-"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| layers | experts | param offload | loader | host RSS after load GiB | RSS anon after engine GiB | "
        "host RSS peak GiB | "
        "GPU peak load GiB | GPU peak train GiB | median step s | step CPU s | tokens/s | expert GiB/layer | "
        "4-bit % | "
        "loss first→last | load s | status |"
    )
    lines = [head, "|" + "|".join(["---"] * 17) + "|"]
    for r in rows:
        losses = r.get("losses") or []
        loss = f"{losses[0]:.3f}→{losses[-1]:.3f}" if losses else "-"
        lines.append(
            "| "
            + " | ".join(
                [
                    str(r["layers"]),
                    r["variant"],
                    r["offload"],
                    (r.get("load_facts") or {}).get("loader", "-"),
                    fmt(r.get("rss_after_load_gib")),
                    fmt(r.get("rss_anon_after_engine_gib")),
                    fmt(r.get("rss_peak_gib")),
                    fmt(r.get("gpu_peak_load_gib")),
                    fmt(r.get("gpu_peak_train_gib")),
                    fmt(r.get("median_step_s"), 3),
                    fmt(r.get("median_step_cpu_s"), 3),
                    fmt(r.get("tokens_per_s"), 0),
                    fmt(r.get("expert_bytes_per_layer_gib"), 3),
                    fmt(100 * r["fraction_4bit"], 1) if "fraction_4bit" in r else "-",
                    loss,
                    fmt(r.get("load_s"), 1),
                    r["status"],
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def slopes(rows: list[dict[str, Any]]) -> str:
    """Per-layer growth between the shallowest and deepest slice, per variant and offload setting."""
    out = ["", "Per added layer (deepest minus shallowest slice, divided by the layers added):", ""]
    out.append(
        "| experts | param offload | host RSS after load GiB/layer | RSS anon after engine GiB/layer | "
        "GPU peak load GiB/layer | GPU peak train GiB/layer | step s/layer |"
    )
    out.append("|---|---|---|---|---|---|---|")
    keys = sorted({(r["variant"], r["offload"]) for r in rows})
    for variant, offload in keys:
        ok = sorted(
            (r for r in rows if (r["variant"], r["offload"]) == (variant, offload) and r["status"] == "ok"),
            key=lambda r: r["layers"],
        )
        if len(ok) < 2:
            continue
        a, b = ok[0], ok[-1]
        n = b["layers"] - a["layers"]

        def d(key: str, a: dict = a, b: dict = b, n: int = n) -> str:
            return fmt((b[key] - a[key]) / n, 3)

        out.append(
            f"| {variant} | {offload} | {d('rss_after_load_gib')} | {d('rss_anon_after_engine_gib')} | "
            f"{d('gpu_peak_load_gib')} | "
            f"{d('gpu_peak_train_gib')} | {d('median_step_s')} |"
        )
    return "\n".join(out)


def merge_rows(earlier: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Earlier rows, each replaced by this run's measurement of the same configuration where it has one."""

    def key(row: dict[str, Any]) -> tuple[Any, ...]:
        return (row["layers"], row["variant"], row["offload"])

    fresh = {key(r): r for r in new}
    earlier_keys = {key(r) for r in earlier}

    def pick(old: dict[str, Any]) -> dict[str, Any]:
        row = fresh.get(key(old))
        if row is not None and (row.get("status") == "ok" or old.get("status") != "ok"):
            return row
        return old

    return [pick(r) for r in earlier] + [r for r in new if key(r) not in earlier_keys]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny geometry, CPU-sized: checks the script runs"
    )
    parser.add_argument("--layers", default="1,4,2", help="depths, in the order they run (default 1,4,2)")
    parser.add_argument("--variants", default="bf16,nf4", help="bf16 (today's path), nf4, bf16-layerwise")
    parser.add_argument("--offload", default="cpu,none", help="parameter offload settings: cpu, none")
    parser.add_argument(
        "--steps", type=int, default=4, help="optimizer steps a configuration (first is warm-up)"
    )
    parser.add_argument("--seq", type=int, default=None, help="sequence length (default 1024; smoke 128)")
    parser.add_argument("--budget-s", type=float, default=450, help="stop starting configurations after this")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "experts4bit-bench"))
    parser.add_argument(
        "--extra", action="store_true", help="add bf16-layerwise rows at the end if time allows"
    )
    parser.add_argument(
        "--merge",
        help="an earlier run's experts4bit.json: its measured rows stay in the table unless re-measured here",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--make-checkpoint", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.make_checkpoint:
        layers = max(int(x) for x in args.layers.split(","))
        make_checkpoint(Path(args.make_checkpoint), SMOKE if args.smoke else STORY, layers)
        return 0

    if args.child:
        result = run_child(json.loads(args.child))
        print("RESULT " + json.dumps(result), flush=True)
        return 0

    t_start = time.perf_counter()
    geometry = SMOKE if args.smoke else STORY
    seq = args.seq or (128 if args.smoke else 1024)
    depths = [int(x) for x in args.layers.split(",")]
    work = Path(args.workdir) / ("smoke" if args.smoke else "story")
    full = work / f"model-{max(depths)}layers"
    if not (full / "model.safetensors.index.json").is_file():
        t0 = time.perf_counter()
        make = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--make-checkpoint",
            str(full),
            "--layers",
            args.layers,
        ]
        subprocess.run(make + (["--smoke"] if args.smoke else []), check=True)
        print(
            f"[bench] checkpoint of {max(depths)} layers written in {time.perf_counter() - t0:.0f} s: {full}",
            flush=True,
        )
    # Build DeepSpeed's CPU Adam once, before the clocked runs (a no-op when the wheel ships it built).
    warm = "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()"
    subprocess.run([sys.executable, "-c", warm], capture_output=True)

    variants = args.variants.split(",")
    plan = [(n, v, o) for n in depths for o in args.offload.split(",") for v in variants]
    if args.extra:
        plan += [(n, "bf16-layerwise", "cpu") for n in (min(depths), max(depths))]
    rows: list[dict[str, Any]] = []
    longest = 0.0
    scratch = Path(tempfile.mkdtemp(prefix="bench-", dir=work))
    for layers, variant, offload in plan:
        elapsed = time.perf_counter() - t_start
        row: dict[str, Any] = {"layers": layers, "variant": variant, "offload": offload}
        if elapsed + longest > args.budget_s:
            rows.append({**row, "status": f"skipped (budget {args.budget_s:.0f} s)"})
            continue
        spec = {
            "model_dir": str(sliced_dir(full, geometry, layers)),
            "variant": "bf16" if variant == "bf16" else ("nf4" if variant == "nf4" else "bf16-layerwise"),
            "offload": offload,
            "layers": layers,
            "steps": args.steps,
            "seq": seq,
            "scratch": str(scratch),
        }
        timeout = max(60.0, min(300.0, args.budget_s + 120 - elapsed))
        result = run_config(spec, timeout, args.smoke)
        longest = max(longest, float(result.get("wall_s", 0)))
        rows.append({**row, **result})
        r = rows[-1]
        print(
            f"[bench] {layers} layer(s) {variant:>14} offload={offload:<4} {r['status']:<10} "
            f"wall {r.get('wall_s', 0):5.1f} s  step {fmt(r.get('median_step_s'), 3)} s  "
            f"GPU load/train {fmt(r.get('gpu_peak_load_gib'))}/{fmt(r.get('gpu_peak_train_gib'))} GiB  "
            f"RSS {fmt(r.get('rss_after_load_gib'))} GiB",
            flush=True,
        )
        if r["status"] != "ok":
            print(r.get("log_tail", ""), flush=True)

    if args.merge:
        rows = merge_rows(json.loads(Path(args.merge).read_text())["rows"], rows)
    geometry_line = ", ".join(f"{k}={v}" for k, v in geometry.items())
    md = "\n".join(
        [
            f"# experts4bit benchmark ({'smoke, CPU' if args.smoke else 'story geometry'})",
            "",
            f"Geometry: {geometry_line}; sequence {seq}, micro-batch 1, LoRA r=16 on q/k/v/o, ZeRO-3, "
            f"CPU AdamW, gradient checkpointing; {args.steps} steps a configuration, "
            "median over all but the first.",
            "",
            table(rows),
            slopes(rows),
            "",
            f"Total wall time {time.perf_counter() - t_start:.0f} s"
            + (f"; rows not measured in this run come from {args.merge}." if args.merge else "."),
        ]
    )
    print(md, flush=True)
    out = os.environ.get("OUT")
    for target in [Path(out)] if out else [work]:
        target.mkdir(parents=True, exist_ok=True)
        (target / "experts4bit.md").write_text(md + "\n")
        payload = {"geometry": geometry, "seq": seq, "steps": args.steps, "rows": rows}
        (target / "experts4bit.json").write_text(json.dumps(payload, indent=1))
        print(f"[bench] wrote {target / 'experts4bit.md'} and .json", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
