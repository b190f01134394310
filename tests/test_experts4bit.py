"""NF4 experts on the built-in tiny Qwen3-MoE (CPU): accuracy, routing, gradients, audit, load path.

The reference is the same model with its experts in fp32. NF4 quantization of random Gaussian weights
has a relative weight error of about 9 % (bitsandbytes' own NF4 gives the same figure); the MoE block
output, three quantized matmuls deep, about 16 %; a decoder layer's output, residual included, about
1 %. The bounds below sit around those figures, so a broken packing or a wrong expert order fails.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # the Triton kernels run on the CPU only in Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

from cockpit.profiles import ProfileError, load_profile, parse_profile, profile_to_dict
from devtools.faults import Watch, run_watched
from trainer.audit import EngineFacts, build_audit
from trainer.layers import experts4bit
from trainer.layers.experts4bit import NF4Experts
from trainer.layers.experts_model import (
    expert_lora_state_dict,
    load_expert_lora,
    quantize_model_experts,
    set_moe_leaf_modules,
)
from trainer.model import attach_lora, lora_matches, parameter_census
from trainer.nf4_pack import PackedLayout, dequantize_experts_nf4, quantize_experts_nf4
from trainer.weights.loader import load_layerwise

REPO = Path(__file__).resolve().parent.parent


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.fixture(scope="session")
def reference(tiny_dir: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def quantized(reference):
    model = copy.deepcopy(reference)
    assert quantize_model_experts(model, torch.float32) == len(model.model.layers)
    return model.eval()


def tiny_profile(**quantization):
    profile, _ = load_profile("tiny-cpu")
    q = profile.quantization.model_copy(update=quantization)
    return profile.model_copy(update={"quantization": q})


def test_packing_matches_bitsandbytes_nf4_error():
    import bitsandbytes.functional as bnbf

    torch.manual_seed(0)
    w = torch.randn(4, 384, 128) * 0.02
    layout = PackedLayout(4, 384, 128, torch.bfloat16)
    packed = quantize_experts_nf4(lambda e: w[e], layout, "cpu", chunk=3)  # chunks must not change anything
    assert {k: tuple(v.shape) for k, v in packed.items()} == {k: tuple(s) for k, s in layout.shapes().items()}
    assert sum(v.numel() * v.element_size() for v in packed.values()) == layout.nbytes
    assert all(v.dtype == torch.bfloat16 for v in packed.values())
    ours = dequantize_experts_nf4(packed, layout, list(range(4)), torch.float32)
    codes, state = bnbf.quantize_4bit(w.reshape(-1), blocksize=64, compress_statistics=True, quant_type="nf4")
    theirs = bnbf.dequantize_4bit(codes, state).reshape(w.shape)
    assert 0.05 < rel(ours, w) < 0.12
    assert abs(rel(ours, w) - rel(theirs, w)) < 0.002
    # One expert on its own is the same as that expert dequantized with the others.
    assert torch.equal(dequantize_experts_nf4(packed, layout, 2, torch.float32), ours[2])
    assert torch.equal(dequantize_experts_nf4(packed, layout, [3, 1], torch.float32), ours[[3, 1]])


def test_block_output_within_nf4_error_and_exact_on_dequantized_weights(reference, quantized):
    torch.manual_seed(1)
    x = torch.randn(96, reference.config.hidden_size)
    for ref_layer, q_layer in zip(reference.model.layers, quantized.model.layers, strict=True):
        experts = q_layer.mlp.experts
        assert isinstance(experts, NF4Experts)
        with torch.no_grad():
            _, weights, index = ref_layer.mlp.gate(x)
            want = ref_layer.mlp.experts(x, index, weights)
            got = experts(x, index, weights)
            # transformers' own experts forward on the dequantized weights: only float rounding apart.
            same = copy.deepcopy(ref_layer.mlp.experts)
            all_experts = list(range(experts.num_experts))
            same.gate_up_proj.copy_(experts.dequantize("gate_up_proj", all_experts))
            same.down_proj.copy_(experts.dequantize("down_proj", all_experts))
            exact = same(x, index, weights)
        assert rel(got, exact) < 1e-5
        assert 0.08 < rel(got, want) < 0.25  # three NF4 matmuls deep: the NF4 range, not noise


def test_grouped_and_looped_expert_paths_agree(reference, monkeypatch):
    """The grouped-GEMM forward (used on GPUs) and the per-expert loop give the same outputs and gradients."""
    experts = NF4Experts.from_fused(reference.model.layers[1].mlp.experts, torch.float32)
    experts.chunk_experts = 3  # several chunks, some experts without tokens
    experts.add_lora(4, 8.0, 0.0)
    with torch.no_grad():
        for p in experts.lora_parameters().values():
            p.normal_(0, 0.05)
    torch.manual_seed(5)
    x0, logits0 = torch.randn(40, reference.config.hidden_size), torch.randn(40, experts.num_experts)
    results = {}
    for mode in ("loop", "grouped"):
        monkeypatch.setenv("COCKPIT_NF4_EXPERTS", mode)
        x, logits = x0.clone().requires_grad_(True), logits0.clone().requires_grad_(True)
        weights, index = torch.topk(logits.softmax(-1), 2)
        out = experts(x, index, weights)
        out.pow(2).sum().backward()
        grads = {n: p.grad.clone() for n, p in experts.lora_parameters().items()}
        experts.zero_grad()
        results[mode] = (out.detach(), x.grad, logits.grad, grads)
    loop, grouped = results["loop"], results["grouped"]
    assert not NF4Experts.grouped_failed
    for a, b in zip(loop[:3], grouped[:3], strict=True):
        assert rel(b, a) < 1e-5
    for name, g in loop[3].items():
        assert g.abs().sum() > 0 and rel(grouped[3][name], g) < 1e-5


def small_experts(lora: bool) -> NF4Experts:
    """4 experts, hidden 64, width 64: small enough for Triton's interpreter."""
    torch.manual_seed(6)
    experts = NF4Experts(4, 64, 64, torch.nn.SiLU(), torch.float32, torch.float32, device="meta")
    gate_up, down = torch.randn(4, 128, 64) * 0.05, torch.randn(4, 64, 64) * 0.05
    experts.load_weights({"gate_up_proj": lambda e: gate_up[e], "down_proj": lambda e: down[e]}, "cpu")
    if lora:
        experts.add_lora(4, 8.0, 0.0)
        with torch.no_grad():
            for p in experts.lora_parameters().values():
                p.normal_(0, 0.05)
    return experts


