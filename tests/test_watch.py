"""What stops a running query (spark_jobs/driver/watch.py), without Spark: a fake query and a
fake SparkContext whose status store lists the live executors. The watch polls every 0.2 s on
the run state's stop event; here that event waits at most 5 ms, so a test takes many polls in
well under a second."""

from __future__ import annotations

import threading
import time

import pytest

from spark_jobs.driver import watch
from spark_jobs.driver.run_state import RunState
from spark_jobs.driver.watch import QueryWatch


class QuickEvent(threading.Event):
    """A stop event whose waits are cut to 5 ms: the watch's polls come quickly."""

    def wait(self, timeout: float | None = None) -> bool:
        return super().wait(0.005 if timeout is None else min(timeout, 0.005))


class Query:
    """A streaming query: ``exception()`` is called once per poll; after ``polls`` polls it
    stops the run (the test's deadline), and ``on_poll`` may change it on the way."""

    def __init__(self, state: RunState, polls: int = 2000, on_poll=None) -> None:
        self.state, self.polls, self.on_poll = state, polls, on_poll
        self.isActive, self.lastProgress, self.error = True, {"batchId": 0}, None
        self.status = {"message": "Initializing sources", "isDataAvailable": False,
                       "isTriggerActive": False}  # fmt: skip
        self.seen = 0

    def exception(self):
        if self.error is None:  # the watch calls it a second time to say what failed
            self.seen += 1
            if self.on_poll is not None:
                self.on_poll(self.seen)
            if self.seen >= self.polls:
                self.state.stop.set()
        return self.error


class Executors:
    """What ``sc._jsc.sc().statusStore().executorList(True)`` returns, through py4j."""

    def __init__(self, hosts: list[str]) -> None:
        self.summaries = [("driver", "10.0.0.9:4040")] + [
            (str(i), f"{h}:7337") for i, h in enumerate(hosts)
        ]

    def size(self) -> int:
        return len(self.summaries)

    def apply(self, i: int):
        ident, host_port = self.summaries[i]
        return type("Summary", (), {"id": lambda _: ident, "hostPort": lambda _: host_port})()


class SparkContext:
    def __init__(self, master: str, hosts: list[str]) -> None:
        self.master, self.hosts, self.cancelled = master, list(hosts), 0
        self._jsc = self

    # sc._jsc.sc().statusStore().executorList(True)
    def sc(self):
        return self

    def statusStore(self):
        return self

    def executorList(self, active_only: bool) -> Executors:
        return Executors(self.hosts)

    def cancelAllJobs(self) -> None:
        self.cancelled += 1


def rig(idle_timeout_s: float | None, master: str = "local[2]", hosts=(), caught_up=False):
    state, lines = RunState(), []
    state.stop = QuickEvent()
    sc = SparkContext(master, list(hosts))
    return state, lines, sc, QueryWatch(sc, idle_timeout_s, state, lines.append, caught_up)


def run(watcher: QueryWatch, query: Query, allocation=None, limit_s: float = 10.0) -> None:
    """Watch until the run stops (on a thread, so a hang fails the test)."""
    thread = threading.Thread(target=watcher, args=(query, allocation or {}), daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), "the watch did not stop"


def test_a_failed_micro_batch_fails_the_run():
    state, _, _, watcher = rig(None)
    query = Query(state, on_poll=lambda n: n == 3 and setattr(query, "error", "boom in batch 7"))
    run(watcher, query)
    assert state.failure == "micro-batch failed: boom in batch 7"
    assert query.seen == 3 and state.stop.is_set()


def test_a_stopped_query_fails_the_run():
    state, _, _, watcher = rig(None)
    query = Query(state, on_poll=lambda n: n == 2 and setattr(query, "isActive", False))
    run(watcher, query)
    assert state.failure == "the streaming query stopped"


def test_no_idle_timeout_runs_until_stopped():
    state, lines, _, watcher = rig(None)
    query = Query(state, polls=20)
    watcher.last_progress -= 3600
    run(watcher, query)
    assert query.seen == 20 and not state.failed and lines == []


