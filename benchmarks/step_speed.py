"""Speed of the story's training step: tokens/s, MFU and where the time goes, one row per configuration.

Every row is one run of the cockpit's own trainer (`python -m trainer --rehearse-layers N`): the story's
architecture (Qwen3-235B-A22B, from its config.json) sliced to 1, 2 or 4 decoder layers plus embeddings
and head, random weights, the profile's settings with a row's overrides, a few optimizer steps. Figures
come from the run record the trainer writes: step events (median step time after the warm-up steps,
tokens a step), the `data` event (packing fill, target fraction) and a `profile` event (`torch.profiler`
over two steps, summarized by `trainer/trace_summary.py`).

MFU = tokens/s x model FLOPs per token / the bf16 matmul rate this script measures on the GPU (an
8192^3 bf16 product, median of 10). Model FLOPs per token: `cockpit.plan.flops.FORMULA`.

"before" rows use the trainer's earlier paths (bitsandbytes-dequantized experts in chunks with one
grouped GEMM each, the whole-vocabulary loss, one example a sequence); "after" rows its present defaults.
Offload rows put parameters and optimizer state on the host; their floor is the host-to-device bytes of
a step (from the profile) over the pinned bandwidth this script measures.

    python benchmarks/step_speed.py                    # every row, on the GPU
    python benchmarks/step_speed.py --rows after-4096,before-4096
    python benchmarks/step_speed.py --cpu              # the tiny profile on the CPU: a smoke test

Last runs (one device call each, merged into step_speed_h200.json with `--merge`):
`--rows story-offload-prefetch3-4096-mb2-ga4,story-offload-prefetch3-4096-mb4-ga2,story-4096-mb4-ga2,
story-offload-prefetch3-4096-ga8-again,story-offload-prefetch3-4096-mb4-ga2-8L,offload-prefetch3-4096-16L,
offload-prefetch3-4096-prof --merge benchmarks/results/step_speed_h200.json --budget-s 330` (7 min), then
`--rows overhead-ab-story,overhead-bare-story-1,overhead-full-story-1,overhead-bare-story-2,
overhead-full-story-2` (4 min). DeepSpeed's CPU Adam is built before the first timed offload row (about
a minute on a fresh machine). Not yet run: the 8- and 16-layer offload rows profiled for their copied
bytes (`offload-prefetch3-4096-8L-prof`, `offload-prefetch3-4096-16L-prof`).
This session's calls, each its own results file: `--rows story-4096-mb4-ga2-prof,story-4096-mb4-ga2-loop,
story-4096-mb4-ga2-8L-prof,story-4096-mb4-ga2-8L-loop` (`step_speed_h200_story_profile`), then
`--rows levers-off-4L,levers-on-4L,levers-act-off-4L,levers-off-8L,levers-on-8L,levers-act-off-8L,
levers-on-8L-prof` (`step_speed_h200_levers`; `benchmarks/marginal_layer.py` reads both). Later:
`--rows now-4L-prof,now-8L-prof` (`step_speed_h200_now_profile`: every lever on, each kernel charged to
its launching operator) and the LoRA-sum rows since dropped (`step_speed_h200_lora`). On one H100:
`--rows keep-...` (`step_speed_h100_keep_profile`) and `--rows fa4-off-4L-prof,fa4-on-4L-prof,
fa4-off-8L-prof,fa4-on-8L-prof` (`step_speed_h100_fa4_profile`; FlashAttention-4 carried as wheels).

Writes step_speed.md and step_speed.json under $OUT (else benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STORY_PROFILE = "qwen3-235b-a22b-thinking-4xh100"
STORY_MEAN_TOKENS = 2000  # the story's examples: about 2,000 tokens each, reasoning traces included
WARMUP_STEPS = 3
PYTHON_PROFILE = False  # --python-profile: cProfile the profiled steps too (host-side hot spots)
KEEP_TRACES = False  # --keep-traces: the profiled rows' chrome traces, gzipped, beside the results
# The earlier ZeRO-3 settings: every MoE block a leaf, DeepSpeed's persistence threshold (10 x hidden).
MOE_LEAF = ('deepspeed.zero3_leaf="moe_block"',)
NO_PERSIST = ("deepspeed.persistence_threshold=40960",)
NO_FUSED_NORM = (("COCKPIT_FUSED_NORM", "0"),)
NO_FAST_ROUTING = (("COCKPIT_FAST_ROUTING", "0"),)
# Attention one SDPA call a document (trainer/layers/attention.py).
PER_DOCUMENT = (("COCKPIT_VARLEN_KERNEL", "0"),)
NO_FUSED_ROPE = (("COCKPIT_FUSED_ROPE", "0"),)  # Transformers' rotary embedding (trainer/layers/rope.py)
NO_FUSED_ACT = (("COCKPIT_FUSED_ACT", "0"),)  # the experts' activation in torch's kernels (kernels/swiglu.py)
# Pairs gathered, then summed (trainer/layers/routing.py).
NO_FUSED_COMBINE = (("COCKPIT_FUSED_COMBINE", "0"),)
NO_NORM_KERNEL = (("COCKPIT_NORM_KERNEL", "0"),)  # torch's rms_norm kernel, not kernels/rms_norm.py
PEFT_LORA = (("COCKPIT_LEAN_LORA", "0"),)  # PEFT's own LoRA forward, not trainer/layers/lora_forward.py
NO_KEEP_DEQUANT = ("training.keep_dequantized_experts=false",)  # backward dequantizes the experts again
TORCH_VARLEN = (("COCKPIT_VARLEN_KERNEL", "torch"),)  # FlashAttention-2 through varlen_attn, not FA4
PREFETCH2 = ("deepspeed.prefetch_layers=2",)
STAGE2 = ("deepspeed.stage=2",)  # ZeRO-2 at one rank: no parameter hooks (what ZeRO-3's cost)
STACK = (("COCKPIT_PROFILE_STACK", "1"),)  # Python frames in the kept trace
SYNC_FETCH = (("COCKPIT_ASYNC_FETCH", "0"),)  # DeepSpeed's own fetch: whole-stream and host waits
# The trainer's paths before this session's fetch changes: DeepSpeed's own fetch, the no-op mask function
# registered with varlen attention (Transformers then syncs the host on the position ids every forward).
EARLIER_FETCH = (*SYNC_FETCH, ("COCKPIT_VARLEN_MASK", "1"))
PREFETCH3 = ("deepspeed.prefetch_layers=3",)
# Offload rows measured before trainer/weights/zero3_fetch.py and deepspeed.embeddings_on_gpu, kept as they
# ran: DeepSpeed's own fetch (whole-stream and host waits), the embedding and lm_head copied from the host.
EARLIER_OFFLOAD = frozenset(
    (
        "offload-4096",
        "offload-4096-1L",
        "offload-4096-2L",
        "offload-moe-leaf-4096",
        "offload-prefetch2-4096",
        "offload-sync-4096-stack",
        "offload-sync-4096-8L",
    )
)
EMB_HOST = ("deepspeed.embeddings_on_gpu=false",)  # the embedding and lm_head offloaded like the layers
BLAS_LT = (("TORCH_BLAS_PREFER_CUBLASLT", "1"),)
PACK = ("training.packing=true",)  # the earlier paths on the present packed data: the loss comparison
LR = ("training.learning_rate=1e-4",)  # the story's rate; the tiny profile's 5e-3 amplifies rounding


@dataclass
class Row:
    """One configuration: a depth, a sequence and batch, offload, and the trainer's paths."""

    name: str
    layers: int
    seq: int
    mb: int = 1
    ga: int = 1  # micro-batches an optimizer step (the story's profile: 8)
    offload: bool = False
    paths: str = "after"  # "after": the trainer's defaults; "before": its earlier paths
    mean_tokens: int = STORY_MEAN_TOKENS  # 0: every example fills its sequence
    steps: int = 8
    profile: bool = False
    bare: bool = False  # no step callbacks, no telemetry sampler: the cockpit's overhead control
    telemetry: bool = False
    ab_block: int = 0  # the cockpit's callbacks on and off in alternating blocks of this many steps
    python_profile: bool = False  # cProfile the profiled steps (slows the host: its own row)
    extra: tuple[str, ...] = ()  # further profile overrides (a lever tried on its own)
    env_extra: tuple[tuple[str, str], ...] = ()  # further environment (a trainer lever switched off)
    result: dict[str, Any] = field(default_factory=dict)

    def overrides(self, gpu: bool) -> list[str]:
        before = self.paths == "before"
        sets = [
            f"hardware.gpus={1 if gpu else 0}",
            f"training.seq_len={self.seq}",
            f"training.micro_batch_size={self.mb}",
            f"training.grad_accum={self.ga}",
            "training.gradient_checkpointing=true",
            f"training.packing={'false' if before else 'true'}",
            f"training.chunked_loss={'false' if before else 'true'}",
            f"data.mean_tokens={self.mean_tokens}",
            f'deepspeed.offload_param="{"cpu" if self.offload else "none"}"',
            f'deepspeed.offload_optimizer="{"cpu" if self.offload else "none"}"',
            f"deepspeed.prefetch_layers={0 if before or not self.offload else 1}",
        ]
        if before:
            sets += ['training.attention="sdpa"', *MOE_LEAF, *NO_PERSIST]
        if not gpu:
            sets += ["training.bf16=false"]
        return [*sets, *self.extra]

    def copy_class(self) -> tuple[str, ...]:
        """What decides the bytes an offload step copies: prefetch depth, where the embeddings live, the
        fetch path, and whether it ran before this session's fetch changes."""
        sets = self.overrides(gpu=True)
        prefetch = [v.split("=", 1)[1] for v in sets if v.startswith("deepspeed.prefetch_layers=")][-1]
        earlier = self.name in EARLIER_OFFLOAD
        return (
            prefetch,
            "host embeddings" if earlier or EMB_HOST[0] in sets else "gpu embeddings",
            "0" if earlier else dict(self.env_extra).get("COCKPIT_ASYNC_FETCH", "1"),
            "moe-block leaves" if MOE_LEAF[0] in sets else "layer leaves",
            "earlier" if earlier else "now",
        )

    def env(self) -> dict[str, str]:
        env = {"COCKPIT_NF4_EXPERTS": "grouped" if self.paths == "before" else "auto"}
        if self.profile:
            first = WARMUP_STEPS + 1
            env["COCKPIT_PROFILE_STEPS"] = f"{first}:{first + 1}"
        if self.bare:
            env["COCKPIT_BARE_TRAINER"] = "1"
        if self.ab_block:
            env["COCKPIT_OVERHEAD_AB"] = str(self.ab_block)
        if self.profile and (PYTHON_PROFILE or self.python_profile):
            env["COCKPIT_PROFILE_PYTHON"] = "1"
        if self.profile and KEEP_TRACES:
            env["COCKPIT_PROFILE_KEEP"] = "1"
        if self.paths == "before":
            env.update(NO_FUSED_NORM + NO_FAST_ROUTING)
        env.update(self.env_extra)
        return env


