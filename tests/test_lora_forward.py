"""The lean LoRA forward (`trainer.layers.lora_forward`) against PEFT's own: the same outputs and gradients,
the same dropout draws, on plain and 4-bit (bitsandbytes NF4, on the CPU) projections; PEFT's forward where
the call is not the plain case."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from trainer.layers import lora_forward


class Block(nn.Module):
    def __init__(self, proj: nn.Module) -> None:
        super().__init__()
        self.proj = proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def _nf4_linear(weight: torch.Tensor) -> nn.Module:
    bnb = pytest.importorskip("bitsandbytes")
    layer = bnb.nn.Linear4bit(weight.shape[1], weight.shape[0], bias=False, compute_dtype=torch.float32,
                              quant_type="nf4", device="meta")  # fmt: skip
    layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type="nf4", module=layer).to("cpu")
    return layer


def _pair(proj: nn.Module, alpha: float, dropout: float = 0.25) -> tuple[nn.Module, nn.Module]:
    """(PEFT's, lean): the same adapters on copies of `proj`, B non-zero so the adapter term shows."""
    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=alpha, lora_dropout=dropout, target_modules=["proj"])
    peft = get_peft_model(Block(proj), config)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_()
    lean = copy.deepcopy(peft)
    assert lora_forward.install(lean) == 1
    return peft, lean


def _run(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Output, input gradient and the adapters' gradients, dropout drawn from seed 1."""
    torch.manual_seed(1)
    xi = x.clone().requires_grad_(True)
    y = model(xi)
    (y * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
    grads = [p.grad for n, p in model.named_parameters() if "lora_" in n]
    return [y.detach(), xi.grad, *grads]


@pytest.mark.parametrize("kind", ["linear", "nf4"])
def test_the_same_outputs_gradients_and_dropout_as_peft(kind: str) -> None:
    """A power-of-two scale (alpha / r = 2): scaling the rank-wide activation rounds as scaling the output."""
    gen = torch.Generator().manual_seed(2)
    weight = torch.randn(24, 32, generator=gen)
    proj = nn.Linear(32, 24, bias=False) if kind == "linear" else _nf4_linear(weight)
    if kind == "linear":
        proj.weight.data.copy_(weight)
    peft, lean = _pair(proj, alpha=8)
    x = torch.randn(3, 5, 32, generator=gen)
    for got, want in zip(_run(lean, x), _run(peft, x), strict=True):
        assert torch.equal(got, want)


def test_any_scale_agrees_to_rounding() -> None:
    peft, lean = _pair(nn.Linear(32, 24), alpha=6)  # 1.5
    x = torch.randn(4, 32)
    for got, want in zip(_run(lean, x), _run(peft, x), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_peft_runs_where_the_call_is_not_the_plain_case() -> None:
    base = nn.Linear(32, 24)
    peft, lean = _pair(copy.deepcopy(base), alpha=8, dropout=0.0)
    x = torch.randn(4, 32)
    with lean.disable_adapter():  # adapters off: the base layer alone
        torch.testing.assert_close(lean(x), base(x))
    alone = lean(x)
    for model in (lean, peft):
        torch.manual_seed(5)
        model.add_adapter("second", LoraConfig(r=2, lora_alpha=2, target_modules=["proj"]))
        with torch.no_grad():
            model.base_model.model.proj.lora_B["second"].weight.fill_(0.5)
        model.base_model.model.proj.set_adapter(["default", "second"])
    both = lean(x)
    torch.testing.assert_close(both, peft(x))  # both adapters summed, as PEFT sums them
    assert not torch.allclose(both, alone)