def test_idle_input_stops_the_run_without_failing_it():
    started = time.monotonic()
    state, lines, _, watcher = rig(0.05)
    query = Query(state)
    run(watcher, query)
    assert not state.failed and state.stop.is_set()
    assert lines == ["no new input for 0.05 s: stopping"]
    assert query.seen < 2000 and time.monotonic() - started >= 0.05


def test_the_idle_clock_starts_with_the_first_trigger():
    """Before the query has run a trigger (no micro-batch counted, no progress) nothing is
    idle time, however long the start takes; the clock starts at the first trigger."""
    state, lines, _, watcher = rig(0.05)
    started: list[float] = []

    def first_trigger(n: int) -> None:
        if n == 59:  # the last poll before it: the idle clock restarts after this one
            started.append(time.monotonic())
        if n == 60:
            query.lastProgress = {"batchId": 0}

    query = Query(state, on_poll=first_trigger)
    query.lastProgress = None
    run(watcher, query)
    assert query.seen > 60, "no idle stop before the first trigger"
    assert lines == ["no new input for 0.05 s: stopping"]
    assert time.monotonic() - started[0] >= 0.05, "the idle time counts from the first trigger"


def test_a_counted_micro_batch_is_a_first_trigger():
    state, lines, _, watcher = rig(0.05)
    state.count_batch(1, 0, 0)
    query = Query(state)
    query.lastProgress = None
    run(watcher, query)
    assert lines == ["no new input for 0.05 s: stopping"] and query.seen < 2000


def test_a_long_micro_batch_is_not_idle_time():
    state, lines, _, watcher = rig(0.05)
    ended: list[float] = []
    batch = watcher.batch()

    def long_batch(n: int) -> None:
        if n == 1:
            batch.__enter__()
        if n == 80:  # some 0.4 s later: eight idle timeouts inside one micro-batch
            ended.append(time.monotonic())
            batch.__exit__(None, None, None)

    query = Query(state, on_poll=long_batch)
    run(watcher, query)
    assert query.seen > 80 and not watcher.in_batch
    assert lines == ["no new input for 0.05 s: stopping"]
    assert time.monotonic() - ended[0] >= 0.05, "the idle clock restarts when the batch ends"


def test_a_micro_batch_between_two_polls_restarts_the_idle_clock():
    """A micro-batch the watch never sees running (it began and ended between two polls)
    still restarts the idle clock when it ends."""
    state, lines, _, watcher = rig(0.05)
    ended: list[float] = []

    def short_batch(n: int) -> None:
        if n == 3:
            with watcher.batch():
                time.sleep(0.1)  # longer than the idle timeout, inside one poll
                ended.append(time.monotonic())

    query = Query(state, on_poll=short_batch)
    run(watcher, query)
    assert lines == ["no new input for 0.05 s: stopping"]
    assert time.monotonic() - ended[0] >= 0.05, "stopped at once: the batch counted as idle"


def trigger(query: Query, message: str, data: bool, active: bool = False) -> None:
    query.status = {"message": message, "isDataAvailable": data, "isTriggerActive": active}


def test_until_caught_up_stops_once_a_trigger_finds_no_new_input():
    """Not while the sources initialize, not during a trigger or a micro-batch, not after a
    trigger that found input; at the first poll that sees a trigger that found none, with no
    micro-batch running."""
    state, lines, _, watcher = rig(None, caught_up=True)
    batch = watcher.batch()

    def triggers(n: int) -> None:
        if n == 10:
            trigger(query, "Processing new data", True, active=True)
        if n == 20:
            trigger(query, "Waiting for next trigger", True)  # more input is waiting
        if n == 30:
            trigger(query, "Waiting for data to arrive", False, active=True)  # in the trigger
        if n == 40:
            batch.__enter__()  # a micro-batch the runtime still applies
            trigger(query, "Waiting for next trigger", False)
        if n == 50:
            batch.__exit__(None, None, None)

    query = Query(state, on_poll=triggers)
    run(watcher, query)
    assert lines == ["caught up with every source: stopping"]
    assert not state.failed and query.seen == 50, "stopped by the poll that saw the batch end"


