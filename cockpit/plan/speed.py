"""Step time from costs measured on a GPU, not from an assumed fraction of peak.

A micro-batch's forward and backward costs

    fixed_s + layers x layer_s + model FLOPs / (bf16 rate x efficiency)

where the FLOPs are `cockpit.plan.flops.token_flops` for the micro-batch's tokens, `layer_s` is what
each decoder layer costs beyond its FLOPs (ZeRO-3's hook, launches, routing, norms: host and memory
bound work), and `fixed_s` what a micro-batch costs beyond its layers (the trainer, the optimizer's share,
embeddings). The three are fitted by least squares to the speed benchmark's rows
(`benchmarks/fit_speed.py` over `benchmarks/results/step_speed_h100_refit.json` and the story's
rehearsals); the bf16 rate is the one
the benchmark measured, scaled to another GPU by the two GPUs' datasheet rates. With parameter offload a
micro-batch takes at least `copy_factor` times its host-to-device copies at the link's rate (fitted to the
offload rows, which their copies bound); under longer compute the copies hide, as the story's rehearsals
measure (offload and none within 1% a layer at 32,768 tokens a micro-batch).

The rows are the story's geometry with NF4 experts. For another model the FLOPs are its own, but the
per-layer and fixed seconds and the efficiency are the story's: an assumption, which a rehearsal
(`cockpit rehearse`) replaces with a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MeasuredSpeed:
    """Step-time coefficients fitted to measured rows on one GPU model."""

    gpu: str  # the GPU measured
    measured_tflops: float  # its bf16 matmul rate as the benchmark measured it
    fixed_s: float  # a micro-batch, beyond its layers and FLOPs
    layer_s: float  # a decoder layer a micro-batch, beyond its FLOPs
    efficiency: float  # share of the measured bf16 rate the model FLOPs run at
    copy_factor: float  # a micro-batch's host-to-device copies take this times their bytes at the link rate
    source: str  # the rows it was fitted to

    def compute_s(self, layers: int, flops: float, tflops: float) -> float:
        """Seconds of one micro-batch of `flops` model FLOPs over `layers` decoder layers on a GPU of
        `tflops` measured bf16 rate."""
        return self.fixed_s + layers * self.layer_s + flops / (tflops * 1e12 * self.efficiency)


def fit_speed(rows: list[tuple[int, float, float]], gpu: str, tflops: float, source: str) -> MeasuredSpeed:
    """Least squares of step = fixed + layers x layer_s + FLOPs x c over `(layers, flops, step_s)` rows
    (at least three, two depths and two FLOP counts); efficiency = 1 / (c x rate)."""
    if len(rows) < 3:
        raise ValueError("fitting the step time needs at least three rows")
    xs = [(1.0, float(layers), flops / 1e12) for layers, flops, _ in rows]
    ys = [step for _, _, step in rows]
    # Normal equations, 3 x 3, solved by Gaussian elimination (no numpy in the planner).
    a = [[sum(x[i] * x[j] for x in xs) for j in range(3)] for i in range(3)]
    b = [sum(x[i] * y for x, y in zip(xs, ys, strict=True)) for i in range(3)]
    fixed, per_layer, per_tflop = _solve(a, b)
    if per_tflop <= 0:
        raise ValueError("the rows do not separate FLOPs from fixed costs (a non-positive FLOP cost)")
    return MeasuredSpeed(
        gpu=gpu,
        measured_tflops=tflops,
        fixed_s=fixed,
        layer_s=per_layer,
        efficiency=1.0 / (per_tflop * tflops),
        copy_factor=0.0,
        source=source,
    )


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    n = len(b)
    m = [[*row, v] for row, v in zip(a, b, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-18:
            raise ValueError("the rows do not determine the step time (a singular fit)")
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [v - f * w for v, w in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


# Fitted by `python benchmarks/fit_speed.py` to benchmarks/results/step_speed_h100_refit.json and the
# story's rehearsals without offload (the story's geometry sliced, NF4 experts, packed, FlashAttention-4,
# one H100); tests/test_plan_speed.py checks these equal the fit.
STORY_SLICE = MeasuredSpeed(
    gpu="NVIDIA H100 80GB HBM3",
    measured_tflops=761.1,
    fixed_s=0.032305,
    layer_s=0.008238,
    efficiency=0.599419,
    copy_factor=1.119674,
    source="benchmarks/results/step_speed_h100_refit.json rows after-4096-1L, after-4096-2L, after-1024, "
    "after-full-8192, offload-prefetch3-4096, offload-prefetch3-4096-8L; the story's rehearsals without "
    "offload (forecast/records/none_4-16_fa4, none_4-16_mb4_fa4)",
)
