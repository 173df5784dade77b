"""The driver's ack poller (spark_jobs/driver/barrier.py): every ack of a pending checkpoint
reaches the coordinator exactly once, one that could not be read is read again, and acks of
older attempts and finished checkpoints are deleted."""

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
        self.done = threading.Event()

    def pending_ids(self) -> list[int]:
        return [] if self.done.is_set() else [1]

    def expire(self, now_ms: int) -> None:
        pass

    def receive(self, ack: Ack, now_ms: int) -> None:
        self.received.append((ack.checkpoint_id, *ack.task))
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
