"""`trainer.fast_path.FastPath`: a fast path that fails is logged once and never tried again; out of
memory and checkpointing's stop are raised, not taken for a failure."""

from __future__ import annotations

import logging

import pytest
import torch

from trainer.fast_path import FastPath, restore_forwards, swap_forwards
from trainer.pass_through import PASS_THROUGH


def test_a_failure_is_logged_once_and_the_path_is_not_tried_again(caplog) -> None:
    path = FastPath("the kernel", "the slow path")
    calls: list[int] = []

    def broken() -> int:
        calls.append(1)
        raise RuntimeError("no PTX for this GPU")

    with caplog.at_level(logging.WARNING):
        assert path.run(broken) is None
        assert path.run(broken) is None
    assert path.failed and calls == [1]
    assert [r.getMessage() for r in caplog.records] == [
        "the kernel unavailable (RuntimeError: no PTX for this GPU); the slow path"
    ]


def test_a_working_path_returns_its_value_every_time() -> None:
    path = FastPath("the kernel", "the slow path")
    assert [path.run(lambda: 3), path.run(lambda: 4)] == [3, 4] and not path.failed


@pytest.mark.parametrize("error", PASS_THROUGH)
def test_out_of_memory_is_raised_and_is_no_failure(error: type[BaseException]) -> None:
    path = FastPath("the kernel", "the slow path")

    def out_of_memory() -> None:
        raise error("CUDA out of memory") if error is torch.OutOfMemoryError else error()

    with pytest.raises(error):
        path.run(out_of_memory)
    assert not path.failed


def _doubled(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return 2 * type(self).forward(self, x)


def test_swapped_forwards_are_undone_and_accelerates_are_left_alone() -> None:
    """`swap_forwards` skips a module accelerate has hooked (its instance forward moves the inputs to the
    module's GPU); `restore_forwards` undoes only the forwards it gave, not another instance forward."""
    model = torch.nn.Sequential(torch.nn.Identity(), torch.nn.Identity(), torch.nn.Identity())
    hooked, foreign = model[1], model[2]
    hooked._hf_hook = object()
    hooked.forward = lambda x: x + 1  # accelerate's wrapper, as `add_hook_to_module` leaves it
    x = torch.ones(2)
    assert swap_forwards(model, lambda m: isinstance(m, torch.nn.Identity), _doubled) == 2
    foreign.forward = lambda x: x - 1  # set after the swap: not the swap's to undo
    assert [m(x).tolist() for m in model] == [[2.0, 2.0], [2.0, 2.0], [0.0, 0.0]]
    assert restore_forwards(model, lambda m: isinstance(m, torch.nn.Identity)) == 1
    assert [m(x).tolist() for m in model] == [[1.0, 1.0], [2.0, 2.0], [0.0, 0.0]]
