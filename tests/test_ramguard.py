"""The host RAM guard: the limit, the decision, the supervisor acting once, the diagnosis."""

from __future__ import annotations

from pathlib import Path

import pytest

from cockpit.profiles import load_profile
from cockpit.record import read_events
from cockpit.service.diagnosis import EndFacts, diagnose
from cockpit.service.ramguard import default_margin_mib, ram_limit_mib, ram_verdict
from cockpit.service.runs import create_run
from cockpit.service.supervisor import Supervisor

GIB = 1024.0


@pytest.mark.parametrize(
    ("total_gib", "limit_gib"),
    [
        (512.0, 512.0 * 0.95),  # 5% (25.6 GiB) is more than 4 GiB
        (64.0, 60.0),  # 4 GiB is more than 5% (3.2 GiB)
        (80.0, 76.0),  # the two are equal
        (6.0, 3.0),  # 4 GiB would leave 2 of 6: the margin stops at half the host
    ],
)
def test_the_default_limit_leaves_a_margin_of_the_host(total_gib: float, limit_gib: float) -> None:
    assert ram_limit_mib(0.0, total_gib * GIB) == pytest.approx(limit_gib * GIB)


def test_a_limit_in_the_profile_is_taken_as_it_is() -> None:
    assert ram_limit_mib(2.5, 24 * GIB) == 2.5 * GIB
    assert ram_limit_mib(100.0, 24 * GIB) == 100 * GIB  # a profile for a bigger host: no cap here
    assert default_margin_mib(24 * GIB) == 4 * GIB


def test_the_verdict_comes_at_the_limit_and_names_both_figures() -> None:
    limit = 2.5 * GIB
    assert ram_verdict(None, limit) is None  # no reading: no decision
    assert ram_verdict(limit - 1, limit) is None
    assert ram_verdict(limit, limit) == "host RAM at 2.5 of 2.5 GiB; stopped before the OOM killer"
    assert ram_verdict(3.04 * GIB, limit) == "host RAM at 3.0 of 2.5 GiB; stopped before the OOM killer"
    assert ram_verdict(10 * GIB, 0.0) is None  # no limit known (a host that reports no RAM)


def test_the_verdict_s_two_figures_differ_when_they_do() -> None:
    """553 MiB against 512 read "0.5 of 0.5 GiB": the byte formatter's unit, and decimals enough."""
    assert ram_verdict(553, 512) == "host RAM at 553.0 of 512.0 MiB; stopped before the OOM killer"
    assert ram_verdict(2.51 * GIB, 2.5 * GIB) == "host RAM at 2.51 of 2.50 GiB; stopped before the OOM killer"
    assert ram_verdict(2.5 * GIB + 0.01, 2.5 * GIB).startswith("host RAM at 2.5 of 2.5 GiB;")  # just at it


GUARD = "host RAM at 2.6 of 2.5 GiB; stopped before the OOM killer"


def test_the_diagnosis_of_a_guarded_stop() -> None:
    facts = EndFacts(
        0, "", stop_requested=True, stop_reason=GUARD, ram_guard=GUARD, trainer_outcome="stopped", last_step=7
    )
    assert diagnose(facts) == ("stopped", f"{GUARD} (at step 7, checkpoint saved)")
    # The stop came during loading: nothing to checkpoint, the processes were terminated.
    early = EndFacts(-15, "", stop_requested=True, stop_reason=GUARD, ram_guard=GUARD)
    assert diagnose(early) == ("stopped", f"{GUARD} (terminated by SIGTERM)")
    # Without the guard, a user's stop keeps its own words.
    user = EndFacts(0, "", stop_requested=True, trainer_outcome="stopped", last_step=7)
    assert diagnose(user)[1] == "stopped by user at step 7, checkpoint saved"


class FakeTree:
    """The stage's process tree, with the RSS the test says."""

    def __init__(self, rss_mib: float) -> None:
        self.rss_mib = rss_mib

    def sample(self) -> dict[str, float]:
        return {"run_rss_mib": self.rss_mib}


@pytest.fixture
def supervisor(tmp_path: Path) -> Supervisor:
    profile, path = load_profile("tiny-cpu", ["hardware.host_ram_limit_gib=2.5"])
    return Supervisor(create_run(tmp_path, profile, path, ["cockpit", "run"]))


def test_the_supervisor_asks_for_a_stop_once_at_the_limit(supervisor: Supervisor) -> None:
    assert supervisor.runner.ram_limit_mib == 2.5 * GIB
    tree = FakeTree(2.4 * GIB)
    supervisor.runner.tree = tree  # type: ignore[assignment]
    supervisor.runner._check_host_ram()
    assert not supervisor.paths.stop_request.exists() and supervisor.runner.ram_stop is None
    tree.rss_mib = 2.6 * GIB
    supervisor.runner._check_host_ram()
    assert supervisor.paths.stop_request.exists() and supervisor.runner.ram_stop == GUARD
    supervisor.runner._check_requests(0.0)  # the next poll sees the request, as a user's
    tree.rss_mib = 3.0 * GIB  # still growing while the checkpoint is written: no second note
    supervisor.runner._check_host_ram()
    supervisor.keeper.events.close()
    notes = [e for e in read_events(supervisor.paths.root, "note") if "host_ram_limit_mib" in e]
    assert [n["message"] for n in notes] == [f"{GUARD}: checkpoint and stop requested"]
    assert notes[0]["run_rss_mib"] == 2.6 * GIB and notes[0]["host_ram_limit_mib"] == 2.5 * GIB
    assert supervisor.runner.stop_reason == GUARD


def test_a_stop_already_asked_for_is_not_claimed_by_the_guard(supervisor: Supervisor) -> None:
    supervisor.runner.request_stop()  # the user's, not yet seen by a poll
    supervisor.runner.tree = FakeTree(9 * GIB)  # type: ignore[assignment]
    supervisor.runner._check_host_ram()
    assert supervisor.runner.ram_stop is None and supervisor.runner.stop_reason == "user"


def test_the_default_limit_is_this_hosts_ram_less_the_margin(tmp_path: Path) -> None:
    import psutil

    profile, path = load_profile("tiny-cpu")
    assert profile.hardware.host_ram_limit_gib == 0.0
    supervisor = Supervisor(create_run(tmp_path, profile, path, ["cockpit", "run"]))
    total = psutil.virtual_memory().total / 2**20
    assert supervisor.runner.ram_limit_mib == pytest.approx(total - default_margin_mib(total))
