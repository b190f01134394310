"""The story's plan (Qwen3-235B-A22B on 4 x H100-80GB, 960 GB) and the storage formats it rests on.

Expected figures come from arithmetic written here (parameter counts from the real config via the meta
model, bytes per weight from bitsandbytes' layout), not from the planner's own output.
"""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.forecast_consistency import RAN_AT
from cockpit.plan import Hardware, build_plan
from cockpit.plan.formats import four_bit, pow2_ceil
from cockpit.plan.inputs import GiB
from cockpit.profiles import PROFILES_DIR, load_profile
from tests.conftest import REPO

STORY = "qwen3-235b-a22b-thinking-4xh100"
CONFIG = json.loads((PROFILES_DIR / "models/qwen3-235b-a22b-thinking-2507/config.json").read_text())
H, L, E, W, V = 4096, 94, 128, 1536, 151936
ATTENTION = L * (H * 64 * 128 + 2 * H * 4 * 128 + 64 * 128 * H)
EXPERTS = L * E * 3 * H * W
SIXTEEN = 2 * V * H + L * (E * H + 2 * H + 2 * 128) + H  # embeddings, lm_head, routers, norms
NF4_DQ = 0.5 + 1 / 64 + 4 / (64 * 256)  # packed weight + 8-bit absmax per 64 + fp32 absmax per 256 blocks


# The planner's model is checked on the story at 4 rows a micro-batch and 2 a step, the profile's until 8 x 1
# rehearsed faster: there the fuller micro-batch is an option, and parameter offload is not required
# (`test_the_story_as_shipped_...` checks the profile as it ships).
EARLIER = RAN_AT


def story_plan(quantize_experts: bool = True, gpus: int = 4, gpu_mem: float = 80, host: float = 960):
    profile, _ = load_profile(STORY, EARLIER)
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


def test_packed_experts_match_the_trainers_layout() -> None:
    """A packed experts weight in the plan is the trainer's own `PackedLayout` (codes, scales, state)."""
    import torch

    from cockpit.plan.formats import packed_experts
    from trainer.nf4_pack import PackedLayout

    for experts, out, inp, dtype, name in (
        (E, 2 * W, H, torch.bfloat16, "bfloat16"),
        (E, H, W, torch.bfloat16, "bfloat16"),
        (8, 256, 512, torch.float32, "float32"),
    ):
        layout = PackedLayout(experts, out, inp, dtype)
        stored = packed_experts(experts, out, inp, name)
        assert stored.data_bytes == layout.nbytes
        size = torch.empty(0, dtype=dtype).element_size()
        assert stored.parts == tuple(math.prod(shape) * size for shape in layout.shapes().values())
        assert stored.state_bytes == 0  # scales are parameters: nothing stays whole on a GPU


def test_story_fits_because_the_loader_goes_layer_by_layer(plan) -> None:
    e = plan.configured
    assert e.setup.loader == "layerwise"
    assert e.fits
    # At load a GPU holds about one layer (its packed experts, 123 GB / 94 / 1.07e9 = 1.2 GiB, and the
    # 16-bit chunks streamed into them) or the embeddings and lm_head whole (2 x 1.16 GiB): a few GiB,
    # not the whole 4-bit model (115 GiB) that from_pretrained would put there.
    embed_head = 2 * V * H * 2
    assert embed_head <= e.load.gpu_peak < embed_head + 1 * GiB
    whole_nf4 = (ATTENTION + EXPERTS) * NF4_DQ + 2 * SIXTEEN
    # Host: each rank pins a quarter of the model (rounded up to powers of two), never the whole of it.
    assert whole_nf4 <= e.load.host_peak - e.load.host["ranks x process"] < 2 * whole_nf4
    assert "ranks x whole model" not in e.load.host
    assert "FITS as configured" in plan.verdict()
    required = " ".join(plan.requirements)
    assert "layer-by-layer loader" in required and "CPU offload" not in required
    # Without parameter offload the partitions (a quarter of 115 GiB) fit on an 80 GiB GPU, and the step is
    # no faster: the copies hide under compute.
    none = {o.label: o.estimate for o in plan.options}["no offload"]
    assert none.fits and none.setup.offload_param == "none"
    assert none.tokens_per_s >= e.tokens_per_s
    assert whole_nf4 / 4 < none.train.gpu_peak < 80 * GiB


