"""The evaluation stage: `trainer.evaluation.evaluate` launched and watched, then the report written from its
predictions (`cockpit.report`)."""

from __future__ import annotations

from cockpit.service.diagnosis import describe_exit, last_error_line, read_tail
from cockpit.service.outcome import Evaluation
from cockpit.service.spawn import evaluate_argv
from cockpit.service.stage import StageRunner


def evaluate(runner: StageRunner, extra_args: list[str]) -> Evaluation:
    """Score the held-out split (`extra_args` for `trainer.evaluation.evaluate`), then write the report."""
    keeper, paths = runner.keeper, runner.paths
    keeper.events.write("note", message="evaluating on the held-out split")
    runner.launch(evaluate_argv(paths.root, extra_args), "eval")
    returncode = runner.watch()
    if returncode != 0:
        if runner.stop_requested_at is not None:
            by = f": {runner.ram_stop}" if runner.ram_stop else " by user"
            return Evaluation("stopped", f"evaluation stopped{by}", returncode)
        tail = read_tail(paths.output_log)
        error = last_error_line(tail)
        summary = f"evaluation failed ({describe_exit(returncode, tail)}{': ' + error if error else ''})"
        return Evaluation("failed", summary, returncode)
    from cockpit.report import run_report, summary_line, write_report  # only once there is one to write

    try:
        report = run_report(paths.root)
        write_report(paths.root, report)
    except Exception as exc:  # the predictions are on disk: `cockpit report` can try again
        keeper.note(f"report failed: {exc}")
        return Evaluation("failed", f"report failed: {exc}", returncode)
    keeper.write("report", path=str(paths.report_json), summary=summary_line(report))
    return Evaluation("finished", summary_line(report), returncode)
