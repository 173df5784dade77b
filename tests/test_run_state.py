"""The driver's shared state hammered from many threads at once (spark_jobs/driver/run_state.py,
the compaction request in driver/barrier.py, driver/epoch_ends.py): the first failure stands
whole, no count or checkpoint is lost, a compaction request is served by exactly one checkpoint,
a sink's history is read once per checkpoint. The switch interval is cut to a microsecond, and
in the code under test a thread gives up the interpreter between bytecodes at random
(:func:`yielding`): CPython 3.11 switches threads only at calls and loop ends, so without it an
unlocked check-then-set of a few bytecodes would look atomic here and race elsewhere."""

from __future__ import annotations

import inspect
import itertools
import queue
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from spark_jobs.driver.barrier import CompactionRequests
from spark_jobs.driver.epoch_ends import EpochEnds
from spark_jobs.driver.run_state import RunState
from spark_jobs.errors import IncompatibleStateError, exit_code, mark_task_error
from state.compaction import CompactionRequest, read_request, write_request
from state.paths import JobLayout
from state.storage import open_storage

ROUNDS = 40


@pytest.fixture(autouse=True)
def tight_switching() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@contextmanager
def yielding(*tested: object) -> Iterator[None]:
    """In the functions of the modules that define ``tested``, threads started meanwhile give
    up the interpreter between bytecodes at random (a trace function per opcode)."""
    files = {inspect.getfile(t) for t in tested}

    def each_opcode(frame, event, arg):
        if event == "opcode" and random.random() < 0.3:
            time.sleep(0)  # releases the GIL: another thread runs here
        return each_opcode

    def each_call(frame, event, arg):
        if frame.f_code.co_filename in files:
            frame.f_trace_opcodes = True
            return each_opcode
        return None

    threading.settrace(each_call)
    try:
        yield
    finally:
        threading.settrace(None)


def hammer(work: list[Callable[[], None]]) -> None:
    """Run every callable on a thread of its own, all released at once; re-raise the first
    error a thread met."""
    start, errors = threading.Barrier(len(work)), []

    def run(fn: Callable[[], None]) -> None:
        start.wait()
        try:
            fn()
        except BaseException as e:  # handed to the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(fn,)) for fn in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread hangs"
    if errors:
        raise errors[0]


def test_the_first_failure_stands_whole_and_never_changes():
    for _ in range(ROUNDS):
        failures_round()


def failures_round() -> None:
    state = RunState()
    seen: list[str] = []

    def failer(i: int) -> Callable[[], None]:
        if i % 3 == 0:  # a task's error, marked in Spark's text: stands typed and clean
            text = mark_task_error(IncompatibleStateError(f"reason {i}"))
            return lambda: state.fail(f"PythonException: ...\n{text}\n\tat", RuntimeError(i))
        return lambda: state.fail(f"reason {i}", ValueError(f"reason {i}"))

    def watcher() -> None:
        for _ in range(100):
            if (failure := state.failure) is not None:
                seen.append(failure)

    with yielding(RunState):
        hammer([failer(i) for i in range(12)] + [watcher] * 4)
    failure, error = state.failure, state.error
    assert failure in {f"reason {i}" for i in range(12)}
    assert str(error) == failure, "the reason and the error of one failure"
    if int(failure.split()[1]) % 3 == 0:
        assert isinstance(error, IncompatibleStateError) and exit_code(error) == 2
    assert set(seen) <= {failure}, f"the failure changed after it was seen: {set(seen)}"
    assert state.stop.is_set()