def test_story_under_from_pretrained_needs_the_whole_model_per_gpu() -> None:
    """model.loader = "transformers": each rank holds the whole model on its GPU, experts still 16 bit."""
    profile, _ = load_profile(STORY)
    profile = profile.model_copy(
        update={"model": profile.model.model_copy(update={"loader": "transformers"})}
    )
    p = build_plan(profile, Hardware(4, "H100-80GB", 80, 960))
    e = p.configured
    assert e.setup.loader == "transformers"
    assert e.load.gpu_peak >= 2 * (ATTENTION + EXPERTS + SIXTEEN) * 0.9
    assert not e.fits and e.binding.name == "GPU memory at load"
    assert "DOES NOT FIT" in p.verdict()
    assert p.best is not None and p.best.setup.loader == "layerwise"


def test_offload_pins_power_of_two_partitions(plan) -> None:
    """Each rank pins a quarter of every (packed) tensor, each block rounded up to a power of two."""
    e = plan.configured
    per_layer = (
        2**28  # gate_up codes: 128 * 3072 * 4096 / 2 bytes / 4 ranks = 201 MB -> 256 MiB
        + 2**23  # gate_up scales: one byte per 64 weights: 6.3 MB -> 8 MiB
        + 2**17  # gate_up fp32 state: 128 * 4 * (768 + 1) / 4 = 98 KB -> 128 KiB
        + 2**27  # down codes: 100 MB -> 128 MiB
        + 2**22  # down scales: 3.1 MB -> 4 MiB
        + 2**16  # down state: 128 * 4 * (384 + 1) / 4 = 49 KB -> 64 KiB
        + 2 * 4096 * 8192 // 2 // 4  # q and o, packed: already powers of two
        + 2 * 4096 * 512 // 2 // 4  # k and v
        + 128 * 4096 * 2 // 4  # the router, bf16
    )
    # embed_tokens and lm_head stay on the GPUs (deepspeed.embeddings_on_gpu), the norms too (persistent)
    assert e.setup.keeps_embeddings
    assert e.pinned_rounded == L * per_layer
    assert e.pinned_rounded > 1.3 * e.pinned_exact


def test_experts_left_in_16_bit_show_the_difference(plan, plan16) -> None:
    from rich.console import Console

    from cockpit.plan.render import render

    w4, w16 = plan.inputs.weights.stored_bytes, plan16.inputs.weights.stored_bytes
    assert w16 - w4 == pytest.approx(EXPERTS * (2 - NF4_DQ), rel=1e-3)
    assert 455e9 < w16 < 465e9
    # 16-bit experts: only with parameter offload, ~4 x 107 GiB pinned (rounded up) in host RAM.
    assert plan16.best is not None and plan16.best.setup.offload_param == "cpu"
    assert 4 * w16 / 4 < plan16.best.train.host_peak < 960 * GiB
    assert plan16.alt_experts is not None and plan16.alt_found.best is not None
    console = Console(width=140, record=True)
    console.print(render(plan16))
    text = console.export_text()
    assert "left in 16 bit" in text
    assert f"{w16 / 1e9:,.1f} GB" in text and f"{w4 / 1e9:,.1f} GB" in text
    console = Console(width=140, record=True)
    console.print(render(plan))
    text = console.export_text()
    assert "if they stay" in text and "in 16 bit" in text


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
    # Host-to-device copies overlap compute (measured on one H100): the step is the longer of the two.
    for e in (plan.configured, plan16.configured):
        assert e.compute_s <= e.step_s <= max(e.compute_s, e.transfer_s)
    assert plan16.configured.step_s >= plan.configured.step_s


def test_step_time_comes_from_the_measured_costs() -> None:
    """compute = fixed + layers x per-layer + model FLOPs at the measured efficiency, the measured rate
    scaled by datasheet rates to the target GPU; a slower GPU only slows the FLOPs term."""
    from dataclasses import replace

    from cockpit.plan.estimator import micro_batch_flops
    from cockpit.plan.inputs import Assumptions, datasheet_tflops, inputs_for, resolve_geometry, setup_for
    from cockpit.plan.speed import MeasuredSpeed

    profile, _ = load_profile(STORY)
    speed = MeasuredSpeed("NVIDIA H200", 700.0, 0.05, 0.02, 0.5, 1.0, "test")
    a = Assumptions(speed=speed)
    hw = Hardware(4, "H100-80GB", 80, 960)
    plan = build_plan(profile, hw, a)
    _, flops = micro_batch_flops(inputs_for(profile, resolve_geometry(profile), a), setup_for(profile, hw))
    rate = 700.0 * datasheet_tflops("H100") / datasheet_tflops("H200")
    expected = 0.05 + 94 * 0.02 + flops / (rate * 1e12 * 0.5)
    assert plan.configured.compute_s == pytest.approx(expected, rel=1e-9)
    slower = build_plan(profile, Hardware(4, "A100-80GB", 80, 960), a).configured.compute_s
    ratio = datasheet_tflops("H100") / datasheet_tflops("A100")
    assert slower - (0.05 + 94 * 0.02) == pytest.approx((expected - 0.05 - 94 * 0.02) * ratio, rel=1e-9)

    # Offloaded copies overlap compute: the step is the longer of compute and the copies at the measured
    # factor of the link's rate.
    def step(factor: float) -> float:
        a = Assumptions(speed=replace(speed, copy_factor=factor))
        return build_plan(profile, hw, a).configured.step_s

    assert step(0.0) == pytest.approx(expected, rel=1e-9)
    bound = step(400.0)  # copies far longer than compute
    assert bound > 2 * expected and step(800.0) == pytest.approx(2 * bound, rel=1e-9)
    tiny, _ = load_profile("tiny-cpu")
    assert build_plan(tiny, Hardware(0, "", 0, 24)).configured.compute_s is None  # no GPU: no speed


