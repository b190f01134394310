"""The RMSNorm kernel (`trainer.kernels.rms_norm`), values and gradients, against Transformers' Qwen3 norm
computed in float64. The Triton kernel runs here under Triton's CPU interpreter (`TRITON_INTERPRET=1`)
when Triton imports; on GPUs `benchmarks/step_speed.py` runs it in the trainer."""

from __future__ import annotations

from triton_kernels import interpreted  # first: it sets TRITON_INTERPRET where no GPU is # isort: skip

import pytest
import torch
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeRMSNorm

EPS = 1e-6


@pytest.fixture(scope="module")
def kernel():
    return interpreted("rms_norm")


def _transformers(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Transformers' norm in float64: output, input gradient and weight gradient under `_upstream`."""
    norm = Qwen3MoeRMSNorm(x.shape[-1], eps=EPS).double()
    with torch.no_grad():
        norm.weight.copy_(weight.double())
    xi = x.double().requires_grad_(True)
    y = norm(xi)
    (y * _upstream(y)).sum().backward()
    return y.detach(), xi.grad, norm.weight.grad


def _upstream(y: torch.Tensor) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    return torch.randn(y.shape, generator=gen, dtype=torch.float64).to(y.dtype)


# Rows: a head-wide norm (many rows a program, the last program ragged), a width that is no power of
# two (the mean must divide by the width, not the tile's), and one wide row a program.
@pytest.mark.parametrize(("shape", "dtype", "tol"), [
    ((3, 45, 128), torch.float32, 1e-5),
    ((37, 96), torch.float32, 1e-5),
    ((5, 1024), torch.float32, 1e-5),
    ((2, 33, 128), torch.bfloat16, 2e-2),
])  # fmt: skip
def test_values_and_both_gradients_match_transformers(kernel, shape, dtype, tol) -> None:
    gen = torch.Generator().manual_seed(shape[-1])
    x = (torch.randn(shape, generator=gen) * 3 + 0.5).to(dtype)
    weight = (1 + 0.3 * torch.randn(shape[-1], generator=gen)).to(dtype)
    expected = _transformers(x, weight)
    xi, wi = x.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    y = kernel.rms_norm(xi, wi, EPS)
    (y.double() * _upstream(y.double())).sum().backward()
    assert y.dtype == dtype and y.shape == x.shape
    for got, want in zip((y, xi.grad, wi.grad), expected, strict=True):
        scale = want.abs().max().item()
        assert (got.double() - want).abs().max().item() <= tol * max(1.0, scale)


def test_a_frozen_weight_gets_no_gradient_and_the_reference_agrees(kernel) -> None:
    x = torch.randn(4, 7, 128, requires_grad=True)
    weight = torch.rand(128) + 0.5
    y = kernel.rms_norm(x, weight, EPS)
    y.sum().backward()
    assert weight.grad is None and x.grad is not None
    torch.testing.assert_close(y.detach(), kernel.reference(x.detach(), weight, EPS), rtol=1e-5, atol=1e-5)


def test_a_strided_input_is_normalized_row_by_row(kernel) -> None:
    x = torch.randn(6, 2, 64)[:, 0]  # rows 128 apart
    weight = torch.rand(64) + 0.5
    torch.testing.assert_close(kernel.rms_norm(x, weight, EPS), kernel.reference(x, weight, EPS))


def test_what_the_kernel_refuses(kernel) -> None:
    x = torch.randn(3, 64)
    assert kernel.fits(x, torch.ones(64))
    assert not kernel.fits(x, torch.ones(64, dtype=torch.bfloat16))  # mixed dtypes: torch's kernel
    assert not kernel.fits(x, torch.ones(32))
    assert not kernel.fits(torch.randn(2, kernel.MAX_WIDTH + 1), torch.ones(kernel.MAX_WIDTH + 1))
    with pytest.raises(ValueError, match="rms_norm"):
        kernel.rms_norm(x, torch.ones(32), EPS)
