"""The driver's heartbeat and the two reasons a live driver stops itself
(spark_jobs/driver/liveness.py), without Spark: a fake catalog with the Delta catalog's
``heartbeat`` and ``newest_attempt``, and a real process that has exited."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from spark_jobs.driver.liveness import heartbeat
from state.catalog import FencedError
from state.processes import alive

JOB = "clicks"


class Catalog:
    """Records heartbeats; ``newest`` gives the newest attempt at each call in turn (the last
    one from then on); an entry that is an exception is raised instead."""

    def __init__(self, *newest) -> None:
        self.newest = list(newest)
        self.beats: list[tuple[str, int]] = []
        self.fail_beats = 0

    def heartbeat(self, job_id: str, attempt: int) -> None:
        if self.fail_beats:
            self.fail_beats -= 1
            raise OSError("catalog commit conflict")
        self.beats.append((job_id, attempt))

    def newest_attempt(self, job_id: str) -> int:
        value = self.newest.pop(0) if len(self.newest) > 1 else self.newest[0]
        if isinstance(value, BaseException):
            raise value
        return value


class Run:
    """What the heartbeat thread is given: the stop event, the failure callback, the log."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.failures: list[tuple[str, BaseException | None]] = []
        self.lines: list[str] = []

    def fail(self, reason: str, error: BaseException | None) -> None:
        self.failures.append((reason, error))

    def beat(self, catalog: Catalog, attempt: int = 3, **kw) -> None:
        """Run the heartbeat to its end on a thread (a hang fails the test)."""
        args = (catalog, JOB, attempt, 0.002, self.stop, self.fail, self.lines.append)
        thread = threading.Thread(target=heartbeat, args=args, kwargs=kw, daemon=True)
        thread.start()
        thread.join(10)
        assert not thread.is_alive(), "the heartbeat did not end"


def exited_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_alive():
    assert alive(os.getpid())
    assert not alive(exited_pid())


def test_a_newer_attempt_supersedes_the_driver():
    run, catalog = Run(), Catalog(3, 3, 3, 4)
    run.beat(catalog)
    [(reason, error)] = run.failures
    assert isinstance(error, FencedError) and str(error) == reason
    assert reason == "attempt 4 of clicks has started: attempt 3 is superseded and stops"
    assert catalog.beats == [(JOB, 3)] * 4, "a heartbeat each round until superseded"
    assert run.lines == []


def test_the_same_or_an_older_attempt_does_not_supersede():
    run, catalog = Run(), Catalog(2, 3)

    def stop_after_beats() -> None:
        while len(catalog.beats) < 10:
            threading.Event().wait(0.001)
        run.stop.set()

    stopper = threading.Thread(target=stop_after_beats, daemon=True)
    stopper.start()
    run.beat(catalog)
    stopper.join(10)
    assert run.failures == [] and len(catalog.beats) >= 10


def test_a_missed_heartbeat_is_logged_not_a_failure():
    run, catalog = Run(), Catalog(3, RuntimeError("delta-rs read failed"), 3, 5)
    catalog.fail_beats = 2
    run.beat(catalog)
    assert run.lines == [
        "heartbeat: OSError: catalog commit conflict",
        "heartbeat: OSError: catalog commit conflict",
        "heartbeat: RuntimeError: delta-rs read failed",
    ]
    assert [r for r, _ in run.failures] == [
        "attempt 5 of clicks has started: attempt 3 is superseded and stops"
    ]


def test_an_orphaned_driver_stops_before_its_heartbeat():
    run, catalog = Run(), Catalog(3)
    pid = exited_pid()
    run.beat(catalog, watch_pid=pid)
    assert run.failures == [(f"the orchestrator process {pid} is gone", None)]
    assert catalog.beats == [], "no heartbeat once the orchestrator is gone"


def test_a_live_orchestrator_keeps_the_driver_running():
    run, catalog = Run(), Catalog(3, 3, 3, 3, 3, 4)
    run.beat(catalog, watch_pid=os.getpid())
    assert len(catalog.beats) == 6 and run.failures[0][1].__class__ is FencedError


def test_a_stopped_run_ends_the_heartbeat_without_failing():
    run, catalog = Run(), Catalog(9)
    run.stop.set()
    run.beat(catalog)
    assert run.failures == [] and catalog.beats == []


def test_upkeep_runs_after_each_heartbeat_and_its_errors_are_logged_not_fatal():
    run, calls = Run(), []

    def upkeep() -> dict[str, int]:
        calls.append(len(calls))
        if len(calls) == 1:
            raise OSError("S3 slow down")
        if len(calls) == 2:
            return {"completed_checkpoints": 12}
        run.stop.set()
        return {}

    run.beat(Catalog(3), upkeep=upkeep)
    assert len(calls) == 3 and not run.failures
    assert run.lines[:2] == [
        "catalog upkeep: OSError: S3 slow down",
        "catalog upkeep: clicks's 12 data files of completed_checkpoints compacted into one",
    ]
