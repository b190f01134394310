"""Sorted token-expert pairs: permutation backwards and weights on the intermediate equal plain indexing."""

from __future__ import annotations

import importlib

import pytest
import torch

from trainer.layers import routing


def _pairs(tokens: int = 10, experts: int = 5, k: int = 3, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    index = torch.stack([torch.randperm(experts + 1, generator=gen)[:k] for _ in range(tokens)])
    return index, routing.SortedPairs.of(index, experts)


def test_sorted_pairs_sort_by_expert_and_invert():
    index, pairs = _pairs()
    flat = index.reshape(-1)
    assert torch.equal(pairs.perm[pairs.unsort], torch.arange(flat.numel()))
    sorted_experts = flat[pairs.perm]
    assert torch.all(sorted_experts[1:] >= sorted_experts[:-1])
    for e in range(5):  # offs[e]: pairs routed to experts <= e; index 5 is "no expert", after them
        assert pairs.offs[e] == int((flat <= e).sum())


@pytest.mark.parametrize("where", ["intermediate", "output"])
def test_spread_weight_combine_match_plain_indexing(where):
    """Outputs and gradients (hidden rows and routing weights) equal the indexing formulation."""
    _, pairs = _pairs(seed=1)
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(10, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    weights = torch.rand(10, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    proj = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    down = torch.randn(4, 6, generator=gen, dtype=torch.float64)

    def reference():
        rows = hidden[pairs.perm // pairs.k]
        out = torch.tanh(rows @ proj) @ down
        tokens = out[pairs.unsort].view(10, 3, 6) * weights[..., None]
        return tokens.sum(dim=1)

    def ours():
        rows = routing.spread(hidden, pairs)
        h = torch.tanh(rows @ proj)
        if where == "intermediate":
            h = h * routing.pair_weights(weights, pairs)
            return routing.combine(h @ down, pairs, None)
        return routing.combine(h @ down, pairs, weights)

    results = []
    for fn in (reference, ours):
        out = fn()
        target = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        (out * target).sum().backward()
        results.append((out.detach(), hidden.grad.clone(), weights.grad.clone()))
        hidden.grad = weights.grad = None
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(b, a)


def test_backwards_are_not_accumulating_index_puts():
    """The permutation backwards run no index_put (the sort-based accumulation plain indexing uses)."""
    _, pairs = _pairs(seed=4)
    hidden = torch.randn(10, 6, requires_grad=True)
    out = routing.combine(routing.spread(hidden, pairs) * 2.0, pairs, None)
    from torch.profiler import profile

    with profile() as prof:
        out.sum().backward()
    names = {e.key for e in prof.key_averages()}
    assert not any("index_put" in n for n in names), names
    torch.testing.assert_close(hidden.grad, torch.full_like(hidden, 2.0 * pairs.k))


def test_switch_off_restores_plain_indexing(monkeypatch):
    monkeypatch.setenv("COCKPIT_FAST_ROUTING", "0")
    module = importlib.reload(routing)
    try:
        assert not module.ENABLED
        _, pairs = _pairs(seed=5)
        hidden = torch.randn(10, 6)
        torch.testing.assert_close(module.spread(hidden, pairs), hidden[pairs.perm // pairs.k])
    finally:
        monkeypatch.delenv("COCKPIT_FAST_ROUTING")
        importlib.reload(routing)
