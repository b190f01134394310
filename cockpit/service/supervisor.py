"""The supervisor: the one process that owns a run, from launch to diagnosis.

Started detached (its own session) by `cockpit run`, so closing the terminal or the viewer never
stops training. It launches the trainer ranks through the DeepSpeed launcher with their output going
straight into `output.log` (a file, not a pipe: nothing can fill up and block the trainer, and the
trainer keeps writing even if the supervisor dies), watches for stop requests, and writes the
final status and a one-line diagnosis into `run.json`.

Its rooms: what it launches and how (`spawn`), its writes to the record (`keeper`), the watch of a
stage's processes (`stage`), and the stages: training (`training`), evaluation (`evaluation`), a
rehearsal's depths (`rehearsal`). This module runs an attempt through them.

Usage: `python -m cockpit.service.supervisor RUN_DIR [--resume | --eval [--model NAME=PATH ...]]`. Started by
`cockpit.service.lifecycle`, never by hand.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cockpit.profiles import parse_profile
from cockpit.service import evaluation, rehearsal, training
from cockpit.service.keeper import RecordKeeper
from cockpit.service.liveness import boot_start, started_at
from cockpit.service.outcome import Evaluation, Outcome
from cockpit.service.spawn import end_process, popen_logged, sampler_argv, trainer_problem
from cockpit.service.stage import StageRunner


class Supervisor:
    """Owns one run: launch, watch, stop, diagnose.

    One attempt a process: a new run (train then evaluate, or evaluate base models only), a resume
    (`resume`), or the evaluation of an ended run (`eval_args`, the arguments for
    `trainer.evaluation.evaluate`).
    """

    def __init__(
        self,
        run_dir: Path,
        resume: bool = False,
        eval_args: Sequence[str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.keeper = RecordKeeper(run_dir)
        self.paths = self.keeper.paths
        self.manifest = self.keeper.manifest
        self.resume = resume
        self.eval_args = None if eval_args is None else list(eval_args)
        self.profile = parse_profile(self.manifest["profile"], str(self.paths.manifest))
        self.runner = StageRunner(self.keeper, self.profile, resume, clock)
        self.telemetry: subprocess.Popen[bytes] | None = None

    # --- the stages --------------------------------------------------------------------------------
    def train(self, extra: Sequence[str] = ()) -> tuple[str, str, int]:
        """The training stage; returns (status, diagnosis, exit code)."""
        return training.train(self.runner, self.resume, extra)

    def evaluate(self, extra_args: list[str]) -> Evaluation:
        """The evaluation stage and the report."""
        return evaluation.evaluate(self.runner, extra_args)

    def attempt(self) -> Outcome:
        """This attempt's stages, by what the supervisor was started for."""
        problem = trainer_problem()  # the ranks start here, with this interpreter: would they run ours?
        if problem is not None:
            return Outcome("failed", problem, 2)
        if self.eval_args is not None:
            return self._evaluate_ended_run(self.eval_args)
        if self.manifest.get("mode", "train") == "rehearse":
            return rehearsal.rehearse(self.keeper, self.manifest["rehearsal"], self.train, self._stop_asked)
        if self.manifest.get("mode", "train") == "eval":
            evaluated = self.evaluate(["--no-adapter", *self.manifest.get("eval_args", [])])
            return evaluated.outcome({"evaluation": asdict(evaluated)})
        return self._train_then_evaluate()

    def _stop_asked(self) -> bool:
        return self.runner.stop_requested_at is not None

    def _train_then_evaluate(self) -> Outcome:
        """Train, then evaluate if training finished; `training` keeps the training's own outcome."""
        status, diagnosis, returncode = self.train()
        fields: dict[str, Any] = {
            "training": {"status": status, "diagnosis": diagnosis, "exit_code": returncode},
            "evaluation": None,
        }
        if status != "finished" or not self.profile.eval.enabled:
            return Outcome(status, diagnosis, returncode, fields)
        if self.runner.stop_requested_at is not None:
            later = f"cockpit eval {self.paths.root.name}"
            evaluated = Evaluation("skipped", f"evaluation skipped (stop requested): {later}")
        else:  # training finished whatever evaluation does: its outcome goes into the diagnosis
            evaluated = self.evaluate([])
        fields["evaluation"] = asdict(evaluated)
        return Outcome(status, f"{diagnosis}; {evaluated.summary}", returncode, fields)

    def _evaluate_ended_run(self, eval_args: list[str]) -> Outcome:
        """Evaluate an ended run again: its training's outcome stays, this evaluation's is added to it."""
        evaluated = self.evaluate(eval_args)
        fields = {"evaluation": asdict(evaluated)}
        trained = self.manifest.get("training")
        if not trained:  # an evaluation-only run
            return evaluated.outcome(fields)
        diagnosis = f"{trained.get('diagnosis') or trained['status']}; {evaluated.summary}"
        return Outcome(trained["status"], diagnosis, trained.get("exit_code"), fields)

    # --- telemetry ---------------------------------------------------------------------------------
    def _start_telemetry(self) -> None:
        """Start the sampler (its own process, its own event file) for the whole run: its root is this
        supervisor, so the process tree it measures holds every stage's processes (train, eval)."""
        argv = sampler_argv(self.paths.root, os.getpid())
        try:
            self.telemetry = popen_logged(argv, self.paths.telemetry_log, detached=False)
        except OSError as exc:  # telemetry is worth having, never worth failing a run for
            self.keeper.events.write("note", message=f"telemetry sampler did not start: {exc}")

    def _stop_telemetry(self) -> None:
        """Ask the sampler to write its last line and exit; kill it if it does not."""
        end_process(self.telemetry)

    # --- the attempt -------------------------------------------------------------------------------
    def run(self) -> int:
        """The whole life of the attempt; returns 0 when the run's status is `finished`."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.runner.on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the terminal going away is not a reason to stop
        # A request already in control/ was made for this attempt (the lifecycle clears old ones before
        # a resume or an evaluation): a stop asked for while the supervisor was starting must not be lost.
        keeper = self.keeper
        keeper.make_reserve()
        keeper.events.write(
            "supervisor_start",
            pid=os.getpid(),
            resume=self.resume,
            host_ram_limit_mib=round(self.runner.ram_limit_mib, 1),
        )
        keeper.update_manifest(
            status="running",
            started_at=self.manifest.get("started_at") or time.time(),
            ended_at=None,
            diagnosis=None,
            exit_code=None,
            supervisor_pid=os.getpid(),
            supervisor_started_at=started_at(os.getpid()),  # with the PID, proves it is this supervisor
            supervisor_boot_start=boot_start(os.getpid()),  # the same proof, blind to the wall clock
            resumed=self.resume or self.manifest.get("resumed", False),
            warning=None,
        )
        self._start_telemetry()
        try:
            outcome = self.attempt()
        except Exception as exc:  # the supervisor itself failed: say so in the record, then re-raise
            self.runner.signal_group(signal.SIGKILL)
            self._stop_telemetry()
            keeper.events.write("end", status="failed", diagnosis=f"supervisor error: {exc!r}")
            keeper.update_manifest(
                status="failed", diagnosis=f"supervisor error: {exc!r}", ended_at=time.time()
            )
            raise
        self._stop_telemetry()
        status, diagnosis, returncode = outcome.status, outcome.diagnosis, outcome.exit_code
        keeper.write("end", status=status, diagnosis=diagnosis, exit_code=returncode)
        keeper.update_manifest(
            status=status, diagnosis=diagnosis, exit_code=returncode, ended_at=time.time(), **outcome.fields
        )
        keeper.close()
        return 0 if status == "finished" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cockpit.service.supervisor", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    parser.add_argument("--eval", action="store_true", help="evaluate the ended run (base, adapter, models)")
    parser.add_argument("--model", action="append", default=[], metavar="NAME=PATH", help="with --eval")
    args = parser.parse_args(argv)
    eval_args = [a for model in args.model for a in ("--model", model)] if args.eval else None
    return Supervisor(args.run_dir, resume=args.resume, eval_args=eval_args).run()


if __name__ == "__main__":
    sys.exit(main())
