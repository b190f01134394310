"""Model FLOPs per trained token under QLoRA, and MFU: one formula for the planner and the benchmarks.

Frozen base weights get no weight gradient, so each decoder GEMM runs three times a token under gradient
checkpointing: forward, recompute, and the input-gradient backward. The head is not recomputed (two
passes) and runs only where there is a target (the chunked loss skips the prompt). LoRA's small
matrices add their own forward, recompute, input- and weight-gradient terms. Causal attention over a
document of L tokens attends to (L + 1) / 2 positions a token on average: QK^T and PV cost 4·ctx·heads·
head_dim FLOPs a token, counted four times (forward, recompute, and a backward of twice the forward).
"""

from __future__ import annotations

from dataclasses import dataclass

from cockpit.plan.geometry import ModelGeometry

FORMULA = (
    "FLOPs/token = 3 x 2 x active decoder params (forward, recompute, input-gradient backward; frozen "
    "weights have no weight gradient) + 2 x 2 x head params x target fraction (forward, input gradient) "
    "+ 4 x 2 x LoRA params (forward, recompute, input and weight gradients) + 4 x 4 x ctx x heads x "
    "head_dim x layers (causal attention, ctx = (document length + 1) / 2)"
)


@dataclass(frozen=True)
class TokenFlops:
    """FLOPs of one trained token, by term."""

    decoder: float
    head: float
    lora: float
    attention: float

    @property
    def total(self) -> float:
        return self.decoder + self.head + self.lora + self.attention


def decoder_active_params(g: ModelGeometry) -> int:
    """Weights of the decoder layers one token multiplies through (top-k experts), head excluded."""
    return g.active_matmul_params() - head_params(g)


def head_params(g: ModelGeometry) -> int:
    return sum(t.numel for t in g.tensors() if t.kind == "lm_head")


def token_flops(
    g: ModelGeometry,
    doc_len: float,
    target_fraction: float = 1.0,
    lora_params: int = 0,
    grad_ckpt: bool = True,
) -> TokenFlops:
    """FLOPs of one trained token of a document of `doc_len` tokens (see the module docstring)."""
    passes = 3 if grad_ckpt else 2
    ctx = (doc_len + 1) / 2
    return TokenFlops(
        decoder=passes * 2 * decoder_active_params(g),
        head=2 * 2 * head_params(g) * target_fraction,
        lora=(passes + 1) * 2 * lora_params,
        attention=(passes + 1) * 4 * ctx * g.q_dim * g.layers,
    )


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilization: tokens/s x FLOPs a token / the GPU's bf16 matmul rate."""
    return tokens_per_s * flops_per_token / peak_flops
