"""Evaluation's placement over several GPUs (`trainer.weights.placement`), decided without GPUs.

accelerate places a planning model (meta device) on fake GPU budgets; the planning model must hold the
bytes the loader really holds (checked against the tiny model loaded on the CPU, and against the plan
for the story's geometry), and the placement must keep decoder layers whole, in order, within budget,
and be at least as balanced as the hand-written equal blocks it replaced.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from cockpit.profiles import load_profile
from trainer.weights.placement import (
    PlacementError,
    WorkingMemory,
    model_config,
    module_sizes,
    place,
    place_by_hand,
    plan_evaluation,
    planning_model,
)

GiB = 2**30
STORY = "qwen3-235b-a22b-thinking-4xh100"
H200_BUDGET = int(140 * GiB * 0.9)


def with_loader(profile, loader: str):
    return profile.model_copy(update={"model": profile.model.model_copy(update={"loader": loader})})


def with_experts(profile, on: bool):
    q = profile.quantization.model_copy(update={"quantize_experts": on})
    return profile.model_copy(update={"quantization": q})


def story_dir() -> str:
    profile, _ = load_profile(STORY)
    return str(Path(profile.model.config).parent)


@pytest.fixture(scope="module")
def models(tiny_dir: str) -> dict[str, tuple[torch.nn.Module, WorkingMemory]]:
    """Planning models with their working memory: the tiny profile and the story's, whole."""
    out = {}
    for name, model_dir in (("tiny-cpu", tiny_dir), (STORY, story_dir())):
        profile, _ = load_profile(name)
        config = model_config(profile, model_dir)
        working = WorkingMemory.of(config, profile)
        out[name] = (planning_model(profile, config, working), working)
    return out


def _state_tensors(state) -> list[torch.Tensor]:
    """Every tensor of a bitsandbytes QuantState (nested state included)."""
    found = []
    for value in vars(state).values():
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif type(value).__name__ == "QuantState":
            found.extend(_state_tensors(value))
    return found


def held_bytes(module: torch.nn.Module) -> int:
    """What a loaded module really holds: parameters, buffers and bitsandbytes quantization states."""
    tensors = list(module.buffers())
    for param in module.parameters():
        tensors.append(param)
        state = getattr(param, "quant_state", None)
        if state is not None:
            tensors.extend(_state_tensors(state))
    unique = {t.data_ptr(): t.numel() * t.element_size() for t in tensors}
    return sum(unique.values())


def test_the_planning_model_holds_the_bytes_the_loader_holds(tiny_dir: str) -> None:
    """Per decoder layer and for the rest, on the tiny model loaded in 4 bit with NF4 experts."""
    from trainer.weights.loader import load_layerwise

    profile, _ = load_profile("tiny-cpu")
    assert profile.quantization.load_in_4bit and profile.quantization.quantize_experts
    loaded, _ = load_layerwise(profile, tiny_dir, torch.device("cpu"), None)
    sizes = module_sizes(planning_model(profile, model_config(profile, tiny_dir)))
    layers = loaded.model.layers
    assert len(layers) == 4
    for i, layer in enumerate(layers):
        assert sizes[f"model.layers.{i}"] == held_bytes(layer)
    assert sizes[""] - sizes["model.layers"] == held_bytes(loaded) - held_bytes(layers)


@pytest.mark.parametrize("loader", ["layerwise", "transformers"])
def test_the_planning_model_agrees_with_the_plan_on_the_story(loader: str) -> None:
    """Every decoder layer, the embeddings and the head of the story's 94-layer model, as `cockpit plan`
    stores them; under `from_pretrained` the experts are still 16-bit when the model is placed."""
    from cockpit.plan.inputs import inputs_for, resolve_geometry
    from cockpit.plan.weights import Weights

    profile = with_loader(load_profile(STORY)[0], loader)
    as_planned = with_experts(profile, loader == "layerwise")
    inputs = inputs_for(as_planned, resolve_geometry(as_planned))
    blocks: dict[str, int] = {}
    for tensor, stored in Weights.of(inputs.geometry, inputs.precision).items:
        blocks[tensor.block] = blocks.get(tensor.block, 0) + stored.total
    sizes = module_sizes(planning_model(profile, model_config(profile, story_dir())))
    for i in (0, 47, 93):
        assert sizes[f"model.layers.{i}"] == blocks[f"layer.{i}"]
    assert sizes["model.embed_tokens"] == blocks["embed"]
    assert sizes["lm_head"] == blocks["lm_head"]


