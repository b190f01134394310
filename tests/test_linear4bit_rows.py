"""bitsandbytes' 4-bit linear layers on a few rows through the NF4 decode kernel (`trainer.layers.
linear4bit_rows`): the weight read as a one-expert packed weight gives bitsandbytes' own dequantized
product, within bf16's rounding; weights of another quantization are refused; the forward swapped in
keeps bitsandbytes' where the kernel does not take the call. The kernel runs under Triton's interpreter."""

from __future__ import annotations

from triton_kernels import interpreted  # first: it sets TRITON_INTERPRET where no GPU is # isort: skip

import pytest
import torch
from torch import nn

bnb = pytest.importorskip("bitsandbytes")

from trainer.layers import linear4bit_rows  # noqa: E402


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def nf4_linear(
    out: int, inp: int, *, nested: bool = True, quant: str = "nf4", bias: bool = False
) -> nn.Module:
    """A `Linear4bit` quantized on the CPU as the loader makes them (bf16 compute)."""
    gen = torch.Generator().manual_seed(out + inp)
    weight = torch.randn(out, inp, generator=gen) * 0.02
    layer = bnb.nn.Linear4bit(inp, out, bias=bias, compute_dtype=torch.bfloat16, compress_statistics=nested,
                              quant_type=quant, device="meta")  # fmt: skip
    layer.weight = bnb.nn.Params4bit(
        weight, requires_grad=False, compress_statistics=nested, quant_type=quant, module=layer
    ).to("cpu")
    if bias:
        layer.bias = nn.Parameter(torch.randn(out, generator=gen).bfloat16(), requires_grad=False)
    return layer


def dequantized_product(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """float32 x @ W.T with bitsandbytes' own dequantized weight (and the bias)."""
    w = bnb.functional.dequantize_4bit(layer.weight.data, layer.weight.quant_state).float()
    out = x.float() @ w.T
    return out + layer.bias.float() if layer.bias is not None else out


@pytest.fixture(scope="module")
def kernels():
    return interpreted("nf4_triton")


@pytest.mark.parametrize(
    ("rows", "out", "inp", "bias"),
    [(2, 128, 256, False), (8, 64, 512, True), (24, 192, 256, False), (40, 128, 256, False)],
)
def test_the_kernel_gives_bitsandbytes_product(kernels, rows: int, out: int, inp: int, bias: bool) -> None:
    """Every tile config the row counts pick (16-, 32- and 64-row tiles), bias or not, [B, T, in] rows."""
    layer = nf4_linear(out, inp, bias=bias)
    x = torch.randn(rows, 1, inp, generator=torch.Generator().manual_seed(rows)).bfloat16()
    got = linear4bit_rows.rows_mm(layer, x)
    assert got.shape == (rows, 1, out) and got.dtype == torch.bfloat16
    want = dequantized_product(layer, x[:, 0])
    assert rel(got[:, 0], want) < 6e-3  # the table rounded to bf16, bf16 output


@pytest.mark.parametrize(
    ("nested", "quant", "inp"),
    [(True, "nf4", 256), (False, "nf4", 256), (True, "fp4", 256), (True, "nf4", 320)],
)
def test_only_the_packed_layout_is_taken(nested: bool, quant: str, inp: int) -> None:
    """Double-quantized NF4 with whole nested blocks is taken (64 x 256 / 64 = 256 scales: one nested
    block); single quantization (float32 scales), FP4, and 320 scales (bitsandbytes' last nested block
    partial) are left to bitsandbytes."""
    layer = nf4_linear(64, inp, nested=nested, quant=quant)
    taken = nested and quant == "nf4" and inp == 256
    assert (linear4bit_rows._packed(layer) is not None) == taken
    if not taken:
        with pytest.raises(ValueError, match="packed NF4 layout"):
            linear4bit_rows.rows_mm(layer, torch.randn(4, inp).bfloat16())


def test_installed_forward_keeps_bitsandbytes_where_the_kernel_does_not_run() -> None:
    """On the CPU (no GPU) every call is bitsandbytes' own, bit for bit; install finds the 4-bit layers
    inside a model, not other linears."""
    model = nn.Sequential(
        nf4_linear(128, 256), nn.Linear(128, 128, dtype=torch.bfloat16), nf4_linear(256, 128)
    )
    x = torch.randn(3, 256).bfloat16()
    before = model(x)
    assert linear4bit_rows.install(model) == 2
    assert not linear4bit_rows.takes(model[0], x)  # not a GPU tensor
    assert torch.equal(model(x), before)


def test_the_probe_passes_the_kernel_and_catches_a_wrong_product(kernels) -> None:
    """The first-call check: the kernel's own product agrees with bitsandbytes'; with the kernel's copy of
    the nested scales spoiled (what a tile computing garbage looks like), the probe refuses it."""
    layer = nf4_linear(128, 256)
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(5)).bfloat16()
    ok, got = linear4bit_rows.probe(layer, x)
    assert ok and got.shape == (8, 128)
    packed, _ = linear4bit_rows._packed(layer)
    packed["qstate"][:, :-1].mul_(-1)  # the kernel's copy only: bitsandbytes' state is untouched
    ok, _ = linear4bit_rows.probe(layer, x)
    assert not ok


def test_the_kernel_stops_where_its_64_row_tile_begins() -> None:
    """Past ROWS the kernel would take its 64-row tile, which one H100 measured slower than bitsandbytes'
    dequantize and matmul (benchmarks/results/projection_speed_h100.md): those rows stay bitsandbytes'."""
    from trainer.kernels import nf4_triton as k

    assert linear4bit_rows.MIN_ROWS <= linear4bit_rows.ROWS == k.DECODE_ACC_WIDE_ROWS
    assert linear4bit_rows.config_for(linear4bit_rows.ROWS).bm < 64
    assert linear4bit_rows.config_for(linear4bit_rows.ROWS + 1).bm == 64