def gpu_rows() -> list[Row]:
    """In order of importance: a time budget skips the last ones."""
    return [
        Row("after-4096", 4, 4096, profile=True, steps=20),
        Row("after-4096-mb2", 4, 4096, mb=2, steps=12),
        Row("control-stage2-4096", 4, 4096, steps=20, extra=STAGE2),
        Row("after-4096-stack", 4, 4096, profile=True, steps=8, env_extra=STACK),
        Row("offload-4096-stack", 4, 4096, offload=True, profile=True, steps=8, env_extra=STACK),
        # ZeRO-3's fetch with the host waiting on every copy (DeepSpeed's own) against device-side waits
        # (trainer/weights/zero3_fetch.py): same data and seed, so the losses compare too.
        Row(
            "offload-sync-4096-stack",
            4,
            4096,
            offload=True,
            profile=True,
            steps=8,
            env_extra=STACK + SYNC_FETCH,
        ),
        Row("offload-sync-4096-steady", 4, 4096, offload=True, steps=14, env_extra=SYNC_FETCH),
        Row("offload-host-emb-4096-steady", 4, 4096, offload=True, steps=14, extra=EMB_HOST),
        Row(
            "offload-prefetch2-4096-stack",
            4,
            4096,
            offload=True,
            profile=True,
            steps=8,
            extra=PREFETCH2,
            env_extra=STACK,
        ),
        Row("offload-prefetch3-4096", 4, 4096, offload=True, steps=14, extra=PREFETCH3),
        Row("story-offload-prefetch2-4096-ga8", 4, 4096, ga=8, offload=True, steps=7, extra=PREFETCH2),
        Row("story-offload-prefetch3-4096-ga8", 4, 4096, ga=8, offload=True, steps=7, extra=PREFETCH3),
        Row("offload-prefetch3-4096-8L", 8, 4096, offload=True, steps=10, extra=PREFETCH3),
        # The story's optimizer step (32,768 tokens) in fewer, larger micro-batches: with offload every
        # layer crosses the link twice a micro-batch, so 4 rows a micro-batch copy a quarter as often.
        Row(
            "story-offload-prefetch3-4096-mb2-ga4",
            4,
            4096,
            mb=2,
            ga=4,
            offload=True,
            steps=7,
            extra=PREFETCH3,
        ),
        Row(
            "story-offload-prefetch3-4096-mb4-ga2",
            4,
            4096,
            mb=4,
            ga=2,
            offload=True,
            steps=7,
            extra=PREFETCH3,
        ),
        Row("story-4096-mb4-ga2", 4, 4096, mb=4, ga=2, steps=9),
        # Where a further layer's time goes at the story's shape: the profiles at 4 and 8 layers, differenced.
        Row("story-4096-mb4-ga2-prof", 4, 4096, mb=4, ga=2, steps=7, profile=True),
        Row("story-4096-mb4-ga2-8L-prof", 8, 4096, mb=4, ga=2, steps=7, profile=True),
        # The same depths with attention one SDPA call a document (the packed varlen_attn call off).
        Row("story-4096-mb4-ga2-loop", 4, 4096, mb=4, ga=2, steps=7, env_extra=PER_DOCUMENT),
        Row("story-4096-mb4-ga2-8L-loop", 8, 4096, mb=4, ga=2, steps=7, env_extra=PER_DOCUMENT),
        # The packed attention and the fused expert activation, each lever on and off, at 4 and 8 layers:
        # the slope is the marginal layer (interleaved so that drift falls on every side).
        *(
            Row(f"levers-{kind}-{layers}L", layers, 4096, mb=4, ga=2, steps=10, env_extra=env)
            for layers in (4, 8)
            for kind, env in (("off", PER_DOCUMENT + NO_FUSED_ACT), ("on", ()), ("act-off", NO_FUSED_ACT))
        ),
        Row("levers-on-8L-prof", 8, 4096, mb=4, ga=2, steps=9, profile=True),
        # The fused rotary embedding on and off (every other lever on), at 4 and 8 layers.
        *(
            Row(f"rope-{kind}-{layers}L", layers, 4096, mb=4, ga=2, steps=10, env_extra=env)
            for layers in (4, 8)
            for kind, env in (("off", NO_FUSED_ROPE), ("on", ()))
        ),
        # Every lever on, profiled at 4 and 8 layers with Python frames: each kernel charged to the operator
        # and the code that launched it (the profile event's top_ops_s), the difference a further layer.
        Row("now-4L-prof", 4, 4096, mb=4, ga=2, steps=7, profile=True, env_extra=STACK),
        Row("now-8L-prof", 8, 4096, mb=4, ga=2, steps=7, profile=True, env_extra=STACK),
        # The same at the 8 rows and one micro-batch a step the story profile ships with since.
        Row("mb8-4L-prof", 4, 4096, mb=8, ga=1, steps=7, profile=True, env_extra=STACK),
        Row("mb8-8L-prof", 8, 4096, mb=8, ga=1, steps=7, profile=True, env_extra=STACK),
        # The fused sum of each token's expert pairs (kernels/gather_sum.py) on and off at 8 rows, one
        # micro-batch a step, 4 and 8 layers, interleaved.
        *(
            Row(f"combine-{kind}-{layers}L", layers, 4096, mb=8, ga=1, steps=10, env_extra=env)
            for layers in (4, 8)
            for kind, env in (("off", NO_FUSED_COMBINE), ("on", ()))
        ),
        # The RMSNorm kernel (kernels/rms_norm.py) on and off (torch's rms_norm) in the same way.
        *(
            Row(f"norm-{kind}-{layers}L", layers, 4096, mb=8, ga=1, steps=10, env_extra=env)
            for layers in (4, 8)
            for kind, env in (("torch", NO_NORM_KERNEL), ("triton", ()))
        ),
        # PEFT's LoRA forward and the lean one (trainer/layers/lora_forward.py), profiled at 4 and 8 layers in
        # turn.
        *(
            Row(f"lora-{kind}-{layers}L-prof", layers, 4096, mb=8, ga=1, steps=7, profile=True, env_extra=env)
            for kind, env in (("peft", PEFT_LORA), ("lean", ()))
            for layers in (4, 8)
        ),
        # The recompute's dequantized experts kept for backward (trainer/layers/frozen_experts.py) off and on,
        # profiled at 4 and 8 layers (run as drop-off/drop-both beside a dropout kernel that did not
        # compile there and ran torch's dropout in both: results/step_speed_h100_keep_profile.json).
        *(
            Row(f"keep-{kind}-{layers}L-prof", layers, 4096, mb=8, ga=1, steps=7, profile=True, extra=extra)
            for kind, extra in (("off", NO_KEEP_DEQUANT), ("on", ()))
            for layers in (4, 8)
        ),
        # Packed attention through torch's varlen_attn (FlashAttention-2) and FlashAttention-4
        # (trainer/layers/flash4.py, the flash-attn-4 package where it is installed), profiled at 4 and 8
        # layers.
        *(
            Row(f"fa4-{kind}-{layers}L-prof", layers, 4096, mb=8, ga=1, steps=7, profile=True, env_extra=env)
            for kind, env in (("off", TORCH_VARLEN), ("on", ()))
            for layers in (4, 8)
        ),
        # the 1-row story step again, in the same session as the rows above (run-to-run spread ~8%)
        Row("story-offload-prefetch3-4096-ga8-again", 4, 4096, ga=8, offload=True, steps=7, extra=PREFETCH3),
        Row(
            "story-offload-prefetch3-4096-mb4-ga2-8L",
            8,
            4096,
            mb=4,
            ga=2,
            offload=True,
            steps=6,
            extra=PREFETCH3,
        ),
        # Profiled for their copied bytes (the floor) at 4, 8 and 16 layers; 16 is out of the fit's sample.
        Row("offload-prefetch3-4096-16L", 16, 4096, offload=True, steps=10, extra=PREFETCH3),
        Row(
            "offload-prefetch3-4096-16L-prof", 16, 4096, offload=True, profile=True, steps=8, extra=PREFETCH3
        ),
        Row("offload-prefetch3-4096-prof", 4, 4096, offload=True, profile=True, steps=14, extra=PREFETCH3),
        Row("offload-prefetch3-4096-8L-prof", 8, 4096, offload=True, profile=True, steps=12, extra=PREFETCH3),
        # No offload, this session's paths against the earlier ones, interleaved (run-to-run spread ~8%).
        *(
            Row(
                f"after-4096-{kind}-{i}",
                4,
                4096,
                steps=20,
                env_extra=EARLIER_FETCH if kind == "earlier" else (),
            )
            for i in (1, 2)
            for kind in ("now", "earlier")
        ),
        Row("offload-4096-8L", 8, 4096, offload=True, steps=10),
        Row("offload-sync-4096-8L", 8, 4096, offload=True, steps=10, env_extra=SYNC_FETCH),
        Row("lever-blas-lt-4096", 4, 4096, steps=20, env_extra=BLAS_LT),
        # The story's own accumulation: 8 micro-batches an optimizer step, so the step's fixed host work
        # (DeepSpeed's step and its release of every parameter, HF's per-step bookkeeping) is paid once.
        Row("story-4096-ga8", 4, 4096, ga=8, steps=9),
        Row("story-4096-mb2-ga4", 4, 4096, mb=2, ga=4, steps=9),
        Row("story-8192-ga4", 4, 8192, ga=4, steps=9),
        Row("story-offload-4096-ga8", 4, 4096, ga=8, offload=True, steps=7),
        Row("after-8192", 4, 8192, profile=True, steps=14),
        Row("after-full-4096", 4, 4096, mean_tokens=0, steps=14),
        Row("after-full-8192", 4, 8192, mean_tokens=0, steps=14),
        Row("offload-4096", 4, 4096, offload=True, profile=True, steps=14),
        Row("before-4096", 4, 4096, paths="before", mean_tokens=0, profile=True, steps=14),
        Row("before-packed-4096", 4, 4096, paths="before", steps=20, extra=PACK),
        Row("lever-moe-leaf-4096", 4, 4096, steps=14, extra=MOE_LEAF + NO_PERSIST),
        Row("lever-no-persist-4096", 4, 4096, steps=14, extra=NO_PERSIST),
        Row("lever-no-norm-4096", 4, 4096, steps=14, env_extra=NO_FUSED_NORM),
        Row("lever-no-routing-4096", 4, 4096, steps=14, env_extra=NO_FAST_ROUTING),
        Row("after-4096-bare", 4, 4096, steps=30, bare=True),
        Row("after-4096-callbacks", 4, 4096, steps=30),
        Row("after-4096-telemetry", 4, 4096, steps=30, telemetry=True),
        Row("after-full-4096-prof", 4, 4096, mean_tokens=0, profile=True, steps=14),
        Row("after-4096-pyprof", 4, 4096, profile=True, python_profile=True, steps=10),
        # The cockpit's cost in one process: its callbacks on and off in alternating blocks of 5 steps.
        Row("overhead-ab", 4, 4096, steps=83, ab_block=5, telemetry=True),
        # The cockpit's cost, interleaved so that drift between runs falls on both sides.
        *(
            Row(f"overhead-{kind}-{i}", 4, 4096, steps=40, bare=kind == "bare", telemetry=kind == "full")
            for i in (1, 2)
            for kind in ("bare", "full")
        ),
        # The same at the story profile's settings (4 x 4096 a micro-batch, 2 an optimizer step).
        Row("overhead-ab-story", 4, 4096, mb=4, ga=2, steps=53, ab_block=5, telemetry=True),
        *(
            Row(
                f"overhead-{kind}-story-{i}",
                4,
                4096,
                mb=4,
                ga=2,
                steps=25,
                bare=kind == "bare",
                telemetry=kind == "full",
            )
            for i in (1, 2)
            for kind in ("bare", "full")
        ),
        Row("after-4096-1L", 1, 4096, steps=14),
        Row("after-4096-2L", 2, 4096, steps=14),
        Row("offload-4096-1L", 1, 4096, offload=True, steps=12),
        Row("offload-4096-2L", 2, 4096, offload=True, steps=12),
        Row("offload-4096-steady", 4, 4096, offload=True, steps=14),
        Row("offload-moe-leaf-4096", 4, 4096, offload=True, steps=14, extra=MOE_LEAF),
        Row("offload-prefetch2-4096", 4, 4096, offload=True, steps=14, extra=PREFETCH2),
        Row("after-1024", 4, 1024),
        Row("lever-sdpa-mask-4096", 4, 4096, extra=('training.attention="sdpa"',)),
    ]


