"""The driver's ack poller (spark_jobs/driver/barrier.py): every ack of a pending checkpoint
reaches the coordinator exactly once, one that could not be read is read again, one that was
read whole and is malformed declines its checkpoint naming it, a failed clean-up stops nothing,
and acks of older attempts and finished checkpoints are deleted."""

from __future__ import annotations

import threading
import time

from spark_jobs.driver.barrier import AckPoller
from state.acks import Ack, ack_path
from state.paths import JobLayout
from state.storage import LocalFileStorage
from tests.fakes import FaultyStorage

JOB = "clicks"
TASKS = [("count", 0), ("count", 1)]


class Coordinator:
    """The poller's view of the coordinator: checkpoint 1 pending until both acks arrived."""

    def __init__(self) -> None:
        self.received: list[tuple[int, str, int]] = []
        self.declined: list[str] = []
        self.done = threading.Event()

    def pending_ids(self) -> list[int]:
        return [] if self.done.is_set() else [1]

    def expire(self, now_ms: int) -> None:
        pass

    def receive(self, ack: Ack, now_ms: int) -> None:
        self.received.append((ack.checkpoint_id, *ack.task))
        if {(o, s) for _, o, s in self.received} == set(TASKS):
            self.done.set()

    def decline(self, checkpoint_id: int, task: tuple[str, int], reason: str) -> None:
        self.received.append((checkpoint_id, *task))
        self.declined.append(reason)
        if {(o, s) for _, o, s in self.received} == set(TASKS):
            self.done.set()


def test_an_ack_whose_read_failed_is_read_again_and_each_is_delivered_once(tmp_path):
    storage = FaultyStorage(LocalFileStorage(tmp_path / "remote"))
    layout = JobLayout(JOB)
    old = ack_path(layout, 1, 1, "count", 0)  # attempt 1's: deleted, never delivered
    storage.put_bytes(old, Ack(1, 1, "count", 0, declined="old").to_json())
    failures = iter([True])  # the first read of subtask 1's ack fails, as S3 can once
    storage.fail_get = lambda path: path.endswith("count-1.json") and next(failures, False)
    for op, subtask in TASKS:
        ack = Ack(2, 1, op, subtask, declined="no space")
        storage.put_bytes(ack_path(layout, 2, 1, op, subtask), ack.to_json())
    coordinator, lines = Coordinator(), []
    poller = AckPoller(coordinator, storage, layout, 2, TASKS, lines.append).start()
    try:
        assert coordinator.done.wait(10), f"acks delivered: {coordinator.received}; {lines}"
        deadline = time.monotonic() + 10
        while list(storage.list(JOB)) and time.monotonic() < deadline:
            time.sleep(0.05)  # the finished checkpoint's acks are deleted next
    finally:
        poller.stop()
    assert sorted(coordinator.received) == [(1, "count", 0), (1, "count", 1)]
    assert lines == [
        f"ack poller: OSError: injected storage fault reading {JOB}/_acks/a2/chk-1/count-1.json"
    ]
    assert list(storage.list(JOB)) == []


def test_a_malformed_ack_declines_its_checkpoint_and_a_failed_clean_up_stops_nothing(tmp_path):
    storage = FaultyStorage(LocalFileStorage(tmp_path / "remote"))
    layout = JobLayout(JOB)
    failures = iter([True])  # the first listing, of older attempts' acks, fails
    storage.fail_list = lambda prefix: prefix == f"{JOB}/_acks" and next(failures, False)
    good = Ack(2, 1, "count", 0, declined="no space")
    storage.put_bytes(ack_path(layout, 2, 1, "count", 0), good.to_json())
    torn = ack_path(layout, 2, 1, "count", 1)
    storage.put_bytes(torn, b'{"attempt": 2, "checkpoint_id": 1, "operator": "count", "sub')
    coordinator, lines = Coordinator(), []
    poller = AckPoller(coordinator, storage, layout, 2, TASKS, lines.append).start()
    try:
        assert coordinator.done.wait(10), f"acks delivered: {coordinator.received}; {lines}"
    finally:
        poller.stop()
    assert sorted(coordinator.received) == [(1, "count", 0), (1, "count", 1)]  # each once
    [reason] = coordinator.declined
    assert reason.startswith(f"{torn}: malformed ack (JSONDecodeError"), reason
    assert lines == [
        f"ack poller: older attempts' acks not deleted: OSError: injected storage fault listing "
        f"{JOB}/_acks"
    ]