def test_a_run_that_starts_caught_up_stops_after_its_first_trigger():
    state, lines, _, watcher = rig(None, caught_up=True)
    query = Query(
        state, on_poll=lambda n: n == 5 and trigger(query, "Waiting for data to arrive", False)
    )
    query.lastProgress = None  # a trigger without input reports no progress
    run(watcher, query)
    assert lines == ["caught up with every source: stopping"] and query.seen == 5


def test_without_until_caught_up_a_caught_up_run_goes_on():
    state, lines, _, watcher = rig(None)
    query = Query(state, polls=20)
    trigger(query, "Waiting for next trigger", False)
    run(watcher, query)
    assert query.seen == 20 and lines == []


def test_a_caught_up_run_says_once_per_idle_stretch_that_it_waits_for_input(monkeypatch):
    """Without --until-caught-up or an idle timeout a run that read everything waits: it says
    so (and how to stop there) once, and again only after another micro-batch."""
    monkeypatch.setattr(watch, "WAITING_NOTE_S", 0.0)
    state, lines, _, watcher = rig(None)
    batch = watcher.batch()

    def triggers(n: int) -> None:
        if n == 10:
            trigger(query, "Waiting for next trigger", False)
        if n == 30:
            batch.__enter__()
            state.count_batch(10, 0, 0)
            trigger(query, "Processing new data", True, active=True)
        if n == 40:
            batch.__exit__(None, None, None)
            trigger(query, "Waiting for data to arrive", False)

    query = Query(state, polls=60, on_poll=triggers)
    run(watcher, query)
    said = [line for line in lines if line.startswith("read everything")]
    assert said == [
        f"read everything the sources offer ({n} micro-batches so far): waiting for new input "
        "(--until-caught-up stops at this point, --idle-timeout S after S s without input)"
        for n in (0, 1)
    ], lines
    assert not state.failed and query.seen == 60


def test_local_mode_never_checks_executors():
    state, _, sc, watcher = rig(None, "local[2]", hosts=[])
    assert watcher.watch_hosts is False
    run(watcher, Query(state, polls=10), {"0": "10.0.0.1"})
    assert not state.failed and sc.cancelled == 0


@pytest.fixture
def quick_host_checks(monkeypatch):
    monkeypatch.setattr(watch, "HOST_CHECK_S", 0.0)


def test_lost_executors_fail_the_run_and_cancel_its_jobs(quick_host_checks):
    state, _, sc, watcher = rig(None, "spark://master:7077", hosts=["10.0.0.1", "10.0.0.2"])
    assert watcher.watch_hosts is True

    def lose_host(n: int) -> None:
        if n == 5:
            sc.hosts.remove("10.0.0.2")

    query = Query(state, on_poll=lose_host)
    run(watcher, query, {"0": "10.0.0.1", "1": "10.0.0.2", "2": "10.0.0.2"})
    assert state.failure == (
        "executors lost on ['10.0.0.2'], which held the working state of subtasks [1, 2]: "
        "restore from the latest checkpoint"
    )
    assert sc.cancelled == 1 and query.seen < 2000


def test_a_host_missing_from_one_check_only_is_not_lost(quick_host_checks):
    """An executor (re)registering is missing from one check: not a loss until two in a row."""
    state, _, sc, watcher = rig(None, "spark://master:7077", hosts=["10.0.0.1"])

    def flicker(n: int) -> None:  # missing from every other check
        sc.hosts = [] if n % 2 else ["10.0.0.1"]

    run(watcher, Query(state, polls=40, on_poll=flicker), {"0": "10.0.0.1"})
    assert not state.failed and sc.cancelled == 0


def test_the_driver_alone_is_no_executor(quick_host_checks):
    """On a cluster the driver's own host does not count as an executor's."""
    state, _, sc, watcher = rig(None, "spark://master:7077", hosts=[])
    run(watcher, Query(state), {"0": "10.0.0.9"})
    assert sc.cancelled == 1
    assert state.failure is not None and "executors lost on ['10.0.0.9']" in state.failure
