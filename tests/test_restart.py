"""The restart strategy and the liveness rule (orchestration.restart): pure functions."""

from __future__ import annotations

import pytest

from orchestration.restart import Liveness, RestartStrategy, decide, lost_reason
from spark_jobs.errors import EXIT_BAD_INPUT, EXIT_SUPERSEDED

STRATEGY = RestartStrategy(initial_backoff_s=1, max_backoff_s=5, multiplier=2, max_restores=4)


def test_backoff_grows_exponentially_up_to_its_maximum():
    delays = [decide(STRATEGY, n, exit_code=1).delay_s for n in range(4)]
    assert delays == [1, 2, 4, 5]
    assert [decide(STRATEGY, n, 1).number for n in range(4)] == [1, 2, 3, 4]


def test_stops_after_max_restores_in_the_window_and_says_why():
    decision = decide(STRATEGY, 4, exit_code=1)
    assert not decision.restart
    assert "4 restores within 600 s" in decision.reason


def test_bad_input_is_never_restarted():
    decision = decide(STRATEGY, 0, exit_code=EXIT_BAD_INPUT)
    assert not decision.restart and "configuration" in decision.reason


def test_a_superseded_attempt_is_never_restarted():
    """Exit 3: a newer attempt of the job runs; restoring this one would fence that one."""
    decision = decide(STRATEGY, 0, exit_code=EXIT_SUPERSEDED)
    assert not decision.restart and "newer attempt" in decision.reason


@pytest.mark.parametrize("code", [None, 1, -9, 137])
def test_crashes_and_kills_are_restarted(code):
    assert decide(STRATEGY, 0, code).restart


RULE = Liveness(heartbeat_timeout_s=60, startup_timeout_s=300, ended_grace_s=30)
NOW = 1_000_000_000


def attempt(status="RUNNING", heartbeat_age_s=0.0, ended_age_s=None):
    return {
        "attempt": 3,
        "status": status,
        "started_ms": NOW - 500_000,
        "last_heartbeat_ms": NOW - int(heartbeat_age_s * 1000),
        "ended_ms": None if ended_age_s is None else NOW - int(ended_age_s * 1000),
    }


def test_a_heartbeating_driver_is_alive():
    assert lost_reason(attempt(heartbeat_age_s=59), NOW - 900_000, NOW, RULE) is None


def test_a_silent_driver_is_lost():
    reason = lost_reason(attempt(heartbeat_age_s=61), NOW - 900_000, NOW, RULE)
    assert reason and "last heartbeat was 61 s ago" in reason


def test_a_driver_that_ended_while_the_run_still_runs_means_the_run_process_is_gone():
    assert lost_reason(attempt("FAILED", ended_age_s=10), NOW - 900_000, NOW, RULE) is None
    reason = lost_reason(attempt("FAILED", ended_age_s=31), NOW - 900_000, NOW, RULE)
    assert reason and "run process is gone" in reason


def test_a_run_whose_driver_never_started_is_lost_after_the_startup_timeout():
    assert lost_reason(None, NOW - 299_000, NOW, RULE) is None
    assert "no driver attempt" in lost_reason(None, NOW - 301_000, NOW, RULE)
