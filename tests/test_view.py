"""RunView: the fold every viewer shares."""

from __future__ import annotations

from cockpit.record.view import RunView


def step(t: float, n: int, loss: float, rank: int = 0, dt: float = 2.0) -> dict:
    return {"t": t, "kind": "step", "rank": rank, "step": n, "max_steps": 10, "loss": loss, "step_time_s": dt}


def test_steps_progress_eta_and_trend() -> None:
    view = RunView()
    view.apply([{"t": 0.0, "kind": "train_begin", "rank": 0, "max_steps": 10, "start_step": 0}])
    view.apply([step(float(i), i, 10.0 - i) for i in range(1, 5)])
    assert view.step == 4 and view.max_steps == 10
    assert view.last_loss == 6.0
    assert view.eta_s() == 6 * 2.0
    first, last = view.loss_trend(fraction=0.25)
    assert first == 9.0 and last == 6.0


def test_other_ranks_give_memory_not_steps() -> None:
    view = RunView()
    event = step(1.0, 1, 5.0, rank=1) | {"cuda_peak_alloc_mib": 123.0}
    view.apply([event])
    assert view.steps == []
    assert view.memory[1]["cuda_peak_alloc_mib"] == 123.0


def test_resume_replaces_steps_after_the_checkpoint() -> None:
    view = RunView()
    view.apply([step(float(i), i, 1.0) for i in range(1, 8)])
    view.apply([{"t": 10.0, "kind": "train_begin", "rank": 0, "max_steps": 10, "start_step": 5}])
    view.apply([step(10.0 + i, i, 0.5) for i in range(6, 11)])
    assert [s.step for s in view.steps] == list(range(1, 11))
    assert [s.loss for s in view.steps][5:] == [0.5] * 5


def test_audit_warnings_and_phase() -> None:
    view = RunView()
    view.apply(
        [
            {"t": 1.0, "kind": "phase", "rank": 0, "phase": "load"},
            {"t": 2.0, "kind": "audit", "rank": 0, "warnings": ["experts: not in 4 bit"]},
        ]
    )
    assert view.phase == "load"
    assert view.warnings == ["experts: not in 4 bit"]
