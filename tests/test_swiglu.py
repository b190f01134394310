"""The experts' fused activation (`trainer.kernels.swiglu`): forward and both gradients against torch's
autograd of `silu(gate) * up * weight`. The Triton kernels run here under Triton's CPU interpreter
(`TRITON_INTERPRET=1`) when Triton imports; on GPUs `benchmarks/step_speed.py` runs them in the trainer."""

from __future__ import annotations

import pytest
import torch
from triton_kernels import interpreted  # first: it sets TRITON_INTERPRET where no GPU is


@pytest.fixture(scope="module")
def swiglu():
    return interpreted("swiglu")


def torch_path(gu: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """What the experts computed before: torch's kernels on the two halves, then the routing weight."""
    gate, up = gu.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up * weights.reshape(-1, 1)


@pytest.mark.parametrize("rows,width", [(37, 300), (16, 256), (1, 8)])
@pytest.mark.parametrize("weights_grad", [True, False])
def test_forward_and_gradients_equal_autograd(swiglu, rows: int, width: int, weights_grad: bool) -> None:
    gen = torch.Generator().manual_seed(rows + width)
    gu0 = torch.randn(rows, 2 * width, generator=gen) * 3
    w0 = torch.rand(rows, 1, generator=gen)
    dh = torch.randn(rows, width, generator=gen)
    results = []
    for fn in (swiglu.swiglu_rows, torch_path):
        gu, w = gu0.clone().requires_grad_(True), w0.clone().requires_grad_(weights_grad)
        h = fn(gu, w)
        h.backward(dh)
        results.append((h.detach(), gu.grad, w.grad))
    (h, dgu, dw), (h_ref, dgu_ref, dw_ref) = results
    torch.testing.assert_close(h, h_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dgu, dgu_ref, rtol=1e-5, atol=1e-5)
    if weights_grad:
        assert dw.shape == w0.shape
        torch.testing.assert_close(dw, dw_ref, rtol=1e-4, atol=1e-4)
    else:
        assert dw is None


def test_bf16_in_bf16_out(swiglu) -> None:
    """bf16 in, bf16 out, within a bf16 unit of the float32 result (the interpreter truncates where the
    GPU rounds to nearest, so one unit, not half)."""
    gen = torch.Generator().manual_seed(1)
    gu = (torch.randn(24, 2 * 64, generator=gen) * 2).bfloat16()
    w = torch.rand(24, generator=gen)
    exact = torch_path(gu.float(), w)
    fused = swiglu.swiglu_rows(gu, w)
    assert fused.dtype == torch.bfloat16
    torch.testing.assert_close(fused.float(), exact, rtol=2**-7, atol=1e-6)


def test_bad_shapes_are_refused(swiglu) -> None:
    with pytest.raises(ValueError, match="gu"):
        swiglu.swiglu_rows(torch.zeros(4, 7), torch.zeros(4))
    with pytest.raises(ValueError, match="3 weights"):
        swiglu.swiglu_rows(torch.zeros(4, 8), torch.zeros(3))


def test_only_silu_is_fused(swiglu) -> None:
    from transformers.activations import ACT2FN

    assert swiglu.is_silu(ACT2FN["silu"]) and swiglu.is_silu(torch.nn.SiLU())
    assert not swiglu.is_silu(ACT2FN["gelu"]) and not swiglu.is_silu(torch.nn.functional.silu)
