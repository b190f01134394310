"""The 4-bit LoRA projections' forward with the scaled sum in one kernel (`trainer.lora_add`): the same
outputs and gradients as PEFT's own forward, dropout included, and PEFT's forward wherever the case is
not the plain one."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

bnb = pytest.importorskip("bitsandbytes")
peft = pytest.importorskip("peft")

from trainer import lora_add  # noqa: E402


class Block(nn.Module):
    """Two 4-bit projections, as an attention block has them."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.is_loaded_in_4bit = True  # what Transformers' quantizer marks (and the trainer's loader): PEFT's 4-bit LoRA
        self.q_proj = self._linear(64, 96, dtype, seed=1)
        self.o_proj = self._linear(96, 64, dtype, seed=2)

    @staticmethod
    def _linear(inp: int, out: int, dtype: torch.dtype, seed: int) -> nn.Module:
        g = torch.Generator().manual_seed(seed)
        weight = torch.randn(out, inp, generator=g) / inp**0.5
        layer = bnb.nn.Linear4bit(inp, out, bias=False, compute_dtype=dtype, quant_type="nf4", device="meta")
        layer.weight = bnb.nn.Params4bit(
            weight.to(dtype), requires_grad=False, quant_type="nf4", module=layer
        ).to("cpu")
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o_proj(torch.relu(self.q_proj(x)))


def adapted(dtype: torch.dtype, dropout: float) -> nn.Module:
    """The block with PEFT LoRA on both projections, B made non-zero so the adapter term counts."""
    config = peft.LoraConfig(r=8, lora_alpha=32, lora_dropout=dropout, target_modules=["q_proj", "o_proj"])
    torch.manual_seed(0)
    model = peft.get_peft_model(Block(dtype), config)
    for name, param in model.named_parameters():
        if "lora_" in name:
            param.data = param.data.to(dtype)
            if "lora_B" in name:
                nn.init.normal_(param, std=0.5)
    return model


def run(model: nn.Module, x: torch.Tensor, seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Output and the gradients of the input and every adapter matrix, dropout drawn from `seed`."""
    x = x.clone().requires_grad_(True)
    torch.manual_seed(seed)
    out = model(x)
    (out.float() ** 2).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), {"x": x.grad, **grads}


@pytest.mark.parametrize(
    ("dtype", "dropout", "tol"),
    [(torch.float32, 0.0, 1e-5), (torch.float32, 0.3, 1e-5), (torch.bfloat16, 0.0, 3e-2)],
)
def test_outputs_and_gradients_equal_pefts(dtype: torch.dtype, dropout: float, tol: float) -> None:
    theirs = adapted(dtype, dropout)
    mine = copy.deepcopy(theirs)
    assert lora_add.install(mine) == 2 and lora_add.install(nn.Linear(2, 2)) == 0
    x = torch.randn(3, 5, 64).to(dtype)
    out_theirs, grads_theirs = run(theirs, x, seed=7)
    out_mine, grads_mine = run(mine, x, seed=7)
    scale = out_theirs.float().abs().max()
    assert (out_mine.float() - out_theirs.float()).abs().max() <= tol * scale
    assert grads_mine.keys() == grads_theirs.keys() and len(grads_mine) == 5  # x, A and B of both
    for name, grad in grads_theirs.items():
        err = (grads_mine[name].float() - grad.float()).abs().max()
        assert err <= tol * grad.float().abs().max(), name
    # the adapter matters: without it the output is another one
    with mine.disable_adapter():
        assert not torch.allclose(mine(x).float(), out_mine.float(), atol=tol * float(scale))


def test_other_cases_take_pefts_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    model = adapted(torch.float32, 0.0)
    lora_add.install(model)
    layer = model.base_model.model.q_proj
    x = torch.randn(4, 64)
    calls: list[str] = []
    original = type(layer).forward
    monkeypatch.setattr(type(layer), "forward", lambda *a, **k: calls.append("peft") or original(*a, **k))
    layer(x)
    assert calls == [], "the plain case: the one-kernel sum"
    with model.disable_adapter():
        layer(x)
    assert calls == ["peft"]
    layer.merge()
    layer(x)
    assert calls == ["peft", "peft"]
    layer.unmerge()
    model.add_adapter("second", peft.LoraConfig(r=4, target_modules=["q_proj"]))
    model.base_model.set_adapter(["default", "second"])
    layer(x)
    assert calls == ["peft"] * 3, "two active adapters"


def test_off_leaves_pefts_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    model = adapted(torch.float32, 0.0)
    monkeypatch.setattr(lora_add, "ENABLED", False)
    assert lora_add.install(model) == 0
    assert "forward" not in vars(model.base_model.model.q_proj)
