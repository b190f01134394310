"""Each token's sum over its k pairs' rows (`trainer.kernels.gather_sum`) against the torch formula it
replaces in `trainer.layers.routing` (a gather into token order, then a sum over k). The Triton kernel runs
here under Triton's CPU interpreter (`TRITON_INTERPRET=1`) when Triton imports; on GPUs
`benchmarks/step_speed.py` runs it in the trainer."""

from __future__ import annotations

import pytest
import torch
from triton_kernels import interpreted  # first: it sets TRITON_INTERPRET where no GPU is

from trainer.layers.routing import gather_sum_torch


@pytest.fixture(scope="module")
def kernel():
    return interpreted("gather_sum")


@pytest.mark.parametrize(("tokens", "k", "width"), [(13, 3, 300), (8, 8, 256), (1, 1, 5)])
def test_each_token_sums_its_pairs_rows(kernel, tokens: int, k: int, width: int) -> None:
    gen = torch.Generator().manual_seed(tokens * k + width)
    rows = torch.randn(tokens * k, width, generator=gen)
    index = torch.randperm(tokens * k, generator=gen).view(tokens, k)
    out = kernel.gather_sum(rows, index)
    expected = torch.stack([rows[index[t]].sum(dim=0) for t in range(tokens)])
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gather_sum_torch(rows, index), expected, rtol=1e-5, atol=1e-5)


def test_bf16_rows_are_summed_in_float32(kernel) -> None:
    """A token of a bf16 256 and seven 1s: in bf16, 256 + 1 rounds back to 256 each time (its spacing is
    2 there), so a bf16 sum would give 256; summed in float32 it is 263, rounded once (to 262 or 264: the
    interpreter truncates where the GPU rounds to nearest)."""
    rows = torch.ones(16, 3, dtype=torch.bfloat16)
    rows[9] = 256.0
    index = torch.tensor([[9, 0, 1, 2, 3, 4, 5, 6], [7, 8, 10, 11, 12, 13, 14, 15]])
    out = kernel.gather_sum(rows, index)
    assert out.dtype == torch.bfloat16
    assert out[0].float().tolist() in ([262.0] * 3, [264.0] * 3) and out[1].float().tolist() == [8.0] * 3


def test_a_strided_input_and_a_bad_shape(kernel) -> None:
    rows = torch.randn(6, 20)[:, ::2]  # not contiguous in its last dimension
    index = torch.tensor([[0, 5], [1, 2], [3, 4]])
    torch.testing.assert_close(kernel.gather_sum(rows, index), gather_sum_torch(rows, index))
    with pytest.raises(ValueError, match="gather_sum"):
        kernel.gather_sum(rows, index.reshape(-1))
