"""A rehearsal's depth loop: each depth trained in turn, bracketed in the record, then the forecast made
from the depths measured (`cockpit.rehearse`).

A depth that fails or is stopped ends the rehearsal; the depths already measured stay, and the forecast
is made from them (two at least).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cockpit.service.keeper import RecordKeeper
from cockpit.service.outcome import Outcome
from cockpit.service.spawn import rehearsal_args

# The training stage: trainer arguments in; status, diagnosis and exit code out.
Train = Callable[[list[str]], tuple[str, str, int]]


def rehearse(
    keeper: RecordKeeper, rehearsal: Mapping[str, Any], train: Train, stopped: Callable[[], bool]
) -> Outcome:
    """Every depth of `rehearsal` (run.json's) trained with `train`, until one does not finish or a stop
    is asked for (`stopped`), then the forecast from the depths measured."""
    from cockpit.rehearse.measure import BEGIN, END  # the rehearsal's models: only a rehearsal imports them
    from cockpit.rehearse.run import forecast_run, write_forecast

    steps, offset = int(rehearsal["steps"]), 0
    eval_tokens = int(rehearsal.get("eval_tokens") or 0)  # evaluation timed after each depth's steps
    measured: list[int] = []
    status, diagnosis, returncode = "finished", "", 0
    for layers in rehearsal["layers"]:
        if stopped():
            break
        keeper.write(BEGIN, layers=layers, steps=steps, step_offset=offset)
        status, diagnosis, returncode = train(rehearsal_args(layers, steps, offset, eval_tokens))
        end_status = "ok" if status == "finished" else status
        keeper.write(END, layers=layers, status=end_status, message=diagnosis, exit_code=returncode)
        offset += steps
        if status != "finished":
            break
        measured.append(layers)
    try:
        result = forecast_run(keeper.paths.root)
        write_forecast(keeper.paths.root, result)
        summary = result.summary()
        keeper.write("rehearsal", path=str(keeper.paths.rehearsal), summary=summary)
    except Exception as exc:  # the depths are in the record: `cockpit rehearse --show RUN` can try again
        summary = f"prediction failed: {type(exc).__name__}: {exc}"
        keeper.note(summary)
    done = ", ".join(map(str, measured)) or "none"
    skipped = [d for d in rehearsal["layers"] if d not in measured]
    if status == "finished" and skipped:  # a stop that came as a depth finished: the rest never ran
        left = ", ".join(map(str, skipped))
        return Outcome("stopped", f"stopped by user; depths {done} measured, {left} not run; {summary}", 3)
    if status == "finished":
        return Outcome("finished", f"rehearsed depths {done}; {summary}", 0)
    return Outcome(status, f"{diagnosis}; depths measured before: {done}; {summary}", returncode)