def run_experts(experts: NF4Experts, mode: str, monkeypatch: pytest.MonkeyPatch):
    """Forward and backward on 12 tokens, top-2, one pair routed to no expert (index = num_experts)."""
    monkeypatch.setenv("COCKPIT_NF4_EXPERTS", mode)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(12, experts.hidden_dim, generator=gen).requires_grad_(True)
    logits = torch.randn(12, experts.num_experts, generator=gen).requires_grad_(True)
    weights, index = torch.topk(logits.softmax(-1), 2)
    index = index.clone()
    index[3, 1] = experts.num_experts
    out = experts(x, index, weights)
    out.pow(2).sum().backward()
    grads = {n: p.grad.clone() for n, p in experts.lora_parameters().items()}
    experts.zero_grad()
    return out.detach(), x.grad, logits.grad, grads


@pytest.mark.parametrize("mode", ["fused", "dequant"])
def test_kernel_paths_agree_with_the_loop(mode, monkeypatch):
    """The Triton paths (interpreter) give the loop's outputs and gradients, expert LoRA included."""
    pytest.importorskip("triton")
    from trainer.kernels import triton_status

    assert triton_status(torch.device("cpu"))[0]
    experts = small_experts(lora=True)
    called = {}
    real = experts.packed_mm

    def spy(*args, **kwargs):
        called[kwargs["path"]] = called.get(kwargs["path"], 0) + 1
        return real(*args, **kwargs)

    monkeypatch.setattr(experts, "packed_mm", spy)
    loop = run_experts(experts, "loop", monkeypatch)
    got = run_experts(experts, mode, monkeypatch)
    assert called == {mode: 4}  # two weights forward, their two input gradients backward
    assert not NF4Experts.kernels_failed
    for a, b in zip(loop[:3], got[:3], strict=True):
        assert rel(b, a) < 1e-5
    for name, g in loop[3].items():
        assert g.abs().sum() > 0 and rel(got[3][name], g) < 1e-5


