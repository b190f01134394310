"""The memory model's mechanics, and its figures against what was measured on the H200 (FACTS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cockpit.plan.geometry import geometry_from_config
from cockpit.plan.model import GiB, Inputs, Precision, Setup, estimate

ROOT = Path(__file__).resolve().parent.parent
CONFIG = json.loads((ROOT / "profiles/models/qwen3-235b-a22b-thinking-2507/config.json").read_text())
H, E, W, V = 4096, 128, 1536, 151936


def slice_inputs(layers: int, experts_4bit: bool = False) -> Inputs:
    geometry = geometry_from_config(CONFIG).with_layers(layers)
    return Inputs(
        geometry, Precision(experts_4bit=experts_4bit), ("q_proj", "k_proj", "v_proj", "o_proj"), 16
    )


H200 = Setup(gpus=1, seq_len=1024, gpu_mem_gib=139.8, host_ram_gib=128, gpu_name="NVIDIA H200")


def test_one_layer_slice_matches_the_h200_measurements() -> None:
    """FACTS.md, 1-layer slice of the 235B geometry, seq 1024, param + optimizer offload: GPU peak in
    training near 8.5 GiB, process RSS 12.4 GiB, step 0.23 s against 0.07 s without offload."""
    inputs = slice_inputs(1)
    offload = estimate(inputs, H200)
    assert offload.train.gpu_peak / GiB == pytest.approx(8.5, rel=0.15)
    assert offload.train.rss_peak / GiB == pytest.approx(12.4, rel=0.15)
    no_offload = estimate(inputs, replace(H200, offload_param="none"))
    assert offload.step_s == pytest.approx(0.23, rel=0.25)
    assert 2.0 < offload.step_s / no_offload.step_s < 5.0


def test_load_peak_is_the_whole_model_and_grows_with_depth() -> None:
    """At load the quantized model lands whole on the GPU; each extra layer adds its 16-bit experts."""
    one, four = (estimate(slice_inputs(n), H200) for n in (1, 4))
    layer_16bit = 2 * E * 3 * H * W
    assert four.load.gpu_peak - one.load.gpu_peak == pytest.approx(3 * layer_16bit, rel=0.02)
    assert one.load.gpu_peak > 2 * (2 * V * H + E * 3 * H * W)  # embeddings, lm_head and the experts, in bf16
    # In training with offload only one layer is gathered: depth barely matters.
    assert four.train.gpu_peak - one.train.gpu_peak < 0.1 * one.train.gpu_peak


def test_partitions_scale_with_gpus_without_offload() -> None:
    inputs = slice_inputs(4, experts_4bit=True)
    one = estimate(inputs, replace(H200, offload_param="none"))
    four = estimate(inputs, replace(H200, gpus=4, offload_param="none"))
    w = inputs.weights
    assert one.train.gpu["weights (partition)"] + one.train.gpu["persistent small params"] == w.data_bytes
    assert four.train.gpu["weights (partition)"] == pytest.approx(
        (w.data_bytes - four.train.gpu["persistent small params"]) / 4, rel=1e-3
    )
    # One GPU: the partition is the gathered weight; several: a gathered layer comes on top.
    assert one.train.gpu["gathered layer + lm_head"] == 0
    assert four.train.gpu["gathered layer + lm_head"] > 0
    stage2 = estimate(inputs, replace(H200, gpus=4, stage=2, offload_param="none"))
    assert stage2.train.gpu["weights (partition)"] == w.data_bytes


def test_without_checkpointing_offload_keeps_every_gathered_layer() -> None:
    inputs = slice_inputs(4)
    ckpt = estimate(inputs, H200)
    no_ckpt = estimate(inputs, replace(H200, grad_ckpt=False))
    layers = sum(v for k, v in inputs.weights.blocks.items() if k.startswith("layer."))
    assert no_ckpt.train.gpu["gathered layer + lm_head"] >= layers
    assert no_ckpt.train.gpu_peak > ckpt.train.gpu_peak + 2 * layers / 4


def test_host_placement_counts_a_whole_model_per_rank() -> None:
    inputs = slice_inputs(2, experts_4bit=True)
    e = estimate(inputs, replace(H200, gpus=4, load_on="host"))
    assert e.load.host["ranks x whole model"] >= 4 * inputs.weights.stored_bytes
    assert e.load.gpu_peak < inputs.weights.stored_bytes


def test_cpu_profile_fits_and_has_no_gpu_checks() -> None:
    from cockpit.plan import build_plan
    from cockpit.plan.hardware import Hardware
    from cockpit.profiles import load_profile

    profile, _ = load_profile("tiny-cpu")
    plan = build_plan(profile, Hardware(0, "", 0, 16))
    assert plan.configured.fits
    assert {c.name for c in plan.configured.checks} == {"host RAM at load", "host RAM in training"}
    assert plan.options == [] and plan.best is None


def test_the_arithmetic_imports_neither_torch_nor_textual() -> None:
    code = (
        "import sys; from cockpit.profiles import load_profile; "
        "from cockpit.plan import build_plan, Hardware; "
        "from cockpit.plan.render import render; from cockpit.plan.audit import compare_audit; "
        "p, _ = load_profile('qwen3-235b-a22b-thinking-4xh100'); "
        "build_plan(p, Hardware(4, 'H100', 80, 960)); "
        "bad = [m for m in ('torch', 'textual', 'transformers') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""}
    )
