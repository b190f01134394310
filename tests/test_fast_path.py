"""`trainer.fast_path.FastPath`: a fast path that fails is logged once and never tried again; out of
memory and checkpointing's stop are raised, not taken for a failure."""

from __future__ import annotations

import logging

import pytest
import torch

from trainer.fast_path import FastPath
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