def test_path_choice_and_fallbacks(monkeypatch, caplog):
    x = torch.zeros(2, 4)
    for mode, want in (("auto", "grouped"), ("grouped", "grouped"), ("loop", "loop"), ("bogus", "grouped")):
        monkeypatch.setenv("COCKPIT_NF4_EXPERTS", mode)
        assert experts4bit.expert_path(x, 1000.0) == want
    # Kernels that cannot run here: the bitsandbytes path, said once.
    import trainer.kernels

    monkeypatch.setattr(trainer.kernels, "triton_status", lambda device: (False, "no Triton in this test"))
    monkeypatch.setenv("COCKPIT_NF4_EXPERTS", "fused")
    assert experts4bit.expert_path(x) == "grouped"
    assert "no Triton in this test" in caplog.text


def test_a_failing_kernel_falls_back_to_bitsandbytes(monkeypatch):
    pytest.importorskip("triton")
    from trainer.kernels import nf4_triton

    experts = small_experts(lora=False)
    want = run_experts(experts, "grouped", monkeypatch)

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel image for this device")

    monkeypatch.setattr(nf4_triton, "nf4_grouped_mm", broken)
    monkeypatch.setattr(NF4Experts, "kernels_failed", False)
    got = run_experts(experts, "fused", monkeypatch)
    assert NF4Experts.kernels_failed
    assert all(torch.equal(a, b) for a, b in zip(want[:3], got[:3], strict=True))


def test_routing_identical_and_layer_outputs_close(reference, quantized):
    torch.manual_seed(2)
    ids = torch.randint(0, reference.config.vocab_size, (2, 48))
    layers: dict[str, list] = {"ref": [], "q": []}
    blocks: dict[str, list] = {"ref": [], "q": []}
    routes: dict[str, list] = {"ref": [], "q": []}

    def grab(store: list, what: str):
        def hook(module, args, output):
            store.append(args[0].detach() if what == "input" else output.detach())

        return hook

    def spy(store: list):
        def hook(module, args):
            store.append((args[1].clone(), args[2].detach().clone()))  # (top_k_index, top_k_weights)

        return hook

    handles = []
    for tag, model in (("ref", reference), ("q", quantized)):
        for layer in model.model.layers:
            handles.append(layer.register_forward_hook(grab(layers[tag], "output")))
            handles.append(layer.mlp.register_forward_hook(grab(blocks[tag], "input")))
            handles.append(layer.mlp.experts.register_forward_pre_hook(spy(routes[tag])))
    with torch.no_grad():
        logits_ref, logits_q = reference(ids).logits, quantized(ids).logits
        for out_ref, out_q in zip(layers["ref"], layers["q"], strict=True):
            assert rel(out_q, out_ref) < 0.03  # decoder layer output, residual included: about 1e-2
        assert rel(logits_q, logits_ref) < 0.04
        # Fed the same block input, the NF4 block sends the same tokens to the same experts with the same
        # weights as the fp32 block: its router is untouched and the experts module honours its routing.
        inputs = list(blocks["ref"])
        routes["ref"].clear()
        routes["q"].clear()
        for x, ref_layer, q_layer in zip(inputs, reference.model.layers, quantized.model.layers, strict=True):
            ref_layer.mlp(x)
            q_layer.mlp(x)
    for h in handles:
        h.remove()
    assert len(routes["q"]) == len(reference.model.layers)
    for (i_ref, w_ref), (i_q, w_q) in zip(routes["ref"], routes["q"], strict=True):
        assert torch.equal(i_ref, i_q) and torch.equal(w_ref, w_q)