def inside_a_layer(name: str) -> bool:
    return re.match(r"model\.layers\.\d+\.", name) is not None


@pytest.mark.parametrize("gpus", [2, 4])
@pytest.mark.parametrize("profile_name", ["tiny-cpu", STORY])
def test_accelerate_keeps_layers_whole_in_order_within_budget_and_balanced(
    models, profile_name: str, gpus: int
) -> None:
    model, working = models[profile_name]
    budgets = dict.fromkeys(range(gpus), H200_BUDGET)
    placement = place(model, budgets)
    hand = place_by_hand(model, budgets)
    sizes = module_sizes(model)
    n_layers = len(model.model.layers)
    assert not [name for name in placement.device_map if inside_a_layer(name)]  # no layer split
    assert len(placement.layer_devices) == n_layers
    assert placement.layer_devices == sorted(placement.layer_devices)  # devices in order
    assert set(placement.device_map.values()) <= set(budgets)
    outside = {d for n, d in placement.device_map.items() if not n.startswith("model.layers")}
    assert outside == {placement.home} == {0}  # embeddings, norm and head on the first GPU
    # what the loader can hook: the layers all beside the rest, or over two GPUs or more
    assert set(placement.layer_devices) == {0} or len(set(placement.layer_devices)) > 1
    assert sum(placement.bytes_per_device.values()) == sizes[""]  # everything placed, once
    assert all(placement.bytes_per_device[d] <= budgets[d] for d in budgets)
    working_on = {d: placement.bytes_per_device[d] - placement.weights_per_device[d] for d in budgets}
    expected = {
        d: working.kv_bytes_per_layer * placement.layer_devices.count(d)
        + (working.logits_bytes if d == placement.home else 0)
        for d in budgets
    }
    assert working_on == expected
    assert max(placement.bytes_per_device.values()) <= max(hand.bytes_per_device.values())


def test_the_story_on_two_h200s_is_better_balanced_than_equal_blocks(models) -> None:
    """Equal blocks put the embeddings, the head and its scoring logits on top of half the layers."""
    model, _ = models[STORY]
    budgets = dict.fromkeys(range(2), H200_BUDGET)
    accelerate, hand = place(model, budgets), place_by_hand(model, budgets)
    spread = max(accelerate.bytes_per_device.values()) - min(accelerate.bytes_per_device.values())
    assert spread < 2 * GiB
    assert max(hand.bytes_per_device.values()) - max(accelerate.bytes_per_device.values()) > GiB
    assert accelerate.layers_per_device()[0] < accelerate.layers_per_device()[1]


def test_budgets_of_unequal_gpus_are_kept_where_equal_blocks_overflow(models) -> None:
    model, _ = models[STORY]
    budgets = {0: 55 * GiB, 1: H200_BUDGET, 2: H200_BUDGET}
    placement = place(model, budgets)
    assert all(placement.bytes_per_device[d] <= budgets[d] for d in budgets)
    assert place_by_hand(model, budgets).bytes_per_device[0] > budgets[0]


def test_gpus_too_small_are_refused_with_the_figures(models) -> None:
    model, _ = models[STORY]
    with pytest.raises(PlacementError, match=r"GiB .* beyond the budgets of 2 GPUs"):
        place(model, dict.fromkeys(range(2), 40 * GiB))


def test_one_gpu_or_none_places_nothing(tiny_dir: str) -> None:
    profile, _ = load_profile("tiny-cpu")
    assert plan_evaluation(profile, tiny_dir, budgets={}) is None
    assert plan_evaluation(profile, tiny_dir, budgets={0: H200_BUDGET}) is None
    two = plan_evaluation(profile, tiny_dir, budgets={0: H200_BUDGET, 1: H200_BUDGET})
    assert two is not None and len(two.layer_devices) == 4


def test_the_loader_takes_a_placement_of_one_device_a_layer_as_it_is() -> None:
    from trainer.weights.loader import spread_devices

    a, b, c = torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cuda", 2)
    placement = [a, b, b, b, c, c, c]
    assert spread_devices(len(placement), placement) == placement