def cpu_rows() -> list[Row]:
    return [
        Row("before-192", 2, 192, mb=4, paths="before", mean_tokens=0, steps=5, profile=True),
        Row("after-192", 2, 192, mb=4, mean_tokens=100, steps=5, profile=True),
        Row("after-192-1L", 1, 192, mb=4, mean_tokens=100, steps=5),
        Row("control-stage2-192", 2, 192, mb=4, mean_tokens=100, steps=5, extra=STAGE2),
        Row("offload-192", 2, 192, mb=4, mean_tokens=100, steps=5, offload=True),
        Row("before-packed-192", 2, 192, mb=4, paths="before", mean_tokens=100, steps=20, extra=PACK),
        Row("after-192-20", 2, 192, mb=4, mean_tokens=100, steps=20),
        Row(
            "before-packed-192-lr1e-4",
            2,
            192,
            mb=4,
            paths="before",
            mean_tokens=100,
            steps=20,
            extra=PACK + LR,
        ),
        Row("after-192-20-lr1e-4", 2, 192, mb=4, mean_tokens=100, steps=20, extra=LR),
        Row("after-192-20-again", 2, 192, mb=4, mean_tokens=100, steps=20),
    ]


# --- device ceilings ---------------------------------------------------------------------------------
def measure_ceilings() -> dict[str, float]:
    """bf16 matmul rate (TFLOP/s) and pinned host-to-device bandwidth (GB/s), measured here."""
    import torch

    if not torch.cuda.is_available():
        return {}
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    times = []
    for i in range(13):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(end) / 1e3)
    tflops = 2 * 8192**3 / statistics.median(times) / 1e12
    host = torch.empty(1024**3, dtype=torch.uint8).pin_memory()
    dev = torch.empty_like(host, device="cuda")
    copies = []
    for i in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dev.copy_(host, non_blocking=True)
        end.record()
        torch.cuda.synchronize()
        if i >= 2:
            copies.append(start.elapsed_time(end) / 1e3)
    h2d = host.numel() / statistics.median(copies) / 1e9
    del a, b, host, dev
    torch.cuda.empty_cache()
    return {"bf16_tflops": round(tflops, 1), "h2d_gbps": round(h2d, 1), "gpu": torch.cuda.get_device_name()}