def test_gradients_reach_lora_and_match_reference(reference, quantized):
    profile = tiny_profile()
    profile = profile.model_copy(
        update={"training": profile.training.model_copy(update={"gradient_checkpointing": True})}
    )
    grads = {}
    for tag, base in (("ref", reference), ("q", quantized)):
        torch.manual_seed(3)
        model = attach_lora(profile, copy.deepcopy(base))
        with torch.no_grad():  # B starts at zero; give it values so that A gets gradients too
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.02)
        model.train()
        ids = torch.randint(0, base.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(4))
        model(input_ids=ids, labels=ids).loss.backward()
        grads[tag] = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        assert all(g.abs().sum() > 0 for g in grads[tag].values()), "a LoRA parameter got no gradient"
        assert sum(lora_matches(model, list(profile.lora.target_modules)).values()) == 16
    assert grads["ref"].keys() == grads["q"].keys()
    for name, g_ref in grads["ref"].items():
        cos = torch.nn.functional.cosine_similarity(g_ref.flatten(), grads["q"][name].flatten(), dim=0)
        assert cos > 0.9, f"{name}: gradient direction off (cosine {cos:.3f})"


def test_expert_lora_trains_only_itself_and_gets_gradients(quantized, tmp_path):
    profile = tiny_profile(quantize_experts=True)
    profile = profile.model_copy(update={"lora": profile.lora.model_copy(update={"target_experts": True})})
    model = attach_lora(profile, copy.deepcopy(quantized))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    expert_lora = {n for n in trainable if ".experts.lora_" in n}
    assert len(expert_lora) == 4 * len(quantized.model.layers)
    assert not any(("_nf4" in n or "_absmax" in n or "_qstate" in n) for n in trainable)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".experts.lora_B" in name:
                p.normal_(0, 0.02)
    ids = torch.randint(0, quantized.config.vocab_size, (2, 32))
    model(input_ids=ids, labels=ids).loss.backward()
    for name, p in model.named_parameters():
        if name in expert_lora:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    # What the trainer saves beside the PEFT adapter loads back into a fresh model.
    from safetensors.torch import save_file

    path = tmp_path / "expert_lora.safetensors"
    save_file(expert_lora_state_dict(model), str(path), metadata={"r": "32", "alpha": "64.0"})
    fresh = attach_lora(tiny_profile(quantize_experts=True), copy.deepcopy(quantized))
    assert load_expert_lora(fresh, str(path)) == len(expert_lora)
    restored = dict(fresh.named_parameters())
    for name, p in model.named_parameters():
        if name in expert_lora:
            assert torch.equal(restored[name], p)
    # Evaluation loads both halves of the adapter: the same logits as the trained model.
    from trainer.evaluation.evaluate import load_finetuned

    adapter = tmp_path / "adapter"
    model.save_pretrained(str(adapter))
    save_file(expert_lora_state_dict(model), str(adapter / path.name), metadata={"r": "32", "alpha": "64.0"})
    finetuned = load_finetuned(copy.deepcopy(quantized), adapter)
    model.eval()
    with torch.no_grad():
        want, got = model(input_ids=ids).logits, finetuned(input_ids=ids).logits
        base = quantized(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(base, want, atol=1e-3)  # the expert LoRA is what makes the difference


def test_layerwise_loader_reproduces_from_pretrained(tiny_dir, reference):
    loaded: list[tuple[int, int]] = []  # the `load_progress` events the trainer writes from it
    model, facts = load_layerwise(
        tiny_profile(load_in_4bit=False, quantize_experts=False),
        tiny_dir,
        torch.device("cpu"),
        None,
        progress=lambda done, total: loaded.append((done, total)),
    )
    assert loaded == [(k, 4) for k in range(1, 5)]
    assert facts["unused_checkpoint_tensors"] == 0 and facts["experts_16bit"] == 4
    want, got = reference.state_dict(), model.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_audit_counts_packed_experts_at_logical_size(tiny_dir):
    profile = tiny_profile(quantize_experts=True)
    model, facts = load_layerwise(profile, tiny_dir, torch.device("cpu"), None)
    assert facts["experts_nf4"] == 4 and facts["linear_4bit"] == 16
    assert set_moe_leaf_modules(model) == ["Qwen3MoeSparseMoeBlock"]
    assert all(
        getattr(m, "_z3_leaf", False) for m in model.modules() if type(m).__name__ == "Qwen3MoeSparseMoeBlock"
    )
    census = parameter_census(model)
    c = model.config
    logical = c.num_hidden_layers * c.num_experts * 3 * c.hidden_size * c.moe_intermediate_size
    assert census["experts"] == {"params": logical, "params_4bit": logical, "trainable": 0}
    assert census["attention"]["params_4bit"] == census["attention"]["params"] > 0
    audit = build_audit(profile, census, {"q_proj": 4}, EngineFacts(None, None, None, False), True, True)
    assert audit["fraction_4bit_body"] >= 0.99
    # The 16-bit embeddings and head are 4 % of the tiny model's parameters (0.5 % of the story's).
    assert audit["fraction_4bit"] >= 0.95
    assert not [w for w in audit["warnings"] if w.startswith("experts")]
    # The same model with its experts left in 16 bit: the audit says so.
    plain, _ = load_layerwise(tiny_profile(quantize_experts=False), tiny_dir, torch.device("cpu"), None)
    audit = build_audit(
        profile, parameter_census(plain), {"q_proj": 4}, EngineFacts(None, None, None, False), True, True
    )
    assert audit["fraction_4bit_body"] < 0.1
    assert any(w.startswith("experts") for w in audit["warnings"])


def test_moe_blocks_found_when_zero3_has_partitioned_the_experts(reference):
    """Under ZeRO-3 a partitioned parameter's data is empty: the MoE block must still be made a leaf."""
    model = copy.deepcopy(reference)
    for layer in model.model.layers:
        for p in (layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj):
            p.ds_shape = p.shape  # what deepspeed.zero.Init leaves behind
            p.data = torch.empty(0)
    assert set_moe_leaf_modules(model) == ["Qwen3MoeSparseMoeBlock"]
    assert all(layer.mlp._z3_leaf for layer in model.model.layers)


def test_profile_guards():
    profile, path = load_profile("tiny-cpu")
    data = profile_to_dict(profile)
    data["lora"]["target_experts"] = True
    data["quantization"]["quantize_experts"] = False
    with pytest.raises(ProfileError, match="target_experts needs"):
        parse_profile(data, str(path))
    data = profile_to_dict(profile)
    data["training"]["bf16"] = True
    data["quantization"]["storage_dtype"] = "float32"
    with pytest.raises(ProfileError, match="scramble"):
        parse_profile(data, str(path))


@pytest.mark.e2e
def test_two_zero3_ranks_with_uneven_routing_finish(tmp_path, tiny_dir):
    """Two CPU ranks, one of which sends every token to the same experts: no hang, both train."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COCKPIT_CACHE": str(Path(tiny_dir).parent)}
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", str(port)]
    cmd.append(str(REPO / "tests" / "zero3_two_ranks.py"))
    done = run_watched(cmd, Watch(record=tmp_path), env=env, cwd=tmp_path)
    results = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("result-rank*.json"))]
    assert len(results) == 2, done.stdout[-3000:] + done.stderr[-3000:]
    by_rank = {r["rank"]: r for r in results}
    assert len(by_rank[0]["experts_hit_layer0"]) > len(by_rank[1]["experts_hit_layer0"]) == 2
    assert by_rank[1]["losses"][-1] < by_rank[1]["losses"][0]  # the repeated token is learned


def test_spread_placement_and_input_moves():
    from trainer.weights.loader import _move, spread_devices

    cpu, meta = torch.device("cpu"), torch.device("meta")
    placement = spread_devices(10, [cpu, meta, cpu])
    assert placement == [cpu] * 4 + [meta] * 3 + [cpu] * 3  # contiguous blocks, first the largest
    nested = ((torch.ones(2), [torch.zeros(1)]), {"mask": torch.ones(1), "cache": object()}, 3)
    moved = _move(nested, meta)
    assert moved[0][0].is_meta and moved[0][1][0].is_meta and moved[1]["mask"].is_meta
    assert moved[1]["cache"] is nested[1]["cache"] and moved[2] == 3
    from trainer.weights.loader import follow_inputs

    layer = torch.nn.Linear(4, 3, device="meta")  # another device than its input's
    follow_inputs(layer, meta)
    assert layer(input=torch.ones(2, 4)).is_meta  # without the hook: a device mismatch


def test_evaluation_load_equals_the_training_load_on_one_device(tiny_dir):
    """`spread` (evaluation) goes through the layer-by-layer loader too: same weights, same logits."""
    from trainer.model import load_base

    profile = tiny_profile(quantize_experts=True)
    spread = load_base(profile, tiny_dir, spread=True)
    plain, _ = load_layerwise(profile, tiny_dir, torch.device("cpu"), None)
    assert spread.cockpit_load_facts["loader"] == "layerwise"
    ids = torch.randint(0, spread.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(spread(input_ids=ids).logits, plain(input_ids=ids).logits)


def test_a_recomputation_stop_is_not_taken_for_a_failed_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Non-reentrant checkpointing stops a recompute by raising inside a saved-tensor hook: the kernel
    path must let that through, not fall back to another path mid-recompute (which then breaks)."""
    import torch.utils.checkpoint as ckpt

    from trainer.layers import experts4bit

    torch.manual_seed(0)
    layer = NF4Experts(4, 64, 64, torch.nn.SiLU(), torch.float32, torch.float32, "cpu")
    layer.load_weights(
        {w: (lambda e, w=w: torch.randn(layer.layouts[w].out, layer.layouts[w].inp)) for w in layer.WEIGHTS},
        "cpu",
    )
    monkeypatch.setattr(experts4bit, "expert_path", lambda *a: "fused")
    monkeypatch.setattr(NF4Experts, "kernels_fit", lambda self: True)
    monkeypatch.setattr(
        NF4Experts, "_forward_sorted", lambda self, h, i, w, path: self._forward_grouped(h, i, w)
    )
    monkeypatch.setattr(NF4Experts, "kernels_failed", False)
    x = torch.randn(10, 64, requires_grad=True)
    index = torch.randint(0, 4, (10, 2))
    weights = torch.rand(10, 2, requires_grad=True)
    out = ckpt.checkpoint(lambda a, b: layer(a * 1.0, index, b) * 2.0, x, weights, use_reentrant=False)
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert not NF4Experts.kernels_failed


def test_adapters_start_from_the_profiles_seed(quantized):
    """The adapters' initial A (attention and experts) comes from `training.seed`, whatever the global
    generator did before: two runs of one profile start alike, another seed starts elsewhere."""
    profile = tiny_profile(quantize_experts=True)
    profile = profile.model_copy(update={"lora": profile.lora.model_copy(update={"target_experts": True})})
    reseeded = profile.model_copy(update={"training": profile.training.model_copy(update={"seed": 1})})

    def adapters(p) -> dict[str, torch.Tensor]:
        torch.rand(7)  # the global generator moved on, as the load and anything before it move it
        model = attach_lora(p, copy.deepcopy(quantized))
        return {n: t.detach().clone() for n, t in model.named_parameters() if "lora_A" in n}

    first, again, other = adapters(profile), adapters(profile), adapters(reseeded)
    assert any(".experts.lora_A" in n for n in first) and any("q_proj.lora_A" in n for n in first)
    assert all(torch.equal(first[n], again[n]) for n in first)
    assert all(not torch.equal(first[n], other[n]) for n in first)