def test_fuller_micro_batches_are_an_option_when_accumulation_halves() -> None:
    """The story's team accumulated 8 micro-batches of one row: 2 rows and 4 micro-batches are the same
    optimizer step, faster (fixed costs a micro-batch paid half as often) and needing more activation
    memory."""
    profile, _ = load_profile(STORY, ["training.micro_batch_size=1", "training.grad_accum=8"])
    plan = build_plan(profile, Hardware(4, "H100-80GB", 80, 960))
    wider = {o.label: o.estimate for o in plan.options}["2 rows a micro-batch, accumulation 4"]
    one = {o.label: o.estimate for o in plan.options}["no offload"]
    assert wider.setup.micro_batch == 2 and wider.setup.offload == one.setup.offload
    assert wider.tokens_per_s > one.tokens_per_s
    assert wider.train.gpu_peak > one.train.gpu_peak
    assert plan.best.setup.micro_batch == 2  # the fastest that fits on the profile's GPUs


def test_no_fuller_micro_batch_without_an_even_accumulation() -> None:
    profile, _ = load_profile(STORY, ["training.grad_accum=3"])
    assert not any("rows a micro-batch" in o.label for o in build_plan(profile).options)


def test_the_fastest_configuration_is_taken_by_the_overrides_the_plan_prints(plan) -> None:
    """The `--set` overrides printed beside the fastest that fits give a profile whose configured setup is
    that one, planned at the same speed."""
    sets = plan.best_overrides()
    # at 4 rows x 2 micro-batches, the fastest that fits is the 8 rows in one micro-batch
    assert "training.micro_batch_size=8" in sets and "training.grad_accum=1" in sets
    taken, _ = load_profile(STORY, EARLIER + sets)
    again = build_plan(taken)
    assert again.configured.setup == plan.best.setup
    assert again.configured.tokens_per_s == pytest.approx(plan.best.tokens_per_s)
    assert plan.to_dict()["best_overrides"] == sets


def test_the_story_as_shipped_is_its_fastest_that_fits_with_the_parameters_offloaded() -> None:
    """The profile ships the plan's fastest (8 rows, one micro-batch a step): nothing left to take. At that
    micro-batch the kept experts need the parameters offloaded on an 80 GiB GPU; without offload only the
    experts dequantized again fit, at a speed the model cannot tell from the shipped one."""
    from cockpit.plan.options import SPEED_TIE

    profile, _ = load_profile(STORY)
    shipped = build_plan(profile, Hardware(4, "H100-80GB", 80, 960))
    assert (profile.training.micro_batch_size, profile.training.grad_accum) == (8, 1)
    assert shipped.configured.fits and shipped.best.setup == shipped.configured.setup
    assert shipped.best_overrides() == []
    none, _ = load_profile(STORY, ['deepspeed.offload_param="none"', 'deepspeed.offload_optimizer="none"'])
    kept = build_plan(none, Hardware(4, "H100-80GB", 80, 960))
    assert not kept.configured.fits and kept.best is not None and not kept.best.setup.keep_dequant
    assert kept.best.tokens_per_s <= shipped.configured.tokens_per_s * (1 + SPEED_TIE)
    earlier = story_plan()
    assert shipped.configured.train.gpu_peak > earlier.configured.train.gpu_peak  # twice the activations


