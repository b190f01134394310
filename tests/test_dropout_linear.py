"""The dropout-and-LoRA-A kernel (`trainer.kernels.dropout_linear`): its mask (drawn from a seed, kept with
probability 1 - p, the same in forward, backward and a checkpointed recompute), its product and both
gradients against torch's arithmetic on that mask. The Triton kernels run here under Triton's CPU
interpreter when Triton imports; on GPUs `benchmarks/step_speed.py` runs them in the trainer."""

from __future__ import annotations

from triton_kernels import interpreted  # first: it sets TRITON_INTERPRET where no GPU is # isort: skip

import pytest
import torch
from torch.utils.checkpoint import checkpoint


@pytest.fixture(scope="module")
def kernel():
    return interpreted("dropout_linear")


def _mask(kernel, rows: int, width: int, p: float, seed: torch.Tensor) -> torch.Tensor:
    """The kernel's keep mask for (rows, width, seed), read through inputs of one and slices of an identity
    weight (a rank of 64 columns at a time)."""
    ones, eye = torch.ones(rows, width), torch.eye(width)
    out = torch.cat([kernel.dropout_linear(ones, eye[c : c + 64], p, seed) for c in range(0, width, 64)], 1)
    scale = 1.0 / (1.0 - p)
    assert torch.all((out == 0) | ((out - scale).abs() < 1e-6))
    return out != 0


def _seed(value: int) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.int64)


def test_the_mask_keeps_one_minus_p_and_differs_by_row_column_and_seed(kernel) -> None:
    p = 0.3
    mask = _mask(kernel, 96, 64, p, _seed(11))
    kept = mask.float().mean().item()
    sd = (p * (1 - p) / mask.numel()) ** 0.5
    assert abs(kept - (1 - p)) < 5 * sd
    assert not torch.equal(mask[0], mask[1]) and not torch.equal(mask[:, 0], mask[:, 1])
    assert not torch.equal(mask, _mask(kernel, 96, 64, p, _seed(12)))
    assert torch.equal(mask, _mask(kernel, 96, 64, p, _seed(11)))


@pytest.mark.parametrize(
    ("rows", "width", "rank", "p"), [(50, 160, 16, 0.25), (130, 64, 8, 0.5), (3, 260, 24, 0.05)]
)
def test_product_and_both_gradients_are_torch_arithmetic_on_the_mask(kernel, rows, width, rank, p) -> None:
    # Rows not a multiple of the tile, widths across and inside one tile, ranks below and above 16.
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, width, generator=gen)
    weight = torch.randn(rank, width, generator=gen)
    upstream = torch.randn(rows, rank, generator=gen)
    seed = _seed(5)
    mask = _mask(kernel, rows, width, p, seed)

    xr, wr = x.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    want = (xr * mask / (1 - p)) @ wr.t()
    (want * upstream).sum().backward()

    xk, wk = x.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    got = kernel.dropout_linear(xk, wk, p, seed)
    (got * upstream).sum().backward()
    for a, b in ((got, want), (xk.grad, xr.grad), (wk.grad, wr.grad)):
        assert torch.allclose(a, b.detach(), atol=1e-4, rtol=1e-4)


def test_half_precision_rounds_as_peft_does(kernel) -> None:
    # float16: Triton's interpreter multiplies bfloat16 tiles wrongly (their bits, not their values); the
    # kernels treat both alike, and `benchmarks/step_speed.py` runs bfloat16 on the GPU.
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 40, 128, generator=gen).half()
    weight = torch.randn(16, 128, generator=gen).half()
    seed, p = _seed(9), 0.1
    mask = _mask(kernel, 80, 128, p, seed).view(2, 40, 128)
    got = kernel.dropout_linear(x, weight, p, seed)
    dropped = (x.float() * mask / (1 - p)).half()  # torch's dropout rounds the kept value to x's dtype
    want = (dropped.float() @ weight.float().t()).half()
    assert got.shape == (2, 40, 16) and got.dtype == torch.float16
    assert (got.float() - want.float()).abs().max().item() <= 2e-3 * want.float().abs().max().item()


