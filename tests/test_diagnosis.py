"""Every way a run can end gets its own one-line diagnosis."""

from __future__ import annotations

from cockpit.service.diagnosis import (
    EndFacts,
    describe_exit,
    diagnose,
    killing_signal,
    last_error_line,
    stall_verdict,
)

TRACEBACK = """Traceback (most recent call last):
  File "x.py", line 1, in <module>
ValueError: tokenizer has no pad token
[launch.py:319:sigkill_handler] Killing subprocess 123
"""


def test_finished() -> None:
    assert diagnose(EndFacts(0, "", trainer_outcome="finished", last_step=40)) == (
        "finished",
        "finished at step 40",
    )


def test_stopped_by_user_with_checkpoint() -> None:
    status, line = diagnose(EndFacts(0, "", stop_requested=True, trainer_outcome="stopped", last_step=12))
    assert status == "stopped" and "stopped by user at step 12" in line and "checkpoint" in line


def test_cuda_oom_names_the_gpu_peaks() -> None:
    out = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    status, line = diagnose(EndFacts(1, out, gpu_peak_mib={0: 79_000.0, 1: 78_500.0}, last_step=3))
    assert status == "failed" and line.startswith("CUDA out of memory after step 3")
    assert "GPU0 77.1 GiB" in line and "GPU1" in line


def test_nccl_timeout() -> None:
    out = "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE)"
    assert diagnose(EndFacts(1, out))[1].startswith("NCCL/collective timeout")


def test_sigkill_near_ram_limit_is_host_oom() -> None:
    out = "[launch.py] Process 77 exits with return code = -9"
    status, line = diagnose(EndFacts(247, out, host_ram_peak_fraction=0.97, host_ram_peak_mib=900 * 1024))
    assert status == "failed" and "SIGKILL" in line and "host out-of-memory" in line and "900.0 GiB" in line


def test_sigkill_with_ram_to_spare_is_just_a_kill() -> None:
    _status, line = diagnose(EndFacts(-9, "", host_ram_peak_fraction=0.3))
    assert line == "killed by SIGKILL"


def test_crash_quotes_the_last_error_line() -> None:
    status, line = diagnose(EndFacts(1, TRACEBACK, last_step=2))
    assert status == "failed"
    assert line == "crashed after step 2 with exit code 1: ValueError: tokenizer has no pad token"


def test_stall_wins_over_the_kill_that_ended_it() -> None:
    status, line = diagnose(EndFacts(-9, "", stalled=True, stall_detail="no step for 300 s (median 0.4 s)"))
    assert status == "stalled" and "no step for 300 s" in line


def test_signal_from_launcher_text_and_shell_style_codes() -> None:
    assert killing_signal(EndFacts(1, "exits with return code = -15")) == 15
    assert killing_signal(EndFacts(137, "")) == 9
    assert killing_signal(EndFacts(1, "")) is None
    assert last_error_line("no errors here") == ""


def test_stall_is_judged_against_the_runs_own_pace() -> None:
    assert stall_verdict(5.0, 0.5, 60.0, None)[0] == "ok"
    verdict, line = stall_verdict(31.0, 0.5, 60.0, True)
    assert verdict == "suspect" and "(62x the median step time of 0.50 s), GPUs idle" in line
    assert stall_verdict(31.0, 0.5, 60.0, False)[0] == "ok", "busy GPUs are not a stall yet"
    assert stall_verdict(61.0, 0.5, 60.0, False)[0] == "stalled", "but the timeout still holds"
    # A slow run (15 s a step) is not stopped at a 60 s timeout: ten median steps first.
    assert stall_verdict(100.0, 15.0, 60.0, None)[0] == "suspect"
    verdict, line = stall_verdict(151.0, 15.0, 60.0, None)
    assert verdict == "stalled" and "stopped after 150 s; " in line and line.endswith("(now 60 s)")
    assert stall_verdict(70.0, None, 60.0, None)[0] == "stalled", "no step at all yet: the timeout alone"


def test_a_full_disk_is_named_even_when_the_log_could_not_say_so() -> None:
    torn = "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 2304 vs 2198"
    status, line = diagnose(EndFacts(1, torn, disk_free_mib=0.0, last_step=2))
    assert status == "failed" and line.startswith("disk full after step 2") and "0.0 MiB free" in line
    assert diagnose(EndFacts(1, "OSError: [Errno 28] No space left on device"))[1].startswith("disk full")
    assert diagnose(EndFacts(1, torn, disk_free_mib=500.0))[1].startswith("crashed")


def test_error_lines_behind_a_rank_prefix_are_found() -> None:
    error = "ValueError: DeepSpeed Zero-3 is not compatible with passing a `device_map`."
    out = f'[rank0]:   File "x.py", line 3\n[rank0]: {error}\n'
    assert last_error_line(out) == error


def test_a_stop_after_the_last_step_leaves_the_run_finished() -> None:
    facts = EndFacts(0, "", stop_requested=True, trainer_outcome="finished", last_step=400)
    status, line = diagnose(facts)
    assert status == "finished" and line.startswith("finished at step 400")


def test_a_stop_that_ended_by_a_signal_names_it() -> None:
    status, line = diagnose(EndFacts(-15, "", stop_requested=True, last_step=5))
    assert status == "stopped"
    assert line == "stopped by user at step 5 (terminated by SIGTERM)"
    assert "-15" not in line


def test_a_signal_without_a_stop_names_it() -> None:
    assert diagnose(EndFacts(-15, "", last_step=3)) == ("failed", "terminated by SIGTERM after step 3")
    assert diagnose(EndFacts(143, ""))[1] == "terminated by SIGTERM"  # a shell's 128 + 15


def test_exit_described_in_words() -> None:
    assert describe_exit(-15) == "terminated by SIGTERM"
    assert describe_exit(-2) == "terminated by SIGINT"
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(1, "[launch.py] Process 7 exits with return code = -15") == "terminated by SIGTERM"
    assert describe_exit(1) == "exit code 1"
