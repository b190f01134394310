"""Planner and trainer read one contract (`cockpit.contract`): here they must agree on real objects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cockpit.contract import TINY_MODEL
from cockpit.plan.formats import packed_experts
from cockpit.plan.geometry import geometry_from_config
from cockpit.plan.hardware import Hardware
from cockpit.plan.inputs import inputs_for, setup_for
from cockpit.plan.weights import Precision, Weights
from cockpit.profiles import PROFILES_DIR, load_profile
from trainer.layers.experts4bit import NF4Experts
from trainer.nf4_pack import PackedLayout
from trainer.weights import quant

STORY = json.loads((PROFILES_DIR / "models/qwen3-235b-a22b-thinking-2507/config.json").read_text())
# (experts, hidden, expert width): the story's, the tiny model's, and widths whose block counts pick each
# nested block size (256, 128, 64).
EXPERT_SHAPES = [
    (STORY["num_experts"], STORY["hidden_size"], STORY["moe_intermediate_size"]),
    (TINY_MODEL["num_experts"], TINY_MODEL["hidden_size"], TINY_MODEL["moe_intermediate_size"]),
    (4, 64, 128),
    (3, 64, 64),
    (5, 128, 96),
]


def _bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


@pytest.mark.parametrize("storage", ["bfloat16", "float32"])
@pytest.mark.parametrize(("experts", "hidden", "width"), EXPERT_SHAPES)
def test_packed_expert_bytes_agree(experts: int, hidden: int, width: int, storage: str) -> None:
    """The plan's bytes for packed experts are the bytes of the trainer's parameters, weight by weight."""
    module = NF4Experts(
        experts, hidden, width, torch.nn.SiLU(), torch.bfloat16, getattr(torch, storage), "meta"
    )
    planned = packed_experts(experts, 2 * width, hidden, storage).data_bytes
    planned += packed_experts(experts, hidden, width, storage).data_bytes
    assert planned == _bytes(module)
    for name, layout in module.layouts.items():
        parts = packed_experts(layout.experts, layout.out, layout.inp, storage).parts
        trainer_parts = tuple(
            getattr(module, f"{name}_{s}").numel() * layout.itemsize for s in layout.shapes()
        )
        assert parts == trainer_parts


@pytest.mark.parametrize(("experts", "hidden", "width"), EXPERT_SHAPES)
def test_dequant_chunk_agrees(experts: int, hidden: int, width: int) -> None:
    """The plan's dequantized chunk is the trainer's `chunk_experts` experts of both weights."""
    config = {
        "model_type": "qwen3_moe",
        **TINY_MODEL,
        "hidden_size": hidden,
        "moe_intermediate_size": width,
        "num_experts": experts,
        "num_experts_per_tok": min(2, experts),
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": hidden // 2,
        "num_hidden_layers": 1,
    }
    weights = Weights.of(
        geometry_from_config(config, "t"), Precision(experts_4bit=True, compute_dtype="bfloat16")
    )
    module = NF4Experts(experts, hidden, width, torch.nn.SiLU(), torch.bfloat16, torch.bfloat16, "meta")
    assert weights.dequant_chunk_bytes() == module.chunk_experts * 3 * hidden * width * 2


def test_packed_layout_refuses_what_the_plan_would_not_pack() -> None:
    """Both sides use the contract's nested block sizes: 3 blocks an expert fits none of them."""
    with pytest.raises(ValueError, match="no nested block size"):
        _ = PackedLayout(2, 3, 64, torch.bfloat16).nested


@pytest.mark.parametrize("bf16", [True, False])
@pytest.mark.parametrize("storage", ["uint8", "bfloat16", "float16", "float32"])
def test_experts_storage_dtype_agrees(bf16: bool, storage: str) -> None:
    overrides = [f"training.bf16={str(bf16).lower()}", f'quantization.storage_dtype="{storage}"']
    if bf16 and storage in ("float16", "float32"):
        return  # refused by the profile (DeepSpeed would scramble the packed bytes)
    profile, _ = load_profile("tiny-cpu", overrides)
    planned = inputs_for(profile, geometry_from_config({"model_type": "qwen3_moe", **TINY_MODEL}, "t"))
    assert getattr(torch, planned.precision.experts_storage_dtype) == quant.experts_storage_dtype(profile)


@pytest.mark.parametrize(
    ("loader", "remote"), [("layerwise", False), ("transformers", False), ("layerwise", True)]
)
def test_loader_agrees(loader: str, remote: bool) -> None:
    profile, _ = load_profile(
        "tiny-cpu", [f'model.loader="{loader}"', f"model.trust_remote_code={str(remote).lower()}"]
    )
    setup = setup_for(profile, Hardware(gpus=0, gpu_mem_gib=0, host_ram_gib=16, gpu_name=""))
    assert (setup.loader == "layerwise") == quant.uses_layerwise_loader(profile)


def test_tiny_model_is_the_planned_one(tmp_path: Path) -> None:
    """The built-in model the trainer builds has the parameter count the plan counts."""
    import transformers

    config = transformers.AutoConfig.for_model("qwen3_moe", **TINY_MODEL)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    planned = geometry_from_config({"model_type": "qwen3_moe", **TINY_MODEL}, "t")
    assert sum(p.numel() for p in model.parameters()) == planned.total_params


def test_an_expert_geometry_the_loader_refuses_is_refused_by_plan_and_doctor_by_its_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Experts of 96 x 96 (and 192 x 96): 144 and 288 NF4 blocks an expert, which no nested block size
    divides. The loader refused them at load, after plan and doctor had passed them; now all three say the
    contract's words (`packed_expert_problem`), and plan and doctor before anything loads."""
    from cockpit.cli import main
    from cockpit.contract import packed_expert_problem
    from cockpit.service import doctor

    assert (
        packed_expert_problem(2 * TINY_MODEL["moe_intermediate_size"], TINY_MODEL["hidden_size"], "bfloat16")
        is None
    )
    assert "not a whole number of 64-blocks" in (packed_expert_problem(3, 5, "float32") or "")
    problem = packed_expert_problem(192, 96, "bfloat16")
    assert (
        problem
        == "expert weight 192x96: 288 blocks an expert: no nested block size in (256, 128, 64) divides it"
    )
    with pytest.raises(ValueError) as refused:
        NF4Experts(4, 96, 96, torch.nn.SiLU(), torch.bfloat16, torch.bfloat16, "meta")
    assert str(refused.value) == problem  # the loader's words are the rule's
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "qwen3_moe", **TINY_MODEL, "hidden_size": 96,
                                  "moe_intermediate_size": 96, "head_dim": 24}))  # fmt: skip
    overrides = [f"model.config={config}", "quantization.quantize_experts=true"]
    code = main(["plan", *(a for o in overrides for a in ("--set", o))])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    words = "quantization.quantize_experts: the trainer cannot pack this model's experts in NF4"
    assert f"{words} (mlp.experts.gate_up_proj: {problem}); set it to false" in err
    profile, _ = load_profile("tiny-cpu", overrides)
    checks = {c.name: c for c in doctor.examine(profile, tmp_path / "runs").checks}
    assert checks["plan"].status == "fail" and problem in checks["plan"].reason
    kept, _ = load_profile("tiny-cpu", [*overrides[:1], "quantization.quantize_experts=false"])
    assert main(["plan", "--set", overrides[0], "--set", "quantization.quantize_experts=false"]) == 0
    assert {c.name: c for c in doctor.examine(kept, tmp_path / "runs").checks}["plan"].status != "fail"
