"""A profiled step's summary (`trainer.trace_summary`): kernels into categories, device busy time as the
union of their intervals, and the longest kernels listed by name."""

from __future__ import annotations

from trainer.trace_summary import KERNEL_NAME, TOP_KERNELS, category, summarize_trace

GROUPED = (
    "_ZN7cutlass13device_kernelIN2at4cuda6detail25enable_3x_kernel_for_sm9xINS_4gemm6kernel13GemmUniversal"
    "INS5_17GroupProblemShapeIN4cute5tupleIJiiiEEEEE"
)


def kernel(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}


def test_each_kernel_falls_in_its_category() -> None:
    assert category(GROUPED) == "expert GEMMs"  # torch._grouped_mm's CUTLASS kernel
    assert category("_nf4_grouped_mm_kernel") == "expert GEMMs, fused NF4"
    assert category("_nf4_dequant_kernel") == "dequantization"
    assert (
        category("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN") == "other GEMMs (projections, LoRA, head)"
    )
    assert category("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<>") == "attention"
    assert category("void at::native::elementwise_kernel<128, 4, MulFunctor<float>>") == "other kernels"


def test_busy_is_the_union_and_the_longest_kernels_are_listed() -> None:
    names = [f"void at::native::elementwise_kernel<{i}, " + "x" * 300 for i in range(TOP_KERNELS + 5)]
    events = [kernel(GROUPED, 0.0, 1000.0), kernel("flash_fwd_kernel", 500.0, 1000.0)]  # overlapping
    events += [kernel(n, 2000.0 + 100 * i, 1.0 + i) for i, n in enumerate(names)]  # apart
    summary = summarize_trace({"traceEvents": events}, steps=2, wall_s=0.01)
    busy_us = 1500.0 + sum(1.0 + i for i in range(len(names)))
    assert abs(summary["device_busy_s"] - round(busy_us / 1e6 / 2, 5)) < 1e-5
    assert summary["categories_s"]["expert GEMMs"] == 0.0005
    top = summary["top_kernels_s"]
    assert len(top) == TOP_KERNELS and top[0][0] == GROUPED[:KERNEL_NAME]
    assert all(len(name) <= KERNEL_NAME for name, _ in top)
    assert [t for _, t in top] == sorted((t for _, t in top), reverse=True)