def test_the_seed_comes_from_torch_generator_so_a_checkpointed_recompute_draws_the_same_mask(kernel) -> None:
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(70, 64, generator=gen)
    weight = torch.randn(16, 64, generator=gen)

    def grads(checkpointed: bool) -> list[torch.Tensor]:
        xi, wi = x.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        torch.manual_seed(21)

        def f(a: torch.Tensor) -> torch.Tensor:
            return kernel.dropout_linear(a * 2, wi, 0.4)

        out = checkpoint(f, xi, use_reentrant=False) if checkpointed else f(xi)
        (out * out).sum().backward()
        return [out.detach(), xi.grad, wi.grad]

    plain, again = grads(False), grads(True)
    for a, b in zip(plain, again, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    torch.manual_seed(22)
    other = kernel.dropout_linear(x, weight, 0.4)
    assert not torch.allclose(other, plain[0] / 2)


def test_fits_refuses_what_the_kernels_do_not_take(kernel) -> None:
    x, w = torch.randn(4, 64), torch.randn(16, 64)
    assert kernel.fits(x, w, 0.1)
    assert not kernel.fits(x, w, 0.0) and not kernel.fits(x, w, 1.0)
    assert not kernel.fits(x, w.double(), 0.1)
    assert not kernel.fits(torch.randn(4, 66), torch.randn(16, 66), 0.1)
    assert not kernel.fits(x, torch.randn(200, 64), 0.1)
    with pytest.raises(ValueError, match="dropout_linear"):
        kernel.dropout_linear(x, w, 0.0)


def _lean_lora(monkeypatch):
    """A PEFT LoRA layer (64 -> 24, rank 16, dropout 0.25) on the lean forward (`trainer.lora_forward`),
    the dropout kernel tried on the CPU here, its probe not yet run."""
    from peft import LoraConfig, get_peft_model

    from trainer import lora_forward

    monkeypatch.setattr(lora_forward, "kernel_device", lambda x: True)
    monkeypatch.setattr(lora_forward, "_PROBED", {})
    monkeypatch.setattr(lora_forward.KERNEL, "failed", False)
    block = torch.nn.Sequential()
    block.add_module("proj", torch.nn.Linear(64, 24, bias=False))
    torch.manual_seed(0)
    model = get_peft_model(block, LoraConfig(r=16, lora_alpha=8, lora_dropout=0.25, target_modules=["proj"]))
    with torch.no_grad():
        model.base_model.model.proj.lora_B["default"].weight.normal_()
    assert lora_forward.install(model) == 1
    return model, model.base_model.model.proj


def test_the_lean_lora_forward_draws_its_dropout_in_the_kernel(kernel, monkeypatch) -> None:
    """base + lora_B(dropout(x) @ A.T * scaling), the kernel's mask for the seed torch's generator gave."""
    model, layer = _lean_lora(monkeypatch)
    x = torch.randn(3, 7, 64)

    torch.manual_seed(1)
    got = model(x)
    torch.manual_seed(1)
    mask = _mask(kernel, 21, 64, 0.25, kernel.draw_seed(x.device)).view(3, 7, 64)
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    want = layer.base_layer(x) + ((x * mask / 0.75) @ a.t() * 0.5) @ b.t()
    assert torch.allclose(got, want, atol=1e-5)
    model.eval()  # no dropout: the plain product
    assert torch.allclose(model(x), layer.base_layer(x) + (x @ a.t() * 0.5) @ b.t(), atol=1e-5)


def _checkpointed_and_plain(model, layer) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Output, input gradient and A's gradient, first under non-reentrant checkpointing (the probe, if
    any, runs there), then without."""
    x = torch.randn(3, 7, 64)

    def grads(checkpointed: bool) -> list[torch.Tensor]:
        model.zero_grad()
        xi = x.clone().requires_grad_(True)
        torch.manual_seed(5)
        out = checkpoint(model, xi, use_reentrant=False) if checkpointed else model(xi)
        (out * out).sum().backward()
        return [out.detach(), xi.grad, layer.lora_A["default"].weight.grad.clone()]

    return grads(True), grads(False)


@pytest.mark.parametrize("probe_fails", [False, True])
def test_under_checkpointing_the_recompute_draws_the_forwards_mask(kernel, monkeypatch, probe_fails):
    """The probe runs inside the checkpointed forward and saves nothing there; where it fails, before any
    mask is drawn, forward and recompute both draw torch's dropout. Either way the gradients are those
    of the run without checkpointing."""
    from trainer import lora_forward

    model, layer = _lean_lora(monkeypatch)
    if probe_fails:

        def broken(device, dtype):
            raise RuntimeError("no kernel here")

        monkeypatch.setattr(kernel, "probe", broken)
    checkpointed, plain = _checkpointed_and_plain(model, layer)
    for a, b in zip(checkpointed, plain, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    assert lora_forward.KERNEL.failed == probe_fails and lora_forward._PROBED


def test_the_backward_sums_many_row_groups(kernel) -> None:
    """More rows than one backward program sums (64 x 8): A's gradient is the atomic sum of several."""
    gen = torch.Generator().manual_seed(8)
    rows, width, p = 1100, 136, 0.6
    x, weight = torch.randn(rows, width, generator=gen), torch.randn(16, width, generator=gen)
    upstream = torch.randn(rows, 16, generator=gen)
    seed = _seed(3)
    mask = _mask(kernel, rows, width, p, seed)
    wr = weight.clone().requires_grad_(True)
    ((x * mask / (1 - p)) @ wr.t() * upstream).sum().backward()
    wk = weight.clone().requires_grad_(True)
    (kernel.dropout_linear(x, wk, p, seed) * upstream).sum().backward()
    assert torch.allclose(wk.grad, wr.grad, atol=1e-3, rtol=1e-4)
