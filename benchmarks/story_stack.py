"""Side by side, in one call: the story's own training stack against the cockpit, on the same slice.

**The story's stack**, as its team ran it: the HF Trainer; DeepSpeed ZeRO-3 with parameter and
optimizer offload to the CPU (the docs' config: "auto" where HF fills it in, an AdamW block, so
DeepSpeed's CPU Adam steps the offloaded adapters);
bitsandbytes NF4 (double quantization, bf16 compute and storage) through `from_pretrained`'s
`quantization_config`, which quantizes `nn.Linear` layers only and leaves the fused experts in 16 bit;
PEFT LoRA with the profile's rank, alpha, dropout and target modules; gradient checkpointing; bf16. One
example a micro-batch, as the story's examples came (about 2,000 tokens, here random tokens of 1,000 to
3,000, the first half masked from the loss like a prompt), and gradient accumulation to about the
profile's tokens an optimizer step. The slice is loaded from real safetensors on disk
(`benchmarks/load_cache.write_checkpoint`: the story's architecture, `--layers` decoder layers, random
bf16 weights in the hub's layout).

**The cockpit**: `benchmarks/step_speed.py`'s row `COCKPIT_ROW` in the same call: the story profile as
it shipped then (4 packed rows of 4,096 tokens a micro-batch, 2 an optimizer step; parameter and optimizer
offload, the fused kernels), the same architecture and depth from random weights built in memory (a
step's speed does not depend on the weights' values).

tokens/s = tokens an optimizer step (mean) / the median step time, after the warm-up steps, on both
sides. Both count every token of the micro-batches they trained on (the story's side: the Trainer's own
`num_input_tokens_seen`; one example a row, so no padding).

    python benchmarks/story_stack.py                 # GPU: 4 layers; writes $OUT/story_stack.{md,json}
    python benchmarks/story_stack.py --cpu           # the tiny model on the CPU: a smoke test of both sides
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STORY = "qwen3-235b-a22b-thinking-4xh100"
COCKPIT_ROW = "story-offload-prefetch3-4096-mb4-ga2"  # step_speed.py: the story profile, offload, 4 layers
COCKPIT_CPU_ROW = "offload-192"  # step_speed.py --cpu: the tiny profile with offload
WARMUP = 2  # optimizer steps not timed (DeepSpeed's first step and CPU Adam build, the allocator's growth)
GiB = 2**30


def story_config(gpu: bool) -> dict[str, Any]:
    """The DeepSpeed config a team would take from the docs for ZeRO-3 offload."""
    return {
        "bf16": {"enabled": "auto"},
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "cpu", "pin_memory": gpu},
            "offload_optimizer": {"device": "cpu", "pin_memory": gpu},
            "overlap_comm": True,
            "contiguous_gradients": True,
            "stage3_gather_16bit_weights_on_model_save": False,
        },
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        },
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
    }


class Examples:
    """Random-token examples of 1,000 to 3,000 tokens (the story's ~2,000), the first half masked."""

    def __init__(self, n: int, vocab: int, lo: int, hi: int, seed: int = 0) -> None:
        import torch

        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            length = int(torch.randint(lo, hi + 1, (1,), generator=g))
            ids = torch.randint(0, vocab, (length,), generator=g)
            labels = ids.clone()
            labels[: length // 2] = -100
            self.rows.append({"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)})

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.rows[i]


def story_child(args: argparse.Namespace) -> int:
    """Train the story's stack on the checkpoint at --model for --steps optimizer steps; write figures."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import (
        AutoModelForCausalLM,
        BitsAndBytesConfig,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from cockpit.profiles import load_profile

    gpu = torch.cuda.is_available()
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    profile, _ = load_profile(args.profile, [])
    dtype = torch.bfloat16 if gpu else torch.float32
    out = Path(args.result)
    training = TrainingArguments(  # first: it registers the ZeRO-3 config from_pretrained reads
        output_dir=tempfile.mkdtemp(prefix="story-stack-"),
        per_device_train_batch_size=1,
        gradient_accumulation_steps=args.grad_accum,
        learning_rate=1e-4,
        max_steps=args.steps,
        bf16=gpu,
        gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        deepspeed=story_config(gpu),
        dataloader_num_workers=0,
        include_num_input_tokens_seen="all",  # counted as trained, not as the loader reads ahead
    )
    quant = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=dtype,
        bnb_4bit_quant_storage=dtype,
    )
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.model, quantization_config=quant, dtype=dtype)
    load_s = time.perf_counter() - t0
    import bitsandbytes as bnb

    def count(params: Any) -> int:  # logical elements: ZeRO-3's partitions keep theirs in ds_numel, and
        # a packed 4-bit tensor holds two codes a byte of its storage dtype
        return sum(
            getattr(p, "ds_numel", p.numel()) * (2 * p.element_size() if hasattr(p, "quant_state") else 1)
            for p in params
        )

    four_bit = sum(count(m.parameters()) for m in model.modules() if isinstance(m, bnb.nn.Linear4bit))
    total = count(model.parameters())
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    lora = profile.lora
    model = get_peft_model(
        model,
        LoraConfig(
            r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules), task_type="CAUSAL_LM",
        ),
    )  # fmt: skip
    vocab = model.config.vocab_size
    data = Examples(args.grad_accum * args.steps + 8, vocab, args.min_tokens, args.max_tokens)

    def collate(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}

    steps: list[dict[str, float]] = []

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.t, self.tokens = time.perf_counter(), 0

        def on_step_end(self, _args: Any, state: Any, *a: Any, **k: Any) -> None:
            if gpu:
                torch.cuda.synchronize()
            now = time.perf_counter()
            steps.append({"s": now - self.t, "tokens": state.num_input_tokens_seen - self.tokens})
            self.t, self.tokens = now, state.num_input_tokens_seen
            print(
                f"story stack: step {len(steps)} {steps[-1]['s']:.2f} s, {steps[-1]['tokens']} tokens",
                flush=True,
            )

    trainer = Trainer(
        model=model, args=training, train_dataset=data, data_collator=collate, callbacks=[Clock()]
    )
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    timed = steps[WARMUP:] or steps
    step_s = statistics.median(s["s"] for s in timed)
    tokens = statistics.fmean(s["tokens"] for s in timed)
    result = {
        "stack": "story",
        "load_s": load_s,
        "params_4bit_share": four_bit / total if total else 0.0,
        "step_s": step_s,
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / step_s,
        "steps": steps,
        "gpu_peak_gib": torch.cuda.max_memory_allocated() / GiB if gpu else None,
        "grad_accum": args.grad_accum,
    }
    out.write_text(json.dumps(result, indent=1))
    return 0


def run_story(model_dir: Path, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The story's stack in its own process (its own GPU and host peaks); its figures or its failure."""
    result = work / "story.json"
    cmd = [
        sys.executable, __file__, "--child", "--model", str(model_dir), "--result", str(result),
        "--profile", args.profile, "--steps", str(args.steps), "--grad-accum", str(args.grad_accum),
        "--min-tokens", str(args.min_tokens), "--max-tokens", str(args.max_tokens),
    ]  # fmt: skip
    result.unlink(missing_ok=True)
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        return {"stack": "story", "error": f"no end in {args.timeout:.0f} s", "tail": str(exc.stderr)[-3000:]}
    if done.returncode != 0 or not result.is_file():
        tail = (done.stdout[-1500:] + done.stderr[-3000:]).strip()
        return {"stack": "story", "error": f"exit {done.returncode}", "tail": tail}
    return {**json.loads(result.read_text()), "wall_s": time.perf_counter() - t0}


def run_cockpit(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The cockpit's row of `step_speed.py`, run here; its figures."""
    row = COCKPIT_CPU_ROW if args.cpu else COCKPIT_ROW
    cmd = [sys.executable, str(ROOT / "benchmarks/step_speed.py"), "--rows", row, "--budget-s", "600"]
    cmd += ["--cpu"] if args.cpu else []
    path = work / ("step_speed_cpu.json" if args.cpu else "step_speed.json")
    path.unlink(missing_ok=True)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=False,
                              env={**os.environ, "OUT": str(work)})  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"stack": "cockpit", "error": f"no end in {args.timeout:.0f} s"}
    if not path.is_file():
        return {"stack": "cockpit", "error": f"exit {done.returncode}", "tail": done.stderr[-3000:]}
    (found,) = [r for r in json.loads(path.read_text())["rows"] if r["name"] == row]
    r = found["result"]
    if r.get("exit") != 0 or not isinstance(r.get("tokens_per_s"), (int, float)):
        return {"stack": "cockpit", "error": f"row {row}: {r.get('exit')}", "tail": done.stdout[-3000:]}
    keys = {"step_s": "step_s", "tokens_per_step": "tokens_per_step", "tokens_per_s": "tokens_per_s",
            "gpu_peak_gib": "cuda_peak_gib", "exit": "exit"}  # fmt: skip
    return {"stack": "cockpit", "row": row, **{mine: r.get(theirs) for mine, theirs in keys.items()}}


def table(out: dict[str, Any]) -> str:
    story, cockpit = out["story"], out["cockpit"]
    lines = [
        f"# Side by side: the story's stack against the cockpit ({out['layers']} layers, {out['device']})",
        "",
        "| stack | step s | tokens a step | tokens/s | GPU peak GiB | note |",
        "|---|---|---|---|---|---|",
    ]
    for r, note in (
        (story, f"HF Trainer, ZeRO-3 offload, NF4 via from_pretrained, PEFT; 1 example a micro-batch, "
                f"accumulation {story.get('grad_accum', '-')}"),
        (cockpit, f"cockpit trainer, `step_speed.py --rows {cockpit.get('row', '-')}`"),
    ):  # fmt: skip
        if "error" in r:
            lines.append(f"| {r['stack']} | - | - | - | - | failed: {r['error']} |")
            continue
        peak = "-" if r.get("gpu_peak_gib") is None else f"{r['gpu_peak_gib']:.1f}"
        lines.append(
            f"| {r['stack']} | {r['step_s']:.2f} | {r['tokens_per_step']:,.0f} | {r['tokens_per_s']:,.0f} | "
            f"{peak} | {note} |"
        )
    if out.get("speedup"):
        lines += [
            "",
            f"The cockpit trains {out['speedup']:.1f}x as many tokens a second as the story's stack.",
        ]
    if "params_4bit_share" in story:
        lines.append(
            f"The story's load stored {100 * story['params_4bit_share']:.0f}% of the parameters in 4 bit "
            f"(its experts stay in 16 bit); it took {story['load_s']:.0f} s."
        )
    lines += ["", f"Reproduce: `{out['command']}`."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="the tiny model on the CPU (a smoke test)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps of the story's stack")
    parser.add_argument("--grad-accum", type=int, default=16, help="examples an optimizer step (~32k tokens)")
    parser.add_argument("--min-tokens", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=3000)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/story-stack"))
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--profile", default=STORY)
    parser.add_argument("--port", type=int, default=29517)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return story_child(args)
    if args.cpu:
        args.profile, args.grad_accum, args.min_tokens, args.max_tokens = "tiny-cpu", 4, 100, 300
    args.workdir.mkdir(parents=True, exist_ok=True)
    from benchmarks.load_cache import profile_of, write_checkpoint

    if args.cpu:
        from trainer.inputs import tiny

        model_dir = tiny.model_path(0)
    else:
        model_dir = args.workdir / f"slice-{args.layers}L"
        if not (model_dir / "model.safetensors.index.json").is_file():
            t0 = time.perf_counter()
            size = write_checkpoint(profile_of(args.profile, []), args.layers, model_dir, 4 * GiB)
            took = time.perf_counter() - t0
            print(f"wrote the {args.layers}-layer slice: {size / GiB:.1f} GiB in {took:.0f} s")
    story = run_story(model_dir, args, args.workdir)
    print(json.dumps({k: v for k, v in story.items() if k != "steps"}, indent=1))
    cockpit = run_cockpit(args, args.workdir)
    print(json.dumps(cockpit, indent=1))
    speedup = None
    if "error" not in story and "error" not in cockpit and story.get("tokens_per_s"):
        speedup = cockpit["tokens_per_s"] / story["tokens_per_s"]
    import torch

    out = {
        "layers": args.layers if not args.cpu else "tiny",
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "story": story, "cockpit": cockpit, "speedup": speedup,
        "command": "python benchmarks/story_stack.py" + (" --cpu" if args.cpu else ""),
    }  # fmt: skip
    text = table(out)
    print(text)
    if speedup is None and not os.environ.get("OUT"):
        print("a side failed: benchmarks/results/ left as it was", file=sys.stderr)
        return 1
    dest = Path(os.environ.get("OUT") or ROOT / "benchmarks/results")
    name = "story_stack_cpu" if args.cpu else "story_stack"
    (dest / f"{name}.md").write_text(text)
    (dest / f"{name}.json").write_text(json.dumps(out, indent=1))
    return 0 if speedup else 1


if __name__ == "__main__":
    raise SystemExit(main())
