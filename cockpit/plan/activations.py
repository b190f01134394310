"""Activation bytes of one micro-batch on a GPU: what autograd saves a layer, the checkpoints, a layer's
recompute and backward, and the logits with what the loss holds of them.

Derived from the model's shapes, with two measured constants (`LOGITS_EXTRA_BYTES`, and
`WORKING_LAYERS_FAST`, which `benchmarks/fit_memory.py` prints to paste here after new rehearsals).
"""

from __future__ import annotations

from dataclasses import dataclass

from cockpit.contract import loss_chunk_rows
from cockpit.plan.geometry import ModelGeometry

# Measured, not derived: bytes per logit alive at the training peak beyond the logits' own dtype (fp32
# upcast for the loss and what the loss keeps). Fitted on the H200 slices (experts4bit_h200.md, seq 1024,
# bf16): every one of the 8 configurations (bf16 or NF4 experts, with or without param offload, 1 or
# 4 layers) leaves 1.04-1.05 GiB for the logits once the other terms are counted, 7.2 bytes a logit.
# The earlier derived guess (12 bytes: fp32 copy, log-softmax, gradients) over-predicted by ~1 GiB.
LOGITS_EXTRA_BYTES = 5.2
# Measured, not derived: one layer's recompute and backward hold this many times what autograd saves for
# it (`Activations.layer_saved`) on the trainer's fast paths (chunked loss, fused NF4 expert GEMMs with the
# kept dequantized experts, varlen attention). With FlashAttention-4 (Hopper): fitted by
# benchmarks/fit_memory.py on the story's rehearsals on one H100 (4, 8 and 16 layers, offload and none,
# 16,384 and 32,768 tokens a micro-batch) as the largest any needs: 0.80 to 0.87; the step_speed rows of
# the same code at 1,024 to 8,192 tokens are out of sample, bounded within +10%
# (benchmarks/results/plan_memory_fit.md).
WORKING_LAYERS_FAST = 0.87
# The varlen path of before (torch's kernels, and GPUs FlashAttention-4 does not run on): the bound fitted
# on the H200 step_speed rows measured before FlashAttention-4 (4 layers, no offload, 4,096 tokens needs
# 1.06, 8,192 needs 1.65), kept as measured then.
WORKING_LAYERS_VARLEN = 1.65
MEASURED_TOKENS = 32768  # the most tokens a micro-batch WORKING_LAYERS_FAST was measured at
MEASURED_TOKENS_VARLEN = 8192  # and WORKING_LAYERS_VARLEN
WORKING_LAYERS = 2.0


@dataclass(frozen=True)
class Activations:
    """Activation bytes per GPU for one micro-batch."""

    layer_saved: int  # what autograd saves for one decoder layer (the largest)
    checkpoints: int  # the layer inputs kept for recompute (gradient checkpointing)
    all_layers: int  # every layer's saved tensors (no checkpointing)
    logits: int  # logits and what the loss holds of them at the peak (LOGITS_EXTRA_BYTES, measured)
    working_layers: float = WORKING_LAYERS  # a layer's recompute + backward, in layer_saved

    def stack(self, grad_ckpt: bool) -> int:
        """What the layers keep between forward and backward: checkpoints, or every layer's."""
        return self.checkpoints if grad_ckpt else self.all_layers

    def working(self, grad_ckpt: bool) -> int:
        """One layer's recompute plus its backward transients (or just the transients)."""
        return int(self.working_layers * self.layer_saved) if grad_ckpt else self.layer_saved

    def total(self, grad_ckpt: bool) -> int:
        """The whole micro-batch at its peak: the stack, one layer working, the logits."""
        return self.stack(grad_ckpt) + self.working(grad_ckpt) + self.logits


def chunked_loss_bytes(geometry: ModelGeometry, tokens: int, act_bytes: int) -> int:
    """What the chunked loss holds at once (trainer/layers/loss.py): one chunk's fp32 logits, turned in place
    into probabilities, their 16-bit copy for the two GEMMs, and the hidden states' gradient it fills."""
    rows = loss_chunk_rows(geometry.vocab)
    return rows * geometry.vocab * (4 + act_bytes) + tokens * geometry.hidden * act_bytes


def activations(
    geometry: ModelGeometry,
    seq_len: int,
    micro_batch: int,
    act_bytes: int,
    lora_r: int = 0,
    chunked_loss: bool = False,
    fast_paths: bool = False,
    flash4: bool = False,
) -> Activations:
    """Activation bytes of one micro-batch; `chunked_loss`: the loss a chunk of rows at a time;
    `fast_paths` (`Setup.fast_paths`): a layer's recompute and backward hold their measured
    WORKING_LAYERS_FAST with FlashAttention-4 (`flash4`), else WORKING_LAYERS_VARLEN; without the fast
    paths the derived WORKING_LAYERS."""
    g, tokens = geometry, seq_len * micro_batch
    attention = act_bytes * (3 * g.hidden + 3 * g.q_dim + 4 * g.kv_dim + 4 * lora_r) + 8 * g.hidden
    dense = act_bytes * (g.hidden + 4 * g.intermediate)
    moe = g.top_k * act_bytes * (3 * g.hidden + 4 * g.moe_intermediate) + 8 * g.experts
    if g.shared_expert_intermediate:
        moe += act_bytes * (g.hidden + 4 * g.shared_expert_intermediate)
    per_layer = [tokens * (attention + (moe if i in g.sparse_layers else dense)) for i in range(g.layers)]
    return Activations(
        layer_saved=max(per_layer, default=0),
        checkpoints=g.layers * tokens * g.hidden * act_bytes,
        all_layers=sum(per_layer),
        logits=chunked_loss_bytes(g, tokens, act_bytes)
        if chunked_loss
        else int(tokens * g.vocab * (act_bytes + LOGITS_EXTRA_BYTES)),
        working_layers=(WORKING_LAYERS_FAST if flash4 else WORKING_LAYERS_VARLEN)
        if fast_paths
        else WORKING_LAYERS,
    )
