"""When an idle run takes a barrier with no records (spark_jobs/driver/micro_batches.py
``MicroBatches.when_idle``), without Spark: the coordinator's policy and the savepoint requests
are fakes that record what they were asked, and the micro-batch without records is recorded,
not run. The real run is in tests/test_savepoint_runs.py (an idle job's output committed in
full while it runs)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from spark_jobs.driver.micro_batches import EXPIRY_GRACE_S, MicroBatches
from spark_jobs.driver.run_state import RunState


class Policy:
    """The coordinator as the idle hook sees it: a trigger the test allows or not."""

    def __init__(self, allows: bool) -> None:
        self.allows, self.triggered, self.pending = allows, [], []

    def trigger(self, epoch: int, positions, now_ms: int, force: bool = False):
        if not self.allows:
            return None
        self.triggered.append(epoch)
        self.pending.append(40 + len(self.triggered))
        return SimpleNamespace(checkpoint_id=self.pending[-1])

    def pending_ids(self) -> list[int]:
        return list(self.pending)


class Requests:
    """Savepoint requests: which barriers they saw, and what the idle check was told."""

    def __init__(self, stops: bool = False) -> None:
        self.stops, self.barriers, self.idle_calls = stops, [], []

    def at_barrier(self, checkpoint_id: int) -> None:
        self.barriers.append(checkpoint_id)

    at_final = at_barrier

    def when_idle(self, committed, pending: bool) -> bool:
        self.idle_calls.append((committed, pending))
        return self.stops


def batches(epoch: int, *, exactly_once: bool = True, allows: bool = True, stops=False):
    b = object.__new__(MicroBatches)  # no Spark: only the idle hook's collaborators
    b.exactly_once, b.lock, b.state = exactly_once, threading.Lock(), RunState()
    b.progress = SimpleNamespace(epoch=epoch)
    b.coordinator, b.savepoints, b.lines, b.ran = Policy(allows), Requests(stops), [], []
    b.idle_barrier, b.barriers = None, {}
    b.log = b.lines.append
    b._without_records = lambda cid, count=True: b.ran.append((b.progress.epoch, cid, count))
    return b


def committed_at(batch_id: int) -> SimpleNamespace:
    return SimpleNamespace(batch_id=batch_id, checkpoint_id=7)


def idle(b: MicroBatches, committed) -> bool:
    """The watch's call, and the barrier's thread (if it started one) to its end."""
    stops = b.when_idle(lambda: committed)
    if b.idle_barrier is not None:
        b.idle_barrier.join(10)
        assert not b.idle_barrier.is_alive()
    return stops


def test_staged_output_gets_a_barrier_with_no_records_in_an_epoch_of_its_own():
    b = batches(epoch=9)
    assert idle(b, committed_at(6)) is False
    assert b.coordinator.triggered == [10] and b.progress.epoch == 10
    assert b.ran == [(10, 41, False)]  # not counted as a micro-batch
    assert b.savepoints.barriers == [41]  # a pending savepoint request is served by it
    assert len(b.savepoints.idle_calls) == 1  # then the requests: a pending one is served by it
    assert b.lines == ["idle: checkpoint 41, a barrier with no records, commits the output of "
                       "epochs 7..9"]  # fmt: skip


@pytest.mark.parametrize(
    "epoch, committed, options",
    [
        (9, committed_at(9), {}),  # everything committed
        (0, None, {}),  # nothing ran, nothing restored
        (9, committed_at(6), {"allows": False}),  # the interval has not passed: later
        (9, committed_at(6), {"exactly_once": False}),  # at least once: appended already
    ],
)
def test_no_barrier_without_staged_output_or_before_the_policy_allows(epoch, committed, options):
    b = batches(epoch, **options)
    idle(b, committed)
    assert b.ran == [] and b.progress.epoch == epoch and b.savepoints.barriers == []
    assert b.savepoints.idle_calls == [(committed, False)]


def test_an_idle_job_takes_one_barrier_not_one_per_checkpoint_the_policy_allows():
    """With max_concurrent above 1 the policy allows a barrier while the last is pending; the
    barrier with no records is not output of its own, so none follows it (issue 37: an idle
    job checkpointed every few seconds, for ever)."""
    b = batches(epoch=9)
    idle(b, committed_at(6))
    assert b.coordinator.triggered == [10]  # checkpoint 41, pending
    idle(b, committed_at(6))  # still pending: it covers the staged output
    b.coordinator.pending.clear()  # 41 completed
    idle(b, committed_at(10))
    assert b.coordinator.triggered == [10] and b.progress.epoch == 10
    b.coordinator.pending.append(42)  # a micro-batch with a barrier of its own: pending
    b.progress.epoch = 11
    b._barrier_at(42, 11)
    idle(b, committed_at(10))
    assert b.coordinator.triggered == [10]
    b.coordinator.pending.clear()
    b.coordinator.pending.append(43)  # it was aborted; an unrelated checkpoint is pending
    idle(b, committed_at(10))
    assert b.coordinator.triggered == [10, 12], "output no pending barrier covers gets one"


def test_nothing_ever_committed_but_epochs_ran_takes_one():
    b = batches(epoch=3)
    idle(b, None)
    assert b.ran == [(4, 41, False)]


def test_a_barrier_that_fails_fails_the_run_and_the_watch_goes_on():
    b = batches(epoch=9)

    def cancelled(cid, count=True):
        raise RuntimeError("Job 12 cancelled because SparkContext was shut down")

    b._without_records = cancelled
    assert idle(b, committed_at(6)) is False  # the watch was back at once
    assert b.state.failure.startswith("idle barrier: RuntimeError: Job 12 cancelled")


def test_a_stopping_run_takes_none_and_a_stop_request_stops_it():
    b = batches(epoch=9, stops=True)
    b.state.stop.set()
    assert idle(b, committed_at(6)) is True
    assert b.ran == []


class Waits(RunState):
    """The run's state, recording how long the final checkpoint was allowed to wait; the
    checkpoint ends (completes or aborts) as ``ends`` says."""

    def __init__(self, ends) -> None:
        super().__init__()
        self.ends, self.allowed = ends, []

    def wait_for_checkpoint(self, checkpoint_id: int, timeout_s: float) -> bool:
        self.allowed.append(timeout_s)
        self.ends(self, checkpoint_id)
        return super().wait_for_checkpoint(checkpoint_id, 5.0)


@pytest.mark.parametrize("completes", [True, False], ids=["completes", "aborted"])
def test_the_final_checkpoint_waits_as_long_as_the_jobs_checkpoint_timeout(completes):
    """Not a fixed limit: on slow storage a final checkpoint that completes within the job's own
    timeout ends the run well; one aborted (it expired) fails it."""
    b = batches(5)
    b.job = SimpleNamespace(checkpoint=SimpleNamespace(timeout_ms=900_000))
    end = RunState.checkpoint_completed if completes else RunState.checkpoint_aborted
    b.state = Waits(lambda state, cid: end(state, cid))
    b.final_checkpoint()
    assert b.state.allowed == [900.0 + EXPIRY_GRACE_S]
    assert b.ran == [(6, 41, True)] and b.savepoints.barriers == [41]
    assert b.state.failure == (None if completes else "final checkpoint 41 did not complete")