def test_the_dequant_path_keeps_a_layers_expert_weights_through_the_backward(monkeypatch) -> None:
    """At 8 rows of 4,096 (2,048 pairs an expert) the experts take the dequant path and keep the
    recompute's weights for the backward: both fused weights of one layer's experts, in bf16, on top of the
    recompute's transients; at 1 row (256 pairs an expert: the fused kernel) nothing is kept. The term
    bounds what one H100 measured with the weights kept and without, within 1.5 GiB."""
    from cockpit.contract import dequant_path
    from cockpit.plan import memory

    profile, _ = load_profile(STORY)
    hw = Hardware(4, "H100-80GB", 80, 960)

    def recompute(mb: int) -> float:
        t = profile.training.model_copy(update={"micro_batch_size": mb})
        plan = build_plan(profile.model_copy(update={"training": t}), hw)
        return plan.configured.train.gpu["layer recompute + backward"]

    kept = {mb: recompute(mb) for mb in (1, 8)}
    monkeypatch.setattr(memory, "dequant_path", lambda *args: False)
    planned = kept[8] - recompute(8)
    assert planned == E * 3 * H * W * 2
    assert kept[1] == recompute(1)
    assert dequant_path(4096 * 8, 8, E) and not dequant_path(4096, 8, E)

    results = json.loads((REPO / "benchmarks/results/step_speed_h100_keep_profile.json").read_text())
    peak = {r["name"]: r["result"]["cuda_peak_gib"] for r in results["rows"]}
    for layers in (4, 8):
        measured = (peak[f"keep-on-{layers}L-prof"] - peak[f"keep-off-{layers}L-prof"]) * GiB
        assert measured <= planned <= measured + 1.5 * GiB


def test_where_only_the_kept_weights_do_not_fit_the_plan_gives_them_back() -> None:
    """On GPUs of 50 GiB (46 usable) the story as shipped needs 48.5: its twin without the kept experts
    fits, and the plan recommends it by the override a user types; the options table says so."""
    profile, _ = load_profile(STORY)
    plan = build_plan(profile, Hardware(4, "H100-80GB", 50, 960))
    assert not plan.configured.fits
    assert plan.best is not None and plan.best.fits and not plan.best.setup.keep_dequant
    assert plan.best.setup.offload == plan.configured.setup.offload
    assert "training.keep_dequantized_experts=false" in plan.best_overrides()
    assert any(not o.estimate.setup.keep_dequant for o in plan.options)
    shipped = build_plan(profile, Hardware(4, "H100-80GB", 80, 960))
    assert shipped.best is not None and shipped.best.setup.keep_dequant  # where both fit, kept


def test_the_working_memory_follows_the_attention_kernel_the_gpu_runs() -> None:
    """Hopper plans FlashAttention-4's measured working memory; an A100, or COCKPIT_VARLEN_KERNEL=torch,
    the larger bound of torch's kernels; where only FlashAttention-4 fits, the plan requires it."""
    from cockpit.plan.activations import WORKING_LAYERS_FAST, WORKING_LAYERS_VARLEN
    from cockpit.plan.inputs import runs_flash4

    assert runs_flash4("NVIDIA H100 80GB HBM3", "") and runs_flash4("H200", "auto")
    assert not runs_flash4("A100-80GB", "") and not runs_flash4("H100-80GB", "torch")
    assert WORKING_LAYERS_FAST < WORKING_LAYERS_VARLEN
    profile, _ = load_profile(STORY)
    hopper = build_plan(profile, Hardware(4, "H100-80GB", 80, 960)).configured
    ampere = build_plan(profile, Hardware(4, "A100-80GB", 80, 960)).configured
    assert hopper.setup.flash4 and not ampere.setup.flash4
    assert ampere.train.gpu["layer recompute + backward"] > hopper.train.gpu["layer recompute + backward"]
    tight = build_plan(profile, Hardware(4, "H100-80GB", 60, 960))
    assert tight.configured.fits and any("FlashAttention-4" in r for r in tight.requirements)
    roomy = build_plan(profile, Hardware(4, "H100-80GB", 80, 960))
    assert not any("FlashAttention-4" in r for r in roomy.requirements)


def test_a_change_is_advised_only_when_modelled_faster_than_the_tie() -> None:
    """Where the copies hide under compute, no offload is modelled no faster than the shipped offload and
    the plan keeps what is configured; where the copies bound the step (a slow link), dropping the offload
    is modelled faster by more than SPEED_TIE and is advised."""
    from cockpit.plan.inputs import Assumptions
    from cockpit.plan.options import SPEED_TIE

    profile, _ = load_profile(STORY)
    hw = Hardware(4, "H100-80GB", 80, 960)
    shipped = build_plan(profile, hw)
    assert shipped.best.setup == shipped.configured.setup
    slow = Assumptions(h2d_gbps=2.0)
    plan = build_plan(profile, hw, slow)
    assert plan.configured.step_s > plan.configured.compute_s  # the copies bound it
    assert plan.best.setup.offload_param == "none"
    assert plan.best.tokens_per_s > plan.configured.tokens_per_s * (1 + SPEED_TIE)
