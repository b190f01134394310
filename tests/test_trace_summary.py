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


def host(cat: str, name: str, ts: float, dur: float, tid: int = 1, ext: int | None = None) -> dict:
    event = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}
    if ext is not None:
        event["args"] = {"External id": ext}
    return event


def test_kernels_are_charged_to_the_operator_that_launched_them() -> None:
    events = [
        # forward: trainer code -> torch code -> aten::mul launching two kernels
        host("python_function", "trainer/layers/experts4bit.py(300): forward", 0.0, 100.0),
        host("python_function", "torch/nn/functional.py(10): silu", 1.0, 50.0),
        host("cpu_op", "aten::silu", 2.0, 10.0, ext=7),
        host("cpu_op", "aten::to", 20.0, 20.0, ext=8),
        host("cpu_op", "aten::copy_", 21.0, 5.0, ext=9),
        # backward on another thread, no Python frame
        host("cpu_op", "autograd::engine::evaluate_function: MulBackward0", 0.0, 40.0, tid=2),
        host("cpu_op", "aten::mul", 1.0, 3.0, tid=2, ext=11),
        host("cpu_op", "aten::empty", 150.0, 1.0),  # the step goes on: the frames above had returned
        kernel("silu_kernel", 5.0, 30.0) | {"args": {"External id": 7}},
        kernel("silu_kernel", 40.0, 10.0) | {"args": {"External id": 7}},
        kernel("copy_kernel", 50.0, 20.0) | {"args": {"External id": 9}},
        kernel("mul_kernel", 80.0, 60.0) | {"args": {"External id": 11}},
        kernel("graph_replay_kernel", 200.0, 500.0),  # no launching operator: not charged
    ]
    ops = summarize_trace({"traceEvents": events}, steps=1, wall_s=0.001)["top_ops_s"]
    assert ops == [
        ["aten::mul < autograd::engine::evaluate_function: MulBackward0", 6e-05],
        ["aten::silu @ trainer/layers/experts4bit.py(300): forward", 4e-05],
        ["aten::copy_ < aten::to @ trainer/layers/experts4bit.py(300): forward", 2e-05],
    ]


def test_a_range_that_only_overlaps_encloses_nothing() -> None:
    """An op that starts inside a range and ends after it is not taken for that range's callee."""
    events = [
        host("cpu_op", "torch_attn::_varlen_attn", 0.0, 10.0),
        host("cpu_op", "aten::mm", 5.0, 20.0, ext=3),  # starts inside, ends after: not its child
        kernel("gemm", 30.0, 20.0) | {"args": {"External id": 3}},
    ]
    assert summarize_trace({"traceEvents": events}, steps=1, wall_s=0.001)["top_ops_s"] == [
        ["aten::mm", 2e-05]
    ]


def test_a_frame_left_open_at_the_profilers_stop_encloses_nothing() -> None:
    """A Python frame whose return the profiler missed is closed at its stop: taken as a range, it would
    seem to enclose every later op of its thread. Ends a rounding apart are one end."""
    events = [
        host("python_function", "trainer/layer.py(10): forward", 0.0, 50.0),
        host("cpu_op", "aten::mm", 1.0, 10.0, ext=1),
        host(
            "python_function", "trainer/layers/attention.py(139): packed_attention", 20.0, 980.0
        ),  # never returned
        host("python_function", "trainer/experts.py(5): apply", 30.0, 10.001),  # rounding past its op
        host("cpu_op", "aten::_grouped_mm", 30.0, 10.0, ext=2),
        host("cpu_op", "aten::sum", 900.0, 100.0, ext=3),  # the last op: the profiler stopped after it
        kernel("gemm", 100.0, 30.0) | {"args": {"External id": 1}},
        kernel("grouped", 140.0, 20.0) | {"args": {"External id": 2}},
        kernel("sum", 1000.0, 10.0) | {"args": {"External id": 3}},
    ]
    ops = dict(summarize_trace({"traceEvents": events}, steps=1, wall_s=0.001)["top_ops_s"])
    assert ops == {
        "aten::mm @ trainer/layer.py(10): forward": 3e-05,
        "aten::_grouped_mm @ trainer/experts.py(5): apply": 2e-05,
        "aten::sum": 1e-05,
    }