# --- one row -------------------------------------------------------------------------------------------
def run_row(row: Row, profile_name: str, runs: Path, gpu: bool, timeout: float) -> dict[str, Any]:
    from benchmarks.trainer_runs import log_tail, new_run, run_depth

    run_dir, _ = new_run(profile_name, row.overrides(gpu), runs, f"speed-{row.name}")
    t0 = time.time()
    code = run_depth(run_dir, row.layers, row.steps, row.env(), timeout=timeout, sampler=row.telemetry)
    result = read_row(run_dir, row)
    result.update(exit=code, wall_s=round(time.time() - t0, 1), run_dir=str(run_dir))
    # The trainer keeps the dequant path's weights for backward unless the row switched it off; rows
    # without the field ran before it did (benchmarks/fit_memory.py plans each as it ran).
    result["keep_dequant"] = not set(NO_KEEP_DEQUANT) & set(row.extra)
    if KEEP_TRACES:
        keep_traces(run_dir, row.name)
    if code != 0:
        result["error"] = log_tail(run_dir)
    return result


def keep_traces(run_dir: Path, name: str) -> None:
    """Gzip a row's chrome traces into the results folder, for reading off the machine."""
    import gzip
    import shutil

    out = Path(os.environ.get("OUT") or ROOT / "benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    for trace in sorted(run_dir.rglob("trace-rank*.json")):
        with trace.open("rb") as src, gzip.open(out / f"trace-{name}-{trace.stem}.json.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
    for stats in sorted(run_dir.rglob("python-rank*.pstats")):  # cProfile rows: callers included
        shutil.copyfile(stats, out / f"python-{name}-{stats.stem}.pstats")


def read_row(run_dir: Path, row: Row) -> dict[str, Any]:
    """A row's figures from its run record."""
    from cockpit.record import read_events

    events = read_events(run_dir)
    kinds: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("rank", 0) == 0:
            kinds.setdefault(e["kind"], []).append(e)
    out: dict[str, Any] = {}
    steps = kinds.get("step", [])
    timed = [s for s in steps if s["step"] > WARMUP_STEPS and s.get("step_time_s")]
    profiled = kinds.get("profile", [{}])[0]
    if profiled:
        lo, hi = profiled["first_step"], profiled["last_step"]
        # the profiler's own cost stays out: its steps, and the next (its trace is written as that one starts)
        timed = [s for s in timed if not lo <= s["step"] <= hi + 1]
    out["timed_steps"] = len(timed)
    if timed:
        out["step_s"] = statistics.median(s["step_time_s"] for s in timed)
        out["tokens_per_step"] = statistics.median(s["tokens"] for s in timed)
        out["tokens_per_s"] = out["tokens_per_step"] / out["step_s"]
        out["cuda_peak_gib"] = max(s.get("cuda_peak_alloc_mib", 0) for s in steps) / 1024
    out["losses"] = [s["loss"] for s in steps]
    out["step_times_s"] = [s.get("step_time_s") for s in steps]
    end = kinds.get("train_end", [{}])[0]
    clock_times = (end.get("step_times_s") or [])[WARMUP_STEPS - 1 :]  # times between step ends: step 2 on
    if clock_times:  # the one clock of bare and full runs alike: the overhead rows compare these
        out["clock_step_s"] = statistics.median(clock_times)
    if row.ab_block:
        out["ab"] = ab_split(end.get("step_times_s") or [], row.ab_block)
    if clock_times and not timed:
        out["step_s"] = out["clock_step_s"]
        tokens = end.get("tokens") or 0
        out["tokens_per_s"] = tokens / end["steps"] / out["step_s"] if end.get("steps") else None
    if end.get("train_runtime_s"):
        out["train_runtime_s"] = end["train_runtime_s"]
        out["run_tokens"] = end.get("tokens")
        out["run_tokens_per_s"] = end["tokens"] / end["train_runtime_s"] if end.get("tokens") else None
    data = kinds.get("data", [{}])[0]
    out["fill"] = data.get("fill")
    out["target_fraction"] = data.get("target_fraction")
    out["mean_example_tokens"] = data["tokens"] / data["examples"] if data.get("examples") else None
    loaded = kinds.get("loaded", [{}])[0]
    out["load_s"] = loaded.get("load_s")
    out["attention"] = loaded.get("attention")
    out["attention_kernel"] = loaded.get("attention_kernel")  # flash4, varlen_attn or per-document
    if profiled:
        out["profile"] = {k: v for k, v in profiled.items() if k not in ("t", "kind", "rank")}
    return out


def ab_split(times: list[float], block: int) -> dict[str, Any]:
    """Step times of an alternating run split into callbacks-on and -off blocks.

    `times[j]` runs from step j's end to step j+1's (0-based), so it holds step j's callbacks and step
    j+1's work: it counts for a kind when both steps are in one block of that kind. Blocks before step
    `WARMUP_STEPS + block` are left out.
    """
    on: list[float] = []
    off: list[float] = []
    for j, t in enumerate(times):
        if j < WARMUP_STEPS + block or j // block != (j + 1) // block:
            continue
        (on if (j // block) % 2 == 0 else off).append(t)
    if not on or not off:
        return {}
    return {
        "on_s": statistics.median(on),
        "off_s": statistics.median(off),
        "on_steps": len(on),
        "off_steps": len(off),
        "on_mean_s": statistics.mean(on),
        "off_mean_s": statistics.mean(off),
    }


# --- derived figures ----------------------------------------------------------------------------------
def derive(row: Row, result: dict[str, Any], profile_name: str, ceilings: dict[str, float]) -> None:
    """FLOPs per token, MFU and the offload floor, added to the row's result. A floor is the row's own
    profile's, or shared afterwards within its copy class (`share_floors`): one kept from an earlier
    report is dropped here."""
    result.pop("floor_ratio", None)
    if not (result.get("profile") or {}).get("h2d_bytes_per_step"):
        result.pop("h2d_floor_s", None)
    if result.get("step_s") and not row.bare and result.get("losses"):  # run before the count was kept:
        ran = len(result["losses"])  # read_row's rule over the steps the run recorded
        result.setdefault("timed_steps", ran - WARMUP_STEPS - (3 if row.profile else 0))
    from cockpit.plan.flops import token_flops
    from cockpit.plan.inputs import resolve_geometry
    from cockpit.plan.weights import lora_params
    from cockpit.profiles import load_profile

    profile, _ = load_profile(profile_name)
    g = resolve_geometry(profile).with_layers(row.layers)
    doc = result.get("mean_example_tokens") or row.seq
    frac = result.get("target_fraction") or 1.0
    lora = lora_params(g, profile.lora.target_modules, profile.lora.r)
    flops = token_flops(g, doc, frac, lora)
    result["flops_per_token"] = flops.total
    result["flops_terms"] = asdict(flops)
    tps = result.get("tokens_per_s")
    ceilings = result.get("ceilings") or ceilings  # the rates the row's own run measured
    if tps and ceilings.get("bf16_tflops"):
        result["mfu"] = tps * flops.total / (ceilings["bf16_tflops"] * 1e12)
    prof = result.get("profile") or {}
    if row.offload and prof.get("h2d_bytes_per_step") and ceilings.get("h2d_gbps"):
        result["h2d_floor_s"] = prof["h2d_bytes_per_step"] / (ceilings["h2d_gbps"] * 1e9)


def share_floors(rows: list[Row]) -> None:
    """Offload rows without a profile take the host-to-device floor of a profiled row of the same depth,
    sequence and batch: its bytes a micro-batch, times the row's micro-batches a step (the optimizer
    step's own copies are left out: small with LoRA). Every offload row gets its step over that floor."""
    floors = {
        (r.layers, r.seq, r.mb, r.copy_class()): r.result["h2d_floor_s"] / r.ga
        for r in rows
        if r.offload and r.result.get("h2d_floor_s")
    }
    for r in rows:
        floor = floors.get((r.layers, r.seq, r.mb, r.copy_class()))
        if r.offload and floor and r.result.get("step_s"):
            r.result.setdefault("h2d_floor_s", floor * r.ga)
            r.result["floor_ratio"] = r.result["step_s"] / r.result["h2d_floor_s"]


def offload_slopes(rows: list[Row]) -> list[str]:
    """Offload rows of one copy class at two depths or more: what a further layer adds to a micro-batch,
    against the time its two fetches take on the link. Deep models are that slope times their depth; a
    slice's fixed costs (the first layer's copy before any compute, the turn to the backward) fall away."""
    groups: dict[tuple[Any, ...], list[Row]] = {}
    for r in rows:
        if r.offload and r.result.get("step_s") and r.seq == 4096 and r.mb == 1 and not r.profile:
            groups.setdefault((r.copy_class(), r.ga), []).append(r)
    from benchmarks.fit_speed import copy_bytes
    from cockpit.rehearse.fit import fit

    # a further layer's two fetches a micro-batch, as the planner counts them (`Weights.moved_bytes`)
    layer_bytes = copy_bytes(2) - copy_bytes(1) if groups else 0.0
    lines = []
    for (cls, ga), members in groups.items():
        depths = {r.layers: r.result["step_s"] / ga for r in members}
        line = fit(sorted(depths.items()))
        deepest = max(depths)
        sample = sorted((d, t) for d, t in depths.items() if d < deepest)
        held_out = fit(sample) if len(sample) >= 2 else None
        gbps = (members[0].result.get("ceilings") or {}).get("h2d_gbps")
        if line is None or not gbps:
            continue
        copy = layer_bytes / (gbps * 1e9)
        prefetch, where, fetch, leaves, when = cls
        fetch_words = "overlapped fetch" if fetch != "0" else "DeepSpeed fetch"
        what = f"prefetch {prefetch}, {where}, {fetch_words}, {leaves}" + (
            ", before this session's fetch changes" if when != "now" else ""
        )
        names = ", ".join(
            f"{r.name} ({r.result['step_s'] / ga:.3f} s)" for r in sorted(members, key=lambda r: r.layers)
        )
        lines.append(
            f"- offload, {what}: a further layer adds {line.per_layer:.4f} s a micro-batch against "
            f"{copy:.4f} s for its two fetches at the link's measured rate: {line.per_layer / copy:.2f}x "
            f"(depths {', '.join(map(str, sorted(depths)))}: {names})"
        )
        if held_out is not None:
            guess = held_out.at(deepest)
            lines.append(
                f"  - out of sample: fitted on depths {', '.join(str(d) for d, _ in sample)} only, the "
                f"{deepest}-layer step predicted {guess:.3f} s a micro-batch, measured "
                f"{depths[deepest]:.3f} s ({(guess / depths[deepest] - 1) * 100:+.1f}%)"
            )
    if not lines:
        return []
    return ["", "Parameter offload, per layer (the floor a deep model approaches):", "", *lines]


def per_layer(rows: list[Row], offload: bool) -> float | None:
    """Seconds a decoder layer adds to a step: the slope of step time over depth (least squares)."""
    pts = [
        (r.layers, r.result["step_s"])
        for r in rows
        if r.offload == offload
        and r.paths == "after"
        and r.seq == 4096
        and r.mb == 1
        and r.ga == 1
        and "step_s" in r.result
        and not r.bare
        and not r.telemetry
        and not r.extra
        and not r.env_extra
        and not r.profile
        and r.mean_tokens == STORY_MEAN_TOKENS
        and r.name not in EARLIER_OFFLOAD
    ]
    from cockpit.rehearse.fit import fit

    line = fit(pts)  # None with fewer than two depths
    return line.per_layer if line else None


# --- report -------------------------------------------------------------------------------------------
def _f(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def table(rows: list[Row], ceilings: dict[str, float]) -> str:
    from cockpit.plan.flops import FORMULA

    lines = [
        "| row | layers | seq x mb (x accum) | offload | paths | fill | step s (timed steps) | tokens/s "
        "| GFLOP/token | MFU | GPU peak GiB | floor s | x floor | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        x = r.result
        status = "ok" if x.get("exit") == 0 else (x.get("error") or str(x.get("exit", "skipped")))[:80]
        gflop = x["flops_per_token"] / 1e9 if x.get("flops_per_token") else None
        mfu = x["mfu"] * 100 if x.get("mfu") else None
        cells = [
            r.name,
            str(r.layers),
            f"{r.seq}x{r.mb}" + (f"x{r.ga}" if r.ga > 1 else ""),
            "param+opt" if r.offload else "none",
            "earlier fetch" if r.name in EARLIER_OFFLOAD else r.paths,
            _f(x.get("fill"), ".2f"),
            _f(x.get("step_s"), ".3f") + (f" ({x['timed_steps']})" if x.get("timed_steps") else ""),
            _f(x.get("tokens_per_s"), ",.0f"),
            _f(gflop, ".3g"),
            _f(mfu, ".1f") + "%",
            _f(x.get("cuda_peak_gib"), ".1f"),
            _f(x.get("h2d_floor_s"), ".3f"),
            _f(x.get("floor_ratio"), ".2f"),
            status,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    out = ["# Step speed (story geometry, random weights)", ""]
    measured = [r.result["ceilings"] for r in rows if r.result.get("ceilings")] or (
        [ceilings] if ceilings else []
    )
    if measured:
        rates = sorted({c["bf16_tflops"] for c in measured})
        h2d = sorted({c["h2d_gbps"] for c in measured})
        span = (
            "" if len(rates) == 1 else f" (one figure a run, {len(rates)} runs; each row's MFU uses its own)"
        )
        out.append(
            f"GPU: {measured[0].get('gpu')}; bf16 matmul {' / '.join(map(str, rates))} TFLOP/s{span} and "
            f"pinned host-to-device {' / '.join(map(str, h2d))} GB/s, measured by this script."
        )
    out += ["", f"Model FLOPs: {FORMULA}.", "", *lines, ""]
    for offload in (False, True):
        slope = per_layer(rows, offload)
        if slope is not None:
            how = "offload" if offload else "no offload"
            out.append(f"- seconds per decoder layer, seq 4096, {how}: {slope:.4f}")
    out += offload_levers(rows) + offload_slopes(rows)
    prof_rows = [r for r in rows if r.result.get("profile")]
    if prof_rows:
        out += ["", "## Where the time goes (seconds a step, torch.profiler over two steps)", ""]
        cats: list[str] = []
        for r in prof_rows:
            for c in r.result["profile"]["categories_s"]:
                if c not in cats:
                    cats.append(c)
        extra = ["logits and loss (within the above)", "device busy", "host-bound (device idle)", "step"]
        out.append("| category | " + " | ".join(r.name for r in prof_rows) + " |")
        out.append("|---|" + "---|" * len(prof_rows))
        for c in [*cats, *extra]:
            cells = []
            for r in prof_rows:
                p = r.result["profile"]
                value = {
                    "device busy": p["device_busy_s"],
                    "host-bound (device idle)": p["host_bound_s"],
                    "step": p["step_wall_s"],
                }.get(c, p["categories_s"].get(c, p.get("annotations_s", {}).get(c)))
                cells.append(_f(value, ".4f"))
            out.append(f"| {c} | " + " | ".join(cells) + " |")
    out += loss_comparison(rows) + overhead(rows) + dropped_levers(rows)
    for r in prof_rows:
        calls = r.result["profile"].get("runtime_calls") or {}
        if calls:
            out += ["", f"CUDA calls on the host, {r.name} (calls and seconds a step):", ""]
            out += [f"- {name}: {n} calls, {sec:.4f} s" for name, (n, sec) in list(calls.items())[:8]]
        packages = r.result["profile"].get("python_packages") or {}
        if packages:
            out += ["", f"Host Python by library, {r.name} (own s and calls a step, cProfile on):", ""]
            out += [f"- {name}: {sec:.4f} s, {n} calls" for name, (sec, n) in list(packages.items())[:8]]
        top = r.result["profile"].get("python_top")
        if top:
            out += ["", f"Host functions, {r.name} (own seconds a step, cumulative, calls a step):", ""]
            out += [f"- {name}: {own:.4f} / {cum:.4f} s, {calls} calls" for name, own, cum, calls in top[:15]]
    return "\n".join(out) + "\n"


# Levers measured and dropped: (what, the evidence, rows shown here that ran with it).
DROPPED = (
    (
        "LoRA's dropout drawn inside lora_A's product (a Triton kernel: Philox keep bits by row and column, "
        "nothing of [tokens, width] written forward, the mask drawn again backward; commit 4c224f2)",
        "on one H100 at the story's shapes, a layer-step's four draws (forward twice, backward once): "
        "torch's dropout then lora_A 6.00 and 5.96 ms, the kernel 6.22 ms (words interleaved) and 6.06 ms "
        "at its best tiles (quarter tiles, 8.05 as first shipped): forward faster (0.27-0.35 against 0.38 "
        "ms at 4,096 wide), backward slower (0.66-0.94 against 0.47) "
        "(benchmarks/results/earlier/dropout_speed_h100_{interleave,quarters}.md; the code was removed)",
        (),
    ),
    (
        "The 4-bit LoRA projections' scaled adapter term added in one kernel (`torch.add(base, lora, "
        "alpha=scaling)` in place of PEFT's clone, scale and add; 2.9 ms of a further layer's device time "
        "by the now-8L-prof profile)",
        "lora-off/on-4L 0.667 against 0.661 s, 8L 1.226 against 1.227 s, one call, interleaved: no effect "
        "beyond the run-to-run spread (benchmarks/results/step_speed_h200_lora.json; the code was removed)",
        (),
    ),
    (
        "Python's collector frozen after the load and run only between steps",
        "after-4096 0.1395 s with it against 0.157 s without in one run, 0.142 s against 0.138 s in the "
        "next: no effect beyond the run-to-run spread",
        ("after-4096-mb2", "control-stage2-4096", "after-4096-stack", "lever-blas-lt-4096", "after-8192"),
    ),
    (
        "torch's F.linear under ZeRO-3 instead of DeepSpeed's Python wrapper (`memory_efficient_linear` off)",
        "after-4096 0.150 s with it against 0.142 s without, the story's 4096x1x8 1.024 s against 1.042 s, "
        "one run, interleaved: no effect beyond the run-to-run spread "
        "(benchmarks/results/earlier/step_speed_h200_session4_run5.json)",
        (),
    ),
)


# Offload levers kept, each measured against the row without it: (what, without, with).
OFFLOAD_LEVERS = (
    (
        "ZeRO-3's fetch overlapped with compute (trainer/weights/zero3_fetch.py) against DeepSpeed's own",
        "offload-sync-4096-steady",
        "offload-4096-steady",
    ),
    (
        "the embedding and lm_head kept on the GPU against copied",
        "offload-host-emb-4096-steady",
        "offload-4096-steady",
    ),
    ("3 layers prefetched against 1", "offload-4096-steady", "offload-prefetch3-4096"),
    ("3 layers prefetched against 1, at 8 layers", "offload-4096-8L", "offload-prefetch3-4096-8L"),
    (
        "3 layers prefetched against 1, the story's accumulation",
        "story-offload-4096-ga8",
        "story-offload-prefetch3-4096-ga8",
    ),
    (
        "all of them, at 8 layers, against the earlier paths",
        "offload-sync-4096-8L",
        "offload-prefetch3-4096-8L",
    ),
)


def offload_levers(rows: list[Row]) -> list[str]:
    """Each kept offload lever: the step without it against with it (one run each; spread up to 8%)."""
    by = {r.name: r.result.get("step_s") for r in rows if r.result.get("exit") == 0}
    lines = [
        f"- {what}: {by[old]:.3f} s a step against {by[new]:.3f} s ({by[new] / by[old] - 1:+.1%}; "
        f"{old} against {new})"
        for what, old, new in OFFLOAD_LEVERS
        if by.get(old) and by.get(new)
    ]
    return (
        ["", "Parameter offload levers kept (each a step without it against with it):", "", *lines]
        if lines
        else []
    )


def dropped_levers(rows: list[Row]) -> list[str]:
    """Levers tried and not kept, with the rows above that ran with them (measured before the removal)."""
    shown = {r.name for r in rows if r.result.get("exit") == 0}
    out = ["", "Levers measured and dropped:", ""]
    for what, evidence, ran in DROPPED:
        with_it = [name for name in ran if name in shown]
        out.append(
            f"- {what}: {evidence}." + (f" Rows that ran with it: {', '.join(with_it)}." if with_it else "")
        )
    return out


# (earlier paths, present paths): the same packed data, the first steps' losses compared
LOSS_PAIRS = (
    ("before-packed-4096", "after-4096"),
    ("before-packed-192", "after-192-20"),
    ("before-packed-192-lr1e-4", "after-192-20-lr1e-4"),
    ("after-192-20", "after-192-20-again"),  # the same path twice: the run-to-run floor
    ("offload-sync-4096-steady", "offload-4096-steady"),  # the host's wait on each copy, and without
)


def loss_comparison(rows: list[Row]) -> list[str]:
    """The first steps' losses of the earlier paths against the present ones, on the same packed data."""
    by = {r.name: r.result.get("losses") or [] for r in rows}
    lines = []
    for old, new in LOSS_PAIRS:
        before, after = by.get(old, []), by.get(new, [])
        n = min(len(before), len(after))
        if not n:
            continue
        diffs = [abs(a - b) for a, b in zip(before[:n], after[:n], strict=True)]
        worst = max(range(n), key=lambda i: diffs[i])
        lines += [
            "",
            f"Loss over the first {n} steps, {old} against {new}, same packed data: largest difference "
            f"{diffs[worst]:.4f} at step {worst + 1} "
            f"({diffs[worst] / abs(before[worst]):.2%} of {before[worst]:.4f}); mean difference "
            f"{sum(diffs) / n:.4f}.",
        ]
    return lines


OVERHEAD_SETS = (
    ("", "4096 tokens a micro-batch, one an optimizer step"),
    ("-story", "the story profile's step then: 4 rows of 4096 tokens a micro-batch, 2 micro-batches"),
)


def overhead(rows: list[Row]) -> list[str]:
    """The cockpit's cost: median time between step ends with its callbacks and sampler against a bare
    trainer, the same clock in both (`overhead-*` rows: interleaved bare and full runs), per setting."""
    by = {r.name: r.result for r in rows}
    lines = []
    for tag, setting in OVERHEAD_SETS:
        block = _overhead_lines(by, tag)
        if block:
            lines += [f"- {setting}:", *(f"  {line}" for line in block)]
    if not lines:
        return []
    return ["", "The cockpit's own cost (step callbacks, step events and the telemetry sampler):", *lines]


def _overhead_lines(by: dict[str, dict[str, Any]], tag: str) -> list[str]:
    lines = []
    ab = by.get(f"overhead-ab{tag}", {}).get("ab")
    if ab:
        lines += [
            f"- one process, callbacks on and off in alternating blocks of steps (sampler on throughout): "
            f"median {ab['on_s']:.4f} s a step on ({ab['on_steps']} steps) against {ab['off_s']:.4f} s off "
            f"({ab['off_steps']}): {ab['on_s'] / ab['off_s'] - 1:+.2%}; means {ab['on_mean_s']:.4f} against "
            f"{ab['off_mean_s']:.4f} s: {ab['on_mean_s'] / ab['off_mean_s'] - 1:+.2%}"
        ]
    pairs = []
    for i in range(1, 10):
        bare = by.get(f"overhead-bare{tag}-{i}", {}).get("clock_step_s")
        full = by.get(f"overhead-full{tag}-{i}", {}).get("clock_step_s")
        if bare and full:
            pairs.append((bare, full))
    lines += [
        f"- pair {i}: {full:.4f} s a step with the cockpit against {bare:.4f} s bare: {full / bare - 1:+.2%}"
        for i, (bare, full) in enumerate(pairs, 1)
    ]
    if pairs:
        bare_all = statistics.mean(b for b, _ in pairs)
        full_all = statistics.mean(f for _, f in pairs)
        lines.append(
            f"- mean of the pairs: {full_all:.4f} s against {bare_all:.4f} s: tokens/s ratio "
            f"{bare_all / full_all:.4f} ({full_all / bare_all - 1:+.2%} a step)"
        )
        spread = max(abs(b / pairs[0][0] - 1) for b, _ in pairs)
        lines.append(f"- run-to-run spread of the bare runs: {spread:.2%}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cpu", action="store_true", help="the tiny profile on the CPU (a smoke test)")
    parser.add_argument("--rows", default="", help="comma-separated row names (default: all)")
    parser.add_argument("--budget-s", type=float, default=540, help="skip rows that would start after this")
    parser.add_argument("--runs-dir", type=Path, default=Path("/tmp/step-speed-runs"))
    parser.add_argument("--python-profile", action="store_true", help="cProfile the profiled steps too")
    parser.add_argument(
        "--keep-traces", action="store_true", help="gzip the profiled rows' chrome traces beside the results"
    )
    parser.add_argument(
        "--merge",
        type=Path,
        action="append",
        default=[],
        help="an earlier step_speed.json: its successful rows are kept, not run again (repeatable; later "
        "files win); each row keeps the matmul rate its own run measured",
    )
    parser.add_argument("--report-only", action="store_true", help="run nothing: the merged rows' report")
    args = parser.parse_args(argv)
    global PYTHON_PROFILE, KEEP_TRACES
    PYTHON_PROFILE, KEEP_TRACES = args.python_profile, args.keep_traces
    gpu = not args.cpu
    rows = gpu_rows() if gpu else cpu_rows()
    if args.rows:
        wanted = args.rows.split(",")
        rows = [r for r in rows if r.name in wanted]
    profile_name = STORY_PROFILE if gpu else "tiny-cpu"
    ceilings = measure_ceilings() if gpu and not args.report_only else {}
    earlier: dict[str, dict[str, Any]] = {}
    for path in args.merge:
        kept = json.loads(path.read_text())
        for r in kept["rows"]:
            if r["result"].get("exit") == 0:
                earlier[r["name"]] = {"ceilings": kept["ceilings"], **r["result"]}
        ceilings = ceilings or kept["ceilings"]
    print(json.dumps(ceilings), flush=True)
    if gpu and not args.report_only and any(r.offload and r.name not in earlier for r in rows):
        from benchmarks.trainer_runs import prepare_ops

        print(f"DeepSpeed ops ready ({prepare_ops(profile_name)} s spent building)", flush=True)
    start = time.time()
    for row in rows:
        if row.name in earlier:
            row.result = earlier[row.name]
            derive(row, row.result, profile_name, ceilings)
            continue
        if args.report_only or time.time() - start > args.budget_s:
            row.result = {"exit": "not run" if args.report_only else "skipped (time budget)"}
            continue
        row.result = run_row(row, profile_name, args.runs_dir, gpu, timeout=max(60, args.budget_s))
        row.result["ceilings"] = ceilings
        derive(row, row.result, profile_name, ceilings)
        x = row.result
        speed = f"{_f(x.get('tokens_per_s'), ',.0f')} tok/s, MFU {_f(x.get('mfu'), '.3f')}"
        print(
            f"{row.name}: exit {x.get('exit')} step {_f(x.get('step_s'), '.3f')} s, {speed}, "
            f"wall {x.get('wall_s')} s; steps {' '.join(_f(t, '.2f') for t in x.get('step_times_s') or [])}"
            + (f" ERROR {x['error']}" if x.get("error") else ""),
            flush=True,
        )
    share_floors(rows)
    report = table(rows, ceilings)
    print(report)
    out = Path(os.environ.get("OUT") or ROOT / "benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    suffix = "" if gpu else "_cpu"
    (out / f"step_speed{suffix}.md").write_text(report)
    (out / f"step_speed{suffix}.json").write_text(
        json.dumps({"ceilings": ceilings, "rows": [asdict(r) for r in rows]}, indent=1, default=str)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