def test_no_count_or_checkpoint_is_lost_and_waiters_see_each_end():
    for _ in range(ROUNDS // 8):
        report_round()


def report_round(threads: int = 4, per_thread: int = 60) -> None:
    state = RunState()

    def micro_batches() -> None:
        for n in range(per_thread):
            state.count_batch(3, 1, 2)
            state.time_batch(1.5, n % 2 == 0)

    def acks(i: int) -> Callable[[], None]:
        def run() -> None:
            for n in range(per_thread):
                cid = i * per_thread + n
                end = state.checkpoint_completed if n % 3 else state.checkpoint_aborted
                end(cid)

        return run

    def waiter(i: int) -> Callable[[], None]:
        def run() -> None:
            for n in range(0, per_thread, 5):
                completed = state.wait_for_checkpoint(i * per_thread + n, 30)
                assert completed == bool(n % 3), (i, n)

        return run

    with yielding(RunState):
        hammer(
            [micro_batches] * threads
            + [acks(i) for i in range(threads)]
            + [waiter(i) for i in range(threads)]
            + [lambda: [state.checkpoints for _ in range(20)]] * 2
        )
    summary = state.summary("job", 1, {})
    n = threads * per_thread
    assert (summary.batches, summary.records) == (n, 3 * n)
    assert (summary.late_records, summary.bad_records) == (n, 2 * n)
    assert len(summary.batch_ms) == len(summary.batch_checkpointing) == n
    assert sorted(summary.checkpoints + summary.aborted) == list(range(n))
    assert len(summary.aborted) == threads * len(range(0, per_thread, 3))


class Events:
    def __init__(self) -> None:
        self.compacted: list[int] = []

    def emit(self, kind: str, payload: dict) -> None:
        if kind == "compacted":
            self.compacted.append(payload["checkpoint_id"])


def test_a_compaction_request_is_served_by_exactly_one_checkpoint(tmp_path):
    for round_ in range(ROUNDS // 2):
        compaction_round(tmp_path / f"round-{round_}", round_)


def compaction_round(root, round_: int) -> None:
    layout = JobLayout("job")
    storage = open_storage(str(root))
    write_request(storage, layout, CompactionRequest((0,), round_, None, "test"))
    state, events = RunState(), Events()
    requests = CompactionRequests(storage, layout, 2, state, lambda _: None, events)
    ids, barriers = itertools.count(1), queue.Queue()
    streams, finished, done = 3, [], threading.Event()

    def stream() -> None:  # plans barriers, serving the request at one of them
        for _ in range(25):
            cid = next(ids)
            if requests.subtasks_at(cid):
                requests.compacted(cid, 1.0)
            barriers.put(cid)
        finished.append(1)
        if len(finished) == streams:
            done.set()

    def ack(seed: int) -> Callable[[], None]:  # completes or aborts them, in any order
        rng = random.Random(seed)

        def run() -> None:
            while not (done.is_set() and barriers.empty()):
                try:
                    cid = barriers.get(timeout=0.01)
                except queue.Empty:
                    continue
                if rng.random() < 0.6:
                    requests.on_complete(SimpleNamespace(checkpoint_id=cid, file_count=1), 9)
                else:
                    requests.on_aborted(cid)

        return run

    hammer([stream] * streams + [ack(round_ * 10 + i) for i in range(3)])
    while read_request(storage, layout) is not None:  # its checkpoints all aborted
        cid = next(ids)
        requests.subtasks_at(cid)
        requests.on_complete(SimpleNamespace(checkpoint_id=cid, file_count=1), 9)
    assert len(events.compacted) == 1, f"served by checkpoints {events.compacted}"


class Sink:
    """A sink whose commit history takes a while to read, counting the reads."""

    def __init__(self) -> None:
        self.reads: list[int] = []

    def committed_epoch(self) -> int:
        return 100

    def committed_ends(self, after: int) -> dict[int, dict[str, dict[str, int]]]:
        self.reads.append(after)
        time.sleep(0.001)
        return {e: {"s": {"0": e * 10}} for e in range(after + 1, 101)}

    def committed_times(self, after: int) -> dict[int, int]:
        return {}


def test_epoch_ends_read_a_sink_history_once_and_lose_no_record():
    for _ in range(ROUNDS // 8):
        epoch_ends_round()


def epoch_ends_round() -> None:
    ends, sink = EpochEnds(), Sink()
    recorded: list[int] = []

    def reader() -> None:
        for batch in range(5):
            manifest = SimpleNamespace(batch_id=batch, checkpoint_id=batch)
            known = ends.committed_through(manifest, 100, [sink])
            assert all(known[e] == {"s": {"0": e * 10}} for e in range(batch + 1, 101))

    def recorder(i: int) -> Callable[[], None]:
        def run() -> None:
            for n in range(50):
                epoch = 1000 + i * 50 + n
                assert epoch in ends.record(epoch, {"s": {"0": epoch}})
                recorded.append(epoch)

        return run

    def forgetter() -> None:
        for epoch in range(0, 1000, 20):
            ends.forget_through(epoch)

    hammer([reader] * 6 + [recorder(i) for i in range(4)] + [forgetter] * 2)
    assert Counter(sink.reads) == {b: 1 for b in range(5)}, "each history read once"
    assert len(recorded) == 200
    assert set(ends.record(5000, {})) == {*recorded, 5000}, "no record lost"
