"""The memory model's mechanics, and its figures against what was measured on the H200."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cockpit.plan.configuration import Setup
from cockpit.plan.estimator import estimate
from cockpit.plan.geometry import geometry_from_config
from cockpit.plan.inputs import Assumptions, GiB, Inputs
from cockpit.plan.weights import Precision
from cockpit.profiles import PROFILES_DIR

ROOT = Path(__file__).resolve().parent.parent
CONFIG = json.loads((PROFILES_DIR / "models/qwen3-235b-a22b-thinking-2507/config.json").read_text())
H, E, W, V = 4096, 128, 1536, 151936


def slice_inputs(layers: int, experts_4bit: bool = False, process_rss_gib: float = 2.4) -> Inputs:
    geometry = geometry_from_config(CONFIG).with_layers(layers)
    return Inputs(
        geometry,
        Precision(experts_4bit=experts_4bit),
        ("q_proj", "k_proj", "v_proj", "o_proj"),
        16,
        Assumptions(process_rss_gib_gpu=process_rss_gib),
    )


H200 = Setup(gpus=1, seq_len=1024, gpu_mem_gib=139.8, host_ram_gib=128, gpu_name="NVIDIA H200")

# benchmarks/results/experts4bit_h200.md (one H200, story geometry, seq 1024, LoRA r=16 q/k/v/o, ZeRO-3,
# CPU AdamW, gradient checkpointing, bf16): (layers, NF4 experts, param offload) ->
# (GPU peak at load, GPU peak in training, host RSS after the engine, host RSS peak over the load), GiB.
# NF4 rows use the layerwise loader, bf16 rows from_pretrained (model.loader = "transformers").
MEASURED = {
    (1, True, "cpu"): (2.32, 4.22, 7.17, 13.97),
    (4, True, "cpu"): (2.32, 4.35, 11.98, 32.64),
    (1, True, "none"): (4.68, 5.38, 1.59, 8.39),
    (4, True, "none"): (8.26, 9.00, None, 22.31),
    (1, False, "cpu"): (9.82, 7.56, 11.62, 12.43),
    (4, False, "cpu"): (23.42, 7.69, 29.77, 30.52),
    (1, False, "none"): (9.85, 8.72, 1.58, 8.02),
    (4, False, "none"): (23.46, 22.35, None, 21.92),
}
# That benchmark's process before any weight: RSS after the engine of the bf16 no-offload 1-layer row
# (its GPU model, nothing pinned), not a trainer rank's 2.4 GiB.
BENCH_PROCESS_GIB = 1.58


@pytest.mark.parametrize("key", sorted(MEASURED), ids=lambda k: f"{k[0]}L-{'nf4' if k[1] else 'bf16'}-{k[2]}")
def test_h200_slices_match_the_measurements(key) -> None:
    """Within 10%; the load-phase and host figures are derived from the loaders' code, the training GPU
    peak leans on one constant fitted on these rows (LOGITS_EXTRA_BYTES), so it is held to 5% too."""
    layers, nf4, offload = key
    inputs = slice_inputs(layers, nf4, BENCH_PROCESS_GIB)
    setup = replace(H200, offload_param=offload, loader="layerwise" if nf4 else "transformers")
    e = estimate(inputs, setup)
    gpu_load, gpu_train, rss_train, rss_load = MEASURED[key]
    assert e.load.gpu_peak / GiB == pytest.approx(gpu_load, rel=0.05)
    assert e.train.gpu_peak / GiB == pytest.approx(gpu_train, rel=0.05)
    assert e.load.rss_peak / GiB == pytest.approx(rss_load, rel=0.10)
    if rss_train is not None:
        assert e.train.rss_peak / GiB == pytest.approx(rss_train, rel=0.05)


def test_layerwise_load_peak_is_one_layer_with_offload_and_grows_by_a_partition_without() -> None:
    """Offloaded, a GPU holds one layer being packed (or embeddings + lm_head) whatever the depth;
    without offload each layer adds its packed bytes (measured 1.196 GiB a layer), not 16-bit experts."""
    one, four = (estimate(slice_inputs(n, True), H200) for n in (1, 4))
    assert four.load.gpu_peak - one.load.gpu_peak < 0.05 * GiB
    embed_head = 2 * V * H * 2
    assert embed_head <= one.load.gpu_peak < embed_head + 0.2 * GiB
    no_off = replace(H200, offload_param="none")
    one, four = (estimate(slice_inputs(n, True), no_off) for n in (1, 4))
    packed_layer = E * 3 * H * W * (0.5 + 1 / 64) + H * (8192 * 2 + 512 * 2) * (0.5 + 1 / 64)
    assert (four.load.gpu_peak - one.load.gpu_peak) / 3 == pytest.approx(packed_layer, rel=0.02)


def test_from_pretrained_load_peak_is_the_whole_model_and_grows_with_depth() -> None:
    """With the transformers loader the model lands whole on the GPU, experts in 16 bit even when the
    trainer packs them afterwards: each extra layer adds its 16-bit experts."""
    fp = replace(H200, loader="transformers")
    for nf4 in (False, True):
        one, four = (estimate(slice_inputs(n, nf4), fp) for n in (1, 4))
        layer_16bit = 2 * E * 3 * H * W
        assert four.load.gpu_peak - one.load.gpu_peak == pytest.approx(3 * layer_16bit, rel=0.02)
        assert one.load.gpu_peak > 2 * (2 * V * H + E * 3 * H * W)
    # In training with offload only one layer is gathered: depth barely matters.
    one, four = (estimate(slice_inputs(n), fp) for n in (1, 4))
    assert four.train.gpu_peak - one.train.gpu_peak < 0.1 * one.train.gpu_peak


def test_layerwise_host_ram_holds_partitions_not_ranks_times_the_model() -> None:
    inputs = slice_inputs(4, True)
    four = estimate(inputs, replace(H200, gpus=4))
    one = estimate(inputs, H200)
    stored = inputs.weights.stored_bytes
    pinned4 = four.load.host["offload buffers"]
    # Four ranks pin a quarter each (rounded up to powers of two): about one model, not four.
    assert stored < pinned4 < 2 * stored
    assert pinned4 < 4 * one.load.host["offload buffers"] / 2
    # Packed experts' scales are parameters: nothing of them stays whole on a GPU.
    assert four.train.gpu["quantization state"] < 0.01 * GiB


def test_a_shared_load_maps_each_ranks_units_and_holds_two_layers_a_gpu() -> None:
    """Several ranks: each reads its own units (`contract.load_builder`: layers 0 and 2 and the rest on
    rank 0, layers 1 and 3 on rank 1) and holds its built layer beside the one it receives."""
    inputs = slice_inputs(4, True)
    w = inputs.weights
    one, two = estimate(inputs, H200), estimate(inputs, replace(H200, gpus=2))
    reads = w.checkpoint_reads(2)
    assert sum(reads) == w.checkpoint_bytes == w.checkpoint_reads(1)[0]
    assert reads[0] - reads[1] == pytest.approx(2 * V * H * 2, rel=0.01)  # the rest: embeddings + head
    assert one.load.rss["checkpoint pages"] == w.checkpoint_bytes
    assert two.load.rss["checkpoint pages"] == reads[0] < 0.6 * w.checkpoint_bytes
    assert two.load.page_cache == w.checkpoint_bytes  # one host: its two ranks read everything once
    assert two.load.gpu["one layer being loaded"] >= 2 * w.blocks["layer.0"]
    assert one.load.gpu["one layer being loaded"] < 2 * w.blocks["layer.0"]
    nodes = estimate(inputs, replace(H200, gpus=1, nodes=2))
    assert nodes.load.page_cache == reads[0]  # each host caches only its own rank's units


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
    assert one.train.gpu["gathered layers + lm_head"] == 0
    assert four.train.gpu["gathered layers + lm_head"] > 0
    stage2 = estimate(inputs, replace(H200, gpus=4, stage=2, offload_param="none"))
    assert stage2.train.gpu["weights (partition)"] == w.data_bytes


def test_without_checkpointing_offload_keeps_every_gathered_layer() -> None:
    inputs = slice_inputs(4)
    ckpt = estimate(inputs, H200)
    no_ckpt = estimate(inputs, replace(H200, grad_ckpt=False))
    layers = sum(v for k, v in inputs.weights.blocks.items() if k.startswith("layer."))
    assert no_ckpt.train.gpu["gathered layers + lm_head"] >= layers
    assert no_ckpt.train.gpu_peak > ckpt.train.gpu_peak + 2 * layers / 4


def test_prefetched_layers_are_gathered_beside_the_computing_one() -> None:
    """deepspeed.prefetch_layers = 1 keeps the next layer gathered too; on one rank with parameter offload
    (the overlapped fetch) the measured layers beyond the window stay gathered too, more with gradient
    accumulation, never more than the slice has; several ranks (DeepSpeed's own fetch) hold none beyond.
    And the DeepSpeed config lets the prefetched elements be live (the story's 3 prefetched: 4 layers and
    the head), or the prefetch would wait for this layer's release."""
    from cockpit.contract import GATHERED_BEYOND_PREFETCH, GATHERED_BEYOND_PREFETCH_ONE
    from cockpit.profiles import load_profile
    from trainer.ds_config import deepspeed_config, layer_elements

    inputs = slice_inputs(8, experts_4bit=True)
    layer = inputs.weights.largest_layer()[1]

    def gathered(**kw) -> int:
        return estimate(inputs, replace(H200, **kw)).train.gpu["gathered layers + lm_head"]

    now = gathered()
    assert gathered(prefetch_layers=1) - now == (1 + GATHERED_BEYOND_PREFETCH_ONE) * layer
    assert gathered(prefetch_layers=1, grad_accum=2) - now == (1 + GATHERED_BEYOND_PREFETCH) * layer
    assert gathered(prefetch_layers=6, grad_accum=2) - now == 7 * layer  # the whole slice, no more
    assert gathered(gpus=2, prefetch_layers=1, grad_accum=2) - gathered(gpus=2) == layer  # prefetched only
    profile, _ = load_profile("qwen3-235b-a22b-thinking-4xh100")
    assert profile.deepspeed.prefetch_layers == 3
    zero = deepspeed_config(profile)["zero_optimization"]
    head = inputs.weights.head_bytes() // 2  # elements of the 16-bit storage
    assert zero["stage3_max_live_parameters"] >= 4 * layer_elements(profile) + head
    assert zero["stage3_prefetch_bucket_size"] == 3 * layer_elements(profile)


def test_embeddings_kept_on_the_gpu_move_from_host_to_gpu_and_off_the_link() -> None:
    """deepspeed.embeddings_on_gpu under offload: the embedding and lm_head leave the pinned host buffers
    and the bytes a micro-batch copies, and sit on the GPU (whole at one rank; at four, each rank's
    partition besides the gathered whole); the lm_head is no longer counted among the gathered."""
    inputs = slice_inputs(4, experts_4bit=True)
    w = inputs.weights
    emb = w.embeddings_bytes()
    assert emb == w.blocks["embed"] + w.blocks["lm_head"] > 0
    host, kept = estimate(inputs, H200), estimate(inputs, replace(H200, embeddings_on_gpu=True))
    assert kept.train.gpu["embeddings kept on the GPU"] == emb
    assert host.train.gpu["embeddings kept on the GPU"] == 0
    assert (
        host.train.gpu["gathered layers + lm_head"] - kept.train.gpu["gathered layers + lm_head"]
        == w.head_bytes()
    )
    assert kept.pinned_exact == host.pinned_exact - emb  # one rank: the whole tensors leave the host
    assert w.moved_bytes(replace(H200, embeddings_on_gpu=True)) == w.moved_bytes(H200) - emb
    four = replace(H200, gpus=4, embeddings_on_gpu=True)
    assert estimate(inputs, four).train.gpu["embeddings kept on the GPU"] == emb + -(-emb // 4)
    # On the CPU there is no GPU to keep them on; without offload every weight is on the GPU already.
    assert not replace(H200, gpus=0, embeddings_on_gpu=True).keeps_embeddings
    none = replace(H200, offload_param="none", offload_optimizer="none", embeddings_on_gpu=True)
    assert w.moved_bytes(none) == w.moved_bytes(replace(none, embeddings_on_gpu=False))


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


def test_chunked_loss_holds_one_chunk_not_the_logits() -> None:
    """The trainer's chunked loss holds one chunk's fp32 logits and their 16-bit copy, plus the hidden
    states' gradient: a few hundred MiB at any length, where whole logits grow with the tokens."""
    from cockpit.contract import LOSS_CHUNK_BYTES, loss_chunk_rows
    from cockpit.plan.activations import activations

    g = geometry_from_config(CONFIG).with_layers(4)
    rows = loss_chunk_rows(V)
    assert rows * V * 4 <= LOSS_CHUNK_BYTES
    held = {}
    for seq in (1024, 4096, 8192):
        whole = activations(g, seq, 1, 2)
        chunked = activations(g, seq, 1, 2, chunked_loss=True, fast_paths=True)
        assert chunked.logits == rows * V * 6 + seq * H * 2
        assert chunked.layer_saved == whole.layer_saved and chunked.working(True) < whole.working(True)
        held[seq] = (whole.logits, chunked.logits)
    assert held[8192][1] - held[1024][1] == (8192 - 1024) * H * 2  # only the hidden states' gradient grows
    assert held[4096][0] > 5 * held[4096][1] and held[8192][0] > 10 * held[8192][1]


def test_memory_constant_is_the_committed_fit_and_bounds_the_fast_rows() -> None:
    """WORKING_LAYERS_FAST equals benchmarks/fit_memory.py over the committed rehearsal records, and with
    it the plan bounds every record and every step_speed row of the same code, in sample or out, within
    10%; the rows measured before FlashAttention-4, planned as that path, are bounded too."""
    from benchmarks import fit_memory as script
    from cockpit.plan.activations import WORKING_LAYERS_FAST

    records = script.record_lines()
    assert script.fit(records) == pytest.approx(WORKING_LAYERS_FAST)
    assert {x["tokens"] for x in records} == {16384, 32768}
    assert {x["offload"] for x in records} == {True, False}
    current = script.step_lines(json.loads(script.CURRENT.read_text()), "H100")
    assert len(current) >= 5
    for x in records + current:
        assert 0 <= x["error"] < 0.10, x
    earlier = script.step_lines(json.loads(script.EARLIER.read_text()), "H200", flash4=False)
    fast = [x for x in earlier if x["paths"] == "fast" and not x["offload"]]
    assert len(fast) > 20
    for x in fast:
        assert 0 <= x["error"] < 0.16, x
