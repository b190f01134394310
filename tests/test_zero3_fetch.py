"""ZeRO-3's overlapped fetch: what a module's kernels wait for, and when the profile keeps the embeddings
on the GPU. The CUDA side runs on the GPU machine (benchmarks/step_speed.py: the same losses as
DeepSpeed's own fetch); its ordering rule and its switches are checked here."""

from __future__ import annotations

import pytest

from cockpit.profiles import load_profile
from trainer.weights import zero3_fetch
from trainer.weights.zero3_fetch import LatestCopy


def test_a_module_waits_for_the_latest_copy_it_needs_and_nothing_after() -> None:
    """Copies land in queue order: waiting for the latest one a module used covers the earlier ones;
    prefetches queued later are noted by the modules that use them, after the stream answered."""
    latest = LatestCopy()
    assert latest.take() is None  # nothing waited for: the module waits for nothing
    for order, event in ((7, "q_proj"), (9, "experts"), (8, "k_proj")):
        latest.note(order, event)
    assert latest.take() == "experts"
    assert latest.take() is None  # answered once: the next module starts afresh
    latest.note(12, "next layer")
    assert latest.take() == "next layer"


def test_the_switch_and_no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(zero3_fetch.ENV, "0")
    assert not zero3_fetch.wanted() and not zero3_fetch.install()
    monkeypatch.delenv(zero3_fetch.ENV)
    assert zero3_fetch.wanted()
    import torch

    if not torch.cuda.is_available():
        assert not zero3_fetch.install()  # DeepSpeed's handles stay as they are on the CPU


@pytest.mark.parametrize(
    ("sets", "kept"),
    [
        ([], True),  # the story: offload on 4 GPUs
        (["deepspeed.embeddings_on_gpu=false"], False),
        (['deepspeed.offload_param="none"', 'deepspeed.offload_optimizer="none"'], False),
        (["hardware.gpus=0"], False),
        (['deepspeed.offload_param="nvme"', 'deepspeed.nvme_path="/nvme"'], False),  # placeholders there
    ],
)
def test_embeddings_stay_on_the_gpu_only_under_parameter_offload_on_gpus(sets: list[str], kept: bool) -> None:
    from trainer.ds_config import embeddings_kept

    profile, _ = load_profile("qwen3-235b-a22b-thinking-4xh100", sets)
    assert embeddings_kept(profile) is kept


def test_the_live_budget_counts_the_kept_embeddings() -> None:
    """Kept on the GPU, the embedding stays counted among DeepSpeed's live parameters: the budget grows by
    it, or it would take the place of part of the prefetched layers."""
    from trainer.ds_config import _gathered_elements, deepspeed_config

    kept, _ = load_profile("qwen3-235b-a22b-thinking-4xh100")
    host, _ = load_profile("qwen3-235b-a22b-thinking-4xh100", ["deepspeed.embeddings_on_gpu=false"])
    live = [deepspeed_config(p)["zero_optimization"]["stage3_max_live_parameters"] for p in (kept, host)]
    assert live[0] - live[1] == _gathered_elements(kept)[1] > 0
