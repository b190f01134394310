"""NF4 expert kernels: the pure-torch reference against bitsandbytes, and the Triton kernels against it.

The reference (`trainer.kernels.nf4_ref`) must equal `dequantize_experts_nf4` (bitsandbytes) bit for bit;
`nf4_grouped_mm_ref` must be dense matmuls of those weights, group by group. The Triton kernels run here
under Triton's CPU interpreter (`TRITON_INTERPRET=1`, tiny shapes) when Triton imports; on GPUs they are
checked by `benchmarks/nf4_kernels.py`. The interpreter takes the select-tree decoding where the GPU
default is PTX byte permutes (inline assembly, which it cannot run).
"""

from __future__ import annotations

import pytest
import torch
from triton_kernels import interpreted  # first: it sets TRITON_INTERPRET where no GPU is

from trainer.kernels.nf4_ref import (
    NF4_VALUES,
    dynamic_map,
    nf4_dequantize_ref,
    nf4_grouped_mm_ref,
    nf4_scales,
)
from trainer.nf4_pack import PackedLayout, dequantize_experts_nf4, quantize_experts_nf4


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def packed_weights(experts: int, out: int, inp: int, storage: torch.dtype = torch.bfloat16, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(experts, out, inp, generator=gen) * 0.02
    layout = PackedLayout(experts, out, inp, storage)
    return quantize_experts_nf4(lambda e: w[e], layout, "cpu", chunk=3), layout


@pytest.fixture(scope="module")
def kernels():
    """`trainer.kernels.nf4_triton`, built for Triton's interpreter; skips where Triton does not import."""
    return interpreted("nf4_triton")


# --- the reference -----------------------------------------------------------------------------------


def test_tables_are_bitsandbytes_own():
    import bitsandbytes.functional as bnbf

    assert torch.equal(dynamic_map("cpu"), bnbf.create_dynamic_map())
    assert torch.equal(torch.tensor(NF4_VALUES), bnbf.get_4bit_type("nf4", device="cpu"))


@pytest.mark.parametrize(
    ("out", "inp", "storage"),
    [
        (384, 128, torch.bfloat16),
        (128, 64, torch.float32),
        (64, 64, torch.float16),
        (96, 128, torch.bfloat16),
    ],
)
def test_reference_dequantization_equals_bitsandbytes_exactly(out, inp, storage):
    """Every nested block size (256, 128, 64 here) and storage dtype; fp32 and 16-bit outputs."""
    packed, layout = packed_weights(5, out, inp, storage)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        want = dequantize_experts_nf4(packed, layout, [4, 0, 2], dtype)
        got = nf4_dequantize_ref(packed, layout, [4, 0, 2], dtype)
        assert got.dtype == dtype and torch.equal(got, want)
    assert torch.equal(nf4_dequantize_ref(packed, layout, 3, torch.float32), dequantize_experts_nf4(
        packed, layout, 3, torch.float32))  # fmt: skip
    assert nf4_scales(packed, layout, slice(None)).shape == (5, layout.blocks)


def test_reference_grouped_mm_is_dense_matmul_per_group():
    """Groups in any expert order, empty groups, rows past the last offset (zeros), both orientations."""
    packed, layout = packed_weights(4, 128, 64)
    weights = dequantize_experts_nf4(packed, layout, list(range(4)), torch.float32)
    expert_ids = torch.tensor([2, 0, 3, 1], dtype=torch.int32)
    offs = torch.tensor([5, 5, 17, 20], dtype=torch.int32)
    gen = torch.Generator().manual_seed(1)
    for trans in (False, True):
        x = torch.randn(23, layout.out if trans else layout.inp, generator=gen)
        got = nf4_grouped_mm_ref(x, packed, layout, expert_ids, offs, trans)
        want = torch.zeros_like(got)
        for e, (a, b) in zip([2, 3, 1], [(0, 5), (5, 17), (17, 20)], strict=True):
            w = weights[e]
            want[a:b] = x[a:b] @ (w if trans else w.t())
        assert torch.allclose(got, want, atol=1e-6, rtol=1e-5)
        assert (got[20:] == 0).all()


# --- the Triton kernels (interpreter) -----------------------------------------------------------------


def test_dequantize_kernel_matches_reference(kernels):
    packed, layout = packed_weights(5, 128, 64)  # 8192 elements: 4096 bytes, two programs an expert
    ids = torch.tensor([3, -1, 0], dtype=torch.int32)  # -1: zeros
    for decode in (kernels.GATHER, kernels.TREE):
        cfg = kernels.DequantConfig(block=2048, decode=decode)
        out = torch.full((3, 128, 64), float("nan"))
        got = kernels.nf4_dequantize(packed, layout, ids, torch.float32, cfg, out=out)
        assert got is out
        assert torch.equal(got[[0, 2]], nf4_dequantize_ref(packed, layout, [3, 0], torch.float32))
        assert (got[1] == 0).all()


@pytest.mark.parametrize(
    "config",
    [
        {"bm": 32, "bn": 64, "bk": 64, "swap": False, "decode": 0},
        {"bm": 32, "bn": 128, "bk": 128, "swap": True, "decode": 1},  # 128 columns: two scales a row
        {"bm": 64, "bn": 128, "bk": 64, "swap": True, "decode": 2},  # PRMT: the tree on the CPU
        {"bm": 16, "bn": 64, "bk": 128, "swap": True, "decode": 1},  # decoding's narrow token tile
        {"bm": 32, "bn": 64, "bk": 128, "swap": True, "decode": 1, "programs_per_sm": 4},  # a 32-token tile
    ],
)
def test_grouped_mm_kernel_matches_reference(kernels, config):
    """Forward and input-gradient orientation; uneven groups, an empty one, a tail of rows to no expert."""
    packed, layout = packed_weights(5, 64, 128)
    cfg = kernels.MMConfig(**config)
    expert_ids = torch.tensor([2, 0, 4, 1], dtype=torch.int32)
    offs = torch.tensor([3, 3, 40, 45], dtype=torch.int32)
    gen = torch.Generator().manual_seed(2)
    for trans in (False, True):
        x = torch.randn(50, layout.out if trans else layout.inp, generator=gen)
        want = nf4_grouped_mm_ref(x, packed, layout, expert_ids, offs, trans)
        out = torch.full_like(want, float("nan"))
        got = kernels.nf4_grouped_mm(x, packed, layout, expert_ids, offs, trans, cfg, out=out)
        assert torch.isfinite(got).all(), "a row was not written"
        assert rel(got, want) < 1e-5 and (got[45:] == 0).all()


def test_grouped_mm_kernel_refuses_bad_shapes(kernels):
    packed, layout = packed_weights(2, 128, 64)
    offs, ids = torch.tensor([3], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
    with pytest.raises(ValueError, match="must be"):
        kernels.nf4_grouped_mm(torch.zeros(3, 128), packed, layout, ids, offs)  # in is 64, not 128
    assert kernels.pick_config(64 * 128, 128) is kernels.SMALL_GROUPS
    assert kernels.pick_config(256 * 128, 128) is kernels.LARGE_GROUPS
    assert kernels.pick_config(64 * 8, 128) is kernels.DECODE_ACC  # a decode step at batch 64
    assert kernels.pick_config(256 * 8, 128) is kernels.DECODE_ACC_WIDE  # at batch 256, forward
    assert kernels.pick_config(512 * 8, 128) is kernels.DECODE_ACC_TALL  # at batch 512
    assert kernels.pick_config(400 * 8, 128) is kernels.DECODE_ACC_WIDE  # the story's 400: 25 an expert
    assert kernels.pick_config(256 * 8, 128, trans=True) is kernels.DECODE_GROUPS  # its input gradient
    assert kernels.pick_config(256 * 8, 128, bf16=False) is kernels.DECODE_WIDE  # float32 rows
    assert kernels.pick_config(64 * 8, 128, bf16=False) is kernels.DECODE_GROUPS
    assert kernels.pick_config(512 * 8, 128, bf16=False) is kernels.SMALL_GROUPS
    assert kernels.pick_config(1 * 8, 128) is kernels.DECODE_FEW  # at batch 1


@pytest.mark.parametrize(
    ("bn", "inp", "prefetch", "words"),
    [
        (64, 128, False, False),
        (32, 128, False, False),
        (32, 192, True, False),
        (64, 192, True, True),
        (32, 128, False, "rows"),
    ],
)
def test_scale_on_accumulator_matches_reference(kernels, bn, inp, prefetch, words):
    """`scale_acc` (trainer.kernels.nf4_decode): bf16 rows, the forward orientation, two or three scale
    blocks a weight row (with `prefetch`, each step's scales loaded a step ahead; with `words`, the codes
    read as words in another K order, which the rows' loads follow, or "rows": a gather before the
    kernel), uneven groups, an empty one and a tail of rows to no expert."""
    packed, layout = packed_weights(5, 64, inp)
    cfg = kernels.MMConfig(
        bm=16,
        bn=bn,
        bk=64,
        swap=True,
        decode=kernels.PRMT,
        scale_acc=True,
        prefetch=prefetch,
        words=bool(words),
        rows_in_order=words == "rows",
    )
    expert_ids = torch.tensor([2, 0, 4, 1], dtype=torch.int32)
    offs = torch.tensor([3, 3, 40, 45], dtype=torch.int32)
    x = torch.randn(50, layout.inp, generator=torch.Generator().manual_seed(3)).bfloat16()
    want = nf4_grouped_mm_ref(x.float(), packed, layout, expert_ids, offs)
    out = torch.full((50, layout.out), float("nan"), dtype=torch.bfloat16)
    got = kernels.nf4_grouped_mm(x, packed, layout, expert_ids, offs, config=cfg, out=out)
    assert got is out and torch.isfinite(got).all(), "a row was not written"
    assert rel(got, want) < 6e-3 and (got[45:] == 0).all()  # bf16 output, the table rounded to bf16


def test_scale_on_accumulator_leaves_other_rows_to_the_fused_kernel(kernels):
    """A `scale_acc` config given for rows the decode kernel does not take (float32 rows, the input
    gradient) runs the fused kernel with `pick_config`'s own config for them."""
    packed, layout = packed_weights(5, 64, 128)
    cfg = kernels.MMConfig(bm=16, bn=64, swap=True, scale_acc=True)
    expert_ids = torch.tensor([2, 0, 4, 1], dtype=torch.int32)
    offs = torch.tensor([3, 3, 40, 45], dtype=torch.int32)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(50, layout.inp, generator=gen)  # float32: the decode kernel would round the table
    want = nf4_grouped_mm_ref(x, packed, layout, expert_ids, offs)
    assert rel(kernels.nf4_grouped_mm(x, packed, layout, expert_ids, offs, config=cfg), want) < 1e-5
    grad = torch.randn(50, layout.out, generator=gen).bfloat16()  # bf16, but the input gradient
    fused = kernels.pick_config(50, 4, trans=True, bf16=False)
    assert not fused.scale_acc
    got = kernels.nf4_grouped_mm(grad, packed, layout, expert_ids, offs, trans=True, config=cfg)
    assert got.shape == (50, layout.inp)
    assert torch.equal(got, kernels.nf4_grouped_mm(grad, packed, layout, expert_ids, offs, True, fused))
