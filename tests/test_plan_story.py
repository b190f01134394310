"""The story's plan (Qwen3-235B-A22B on 4 x H100-80GB, 960 GB) and the storage formats it rests on.

Expected figures come from arithmetic written here (parameter counts from the real config via the meta
model, bytes per weight from bitsandbytes' layout), not from the planner's own output.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cockpit.plan import Hardware, build_plan
from cockpit.plan.formats import four_bit, pow2_ceil
from cockpit.plan.model import GiB
from cockpit.profiles import load_profile

STORY = "qwen3-235b-a22b-thinking-4xh100"
CONFIG = json.loads(
    (
        Path(__file__).resolve().parent.parent / "profiles/models/qwen3-235b-a22b-thinking-2507/config.json"
    ).read_text()
)
H, L, E, W, V = 4096, 94, 128, 1536, 151936
ATTENTION = L * (H * 64 * 128 + 2 * H * 4 * 128 + 64 * 128 * H)
EXPERTS = L * E * 3 * H * W
SIXTEEN = 2 * V * H + L * (E * H + 2 * H + 2 * 128) + H  # embeddings, lm_head, routers, norms
NF4_DQ = 0.5 + 1 / 64 + 4 / (64 * 256)  # packed weight + 8-bit absmax per 64 + fp32 absmax per 256 blocks


def story_plan(quantize_experts: bool = True, gpus: int = 4, gpu_mem: float = 80, host: float = 960):
    profile, _ = load_profile(STORY)
    q = profile.quantization.model_copy(update={"quantize_experts": quantize_experts})
    profile = profile.model_copy(update={"quantization": q})
    return build_plan(profile, Hardware(gpus, "H100-80GB", gpu_mem, host))


@pytest.fixture(scope="module")
def plan():
    return story_plan()


@pytest.fixture(scope="module")
def plan16():
    return story_plan(quantize_experts=False)


def test_four_bit_layout_matches_bitsandbytes() -> None:
    import bitsandbytes.functional as bnb
    import torch

    a = torch.randn(300, 100, dtype=torch.bfloat16)
    for dq in (True, False):
        for storage, name in (
            (torch.bfloat16, "bfloat16"),
            (torch.uint8, "uint8"),
            (torch.float32, "float32"),
        ):
            packed, state = bnb.quantize_4bit(
                a, quant_type="nf4", compress_statistics=dq, quant_storage=storage
            )
            parts = [state.absmax, state.code] + (
                [state.state2.absmax, state.state2.code, state.offset] if dq else []
            )
            stored = four_bit(a.numel(), dq, name)
            assert stored.data_bytes == packed.numel() * packed.element_size()
            assert stored.data_numel == packed.numel()
            assert stored.state_bytes == sum(t.numel() * t.element_size() for t in parts)


def test_pinned_rounding() -> None:
    assert [pow2_ceil(n) for n in (1, 2, 3, 1000, 1024, 1025)] == [1, 2, 4, 1024, 1024, 2048]


def test_weights_about_470_gb_in_bf16_and_120_to_130_in_nf4(plan) -> None:
    rows = {r["kind"]: r for r in plan.kind_table()}
    bf16 = sum(r["bf16"] for r in rows.values())
    assert bf16 == 2 * (ATTENTION + EXPERTS + SIXTEEN)
    assert 465e9 < bf16 < 475e9
    planned = sum(r["planned"] for r in rows.values())
    expected = (ATTENTION + EXPERTS) * NF4_DQ + 2 * SIXTEEN
    assert planned == pytest.approx(expected, rel=1e-3)
    assert 120e9 < planned < 130e9
    assert rows["experts"]["planned_4bit_params"] == EXPERTS


def test_story_verdict_names_cpu_offload(plan) -> None:
    e = plan.configured
    whole_nf4 = (ATTENTION + EXPERTS) * NF4_DQ + 2 * SIXTEEN
    # The trainer loads each rank's whole model onto its GPU: more than an 80 GiB H100 holds.
    assert e.load.gpu_peak >= whole_nf4 > 80 * GiB
    assert not e.fits
    assert e.binding.name == "GPU memory at load"
    assert "does not fit" in plan.verdict().lower()
    required = " ".join(plan.requirements)
    assert "CPU offload" in required
    assert plan.best is not None and plan.best.fits
    assert plan.best.setup.load_on == "host"
    # Loading into host RAM: every rank holds the whole model there; it must fit the story's 960 GB.
    assert 4 * whole_nf4 <= plan.best.load.host_peak < 960 * GiB


def test_offload_pins_power_of_two_partitions(plan) -> None:
    """Each rank pins a quarter of every (packed) tensor, each block rounded up to a power of two."""
    e = plan.configured
    per_layer = (
        2**28  # gate_up: 128 * 3072 * 4096 / 2 bytes / 4 ranks = 201 MB -> 256 MiB
        + 2**27  # down: 100 MB -> 128 MiB
        + 2 * 4096 * 8192 // 2 // 4  # q and o, packed: already powers of two
        + 2 * 4096 * 512 // 2 // 4  # k and v
        + 128 * 4096 * 2 // 4  # the router, bf16
    )
    embeddings = 2 * 2**29  # embed_tokens and lm_head: 311 MB -> 512 MiB each; norms stay on the GPU
    assert e.pinned_rounded == L * per_layer + embeddings
    assert e.pinned_rounded > 1.3 * e.pinned_exact


def test_experts_left_in_16_bit_show_the_difference(plan, plan16) -> None:
    from rich.console import Console

    from cockpit.plan.render import render

    w4, w16 = plan.inputs.weights.stored_bytes, plan16.inputs.weights.stored_bytes
    assert w16 - w4 == pytest.approx(EXPERTS * (2 - NF4_DQ), rel=1e-3)
    assert 455e9 < w16 < 465e9
    # 16-bit experts: even host RAM at load is out of reach (4 ranks x the whole model), nothing fits.
    assert plan16.best is None
    assert plan16.alt_experts is not None and plan16.alt_found.best is not None
    console = Console(width=140, record=True)
    console.print(render(plan16))
    text = console.export_text()
    assert "left in 16 bit" in text
    assert f"{w16 / 1e9:,.1f} GB" in text and f"{w4 / 1e9:,.1f} GB" in text
    console = Console(width=140, record=True)
    console.print(render(plan))
    text = console.export_text()
    assert "if they stay in 16 bit" in text and "no option fits" in text


def test_more_gpus_and_shorter_sequences_are_options(plan) -> None:
    labels = [o.label for o in plan.options]
    assert labels[:4] == ["no offload", "optimizer offload", "param + optimizer offload", "NVMe offload"]
    assert "fewer GPUs (2)" in labels and "more GPUs (8)" in labels
    assert "shorter sequences (2048)" in labels
    seq = {o.label: o.estimate for o in plan.options}
    assert seq["shorter sequences (1024)"].train.gpu_peak < seq["shorter sequences (2048)"].train.gpu_peak


def test_sixteen_bit_experts_cost_four_times_the_copies(plan, plan16) -> None:
    """Offloaded steps move each layer's stored bytes: 16-bit experts about four times the 4-bit ones."""
    ratio = plan16.configured.transfer_s / plan.configured.transfer_s
    assert 3.4 < ratio < 4.0
    assert math.isclose(plan.configured.step_s, max(plan.configured.compute_s, plan.configured.transfer_s))
