"""The restart strategy of ``restore_on_failure`` and the liveness rule of the heartbeat sensor,
as pure functions (tested without Dagster).

Restarts follow Flink's exponential-delay strategy with a failure-rate cap: the n-th restore
within ``window_s`` waits ``initial_backoff_s * multiplier**(n-1)`` (at most ``max_backoff_s``);
once ``max_restores`` restores were launched in the window, the strategy stops and says why.
A failure that a restore cannot fix (bad input or configuration, exit 2) is never restarted, nor
is an attempt that stopped because a newer one started (exit 3): spark_jobs/errors.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from spark_jobs.errors import EXIT_BAD_INPUT, EXIT_SUPERSEDED


@dataclass(frozen=True)
class RestartStrategy:
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    multiplier: float = 2.0
    max_restores: int = 5
    window_s: float = 600.0


@dataclass(frozen=True)
class Decision:
    restart: bool
    delay_s: float = 0.0
    number: int = 0  # this restore's number within the window
    reason: str = ""


def decide(strategy: RestartStrategy, restores_in_window: int, exit_code: int | None) -> Decision:
    """Whether to restore after a failure, given how many restores of the same job were
    launched within the window (the failed run itself counts if it was one)."""
    if exit_code == EXIT_BAD_INPUT:
        return Decision(False, reason="the driver rejected its input or configuration (exit 2)")
    if exit_code == EXIT_SUPERSEDED:
        return Decision(False, reason="a newer attempt of the job started (exit 3)")
    if restores_in_window >= strategy.max_restores:
        return Decision(
            False,
            reason=(
                f"{restores_in_window} restores within {strategy.window_s:.0f} s "
                f"(at most {strategy.max_restores}): giving up"
            ),
        )
    number = restores_in_window + 1
    delay = min(
        strategy.initial_backoff_s * strategy.multiplier ** (number - 1), strategy.max_backoff_s
    )
    return Decision(True, delay, number, f"restore {number} of at most {strategy.max_restores}")


@dataclass(frozen=True)
class Liveness:
    heartbeat_timeout_s: float = 60.0  # the driver heartbeats every 10 s
    startup_timeout_s: float = 300.0  # from run start to the attempt's first catalog row
    ended_grace_s: float = 30.0  # the driver ended; the run should have ended by now


def lost_reason(
    attempt: dict | None, run_started_ms: int, now_ms: int, rule: Liveness = Liveness()
) -> str | None:
    """Why a run marked running has lost its driver, or None while it looks alive.

    ``attempt`` is the run's ``streaming_jobs`` row (None before the driver wrote one).
    """
    if attempt is None:
        waited = (now_ms - run_started_ms) / 1000
        if waited > rule.startup_timeout_s:
            return f"no driver attempt in the catalog {waited:.0f} s after the run started"
        return None
    if attempt["status"] == "RUNNING":
        silent = (now_ms - (attempt["last_heartbeat_ms"] or attempt["started_ms"])) / 1000
        if silent > rule.heartbeat_timeout_s:
            return (
                f"attempt {attempt['attempt']}'s driver last heartbeat was {silent:.0f} s ago "
                f"(timeout {rule.heartbeat_timeout_s:.0f} s)"
            )
        return None
    since = (now_ms - (attempt["ended_ms"] or now_ms)) / 1000
    if since > rule.ended_grace_s:
        return (
            f"attempt {attempt['attempt']} ended {attempt['status']} {since:.0f} s ago but the run "
            "is still marked running: its run process is gone"
        )
    return None
