"""What stops a running attempt besides a failed micro-batch: its streaming query dying, the
loss of the executors that hold subtasks' working state (on a cluster: those subtasks must
restore from the latest checkpoint), the idle timeout (no new input), catching up with every
source (``--until-caught-up``), and a stop-with-savepoint request that finds the run idle. While
idle it calls the run's idle hook every 2 s (a barrier with no records when output is staged,
then savepoint requests: driver/micro_batches.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from spark_jobs.driver.placement import executor_hosts, lost_subtasks
from spark_jobs.driver.run_state import RunState

HOST_CHECK_S = 2.0  # how often a run on a cluster checks that its subtasks' hosts have executors
REQUEST_CHECK_S = 2.0  # how often an idle run looks for a savepoint request
WAITING_NOTE_S = 2.0  # idle this long having read everything: the run says it waits for input


class QueryWatch:
    """Watches one attempt's query from the main thread; the micro-batches report through
    :meth:`batch` (a micro-batch longer than the idle timeout is not idle time). It stops or
    fails the run through its :class:`RunState`. ``in_batch`` and ``last_progress`` are written
    by the stream thread and read here: single values, a stale read costs one poll."""

    def __init__(
        self,
        spark_context,
        idle_timeout_s: float | None,
        state: RunState,
        log: Callable[[str], None],
        until_caught_up: bool = False,
    ) -> None:
        self.sc = spark_context
        self.idle_timeout_s = idle_timeout_s
        self.until_caught_up = until_caught_up
        self.state, self.stop, self.log = state, state.stop, log
        # on a cluster, a host that loses its executors takes its subtasks' working state along
        self.watch_hosts = not spark_context.master.startswith("local")
        self.last_progress = time.monotonic()
        self.has_run = False
        self.in_batch = False
        self._said_waiting = -1  # the micro-batch count when the run last said it waits
        # while idle (no micro-batch, so no barrier): an idle barrier if output is staged, then
        # savepoint requests; says whether a stop-with-savepoint is requested
        # (MicroBatches.when_idle)
        self.when_idle: Callable[[], bool] = lambda: False

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Around one micro-batch."""
        self.in_batch = True
        try:
            yield
        finally:
            self.in_batch = False
            self.last_progress = time.monotonic()

    def restart_idle_clock(self) -> None:
        self.last_progress = time.monotonic()

    def __call__(self, query, allocation: dict[str, str]) -> None:
        """Until the run stops: the query's health, lost hosts (``allocation``: subtask ->
        host), the idle timeout, and a stop request while idle."""
        hosts_checked, suspect = time.monotonic(), None
        requests_checked = time.monotonic()
        while not self.stop.wait(0.2):
            if self.watch_hosts and time.monotonic() - hosts_checked > HOST_CHECK_S:
                hosts_checked = time.monotonic()
                lost = lost_subtasks(allocation, executor_hosts(self.sc))
                if lost and lost == suspect:  # two checks in a row: not a registration race
                    self.state.fail(
                        f"executors lost on {sorted(lost)}, which held the working state of "
                        f"subtasks {sorted(s for v in lost.values() for s in v)}: "
                        "restore from the latest checkpoint"
                    )
                    # a micro-batch waiting for those subtasks' tasks would wait forever
                    self.sc.cancelAllJobs()
                suspect = lost or None
            if query.exception() is not None:
                self.state.fail(f"micro-batch failed: {query.exception()}")
            elif not query.isActive:
                self.state.fail("the streaming query stopped")
            elif self.until_caught_up and not self.in_batch and caught_up(query.status):
                self.log("caught up with every source: stopping")
                self.stop.set()
            elif self.idle_timeout_s is not None and not self._idle(query):
                self.last_progress = time.monotonic()  # idle time counts from here
            elif (
                self.idle_timeout_s is not None
                and time.monotonic() - self.last_progress > self.idle_timeout_s
            ):
                self.log(f"no new input for {self.idle_timeout_s} s: stopping")
                self.stop.set()
            elif self._waits_for_input(query):
                self._said_waiting = self.state.batches
                self.log(
                    f"read everything the sources offer ({self.state.batches} micro-batches "
                    "so far): waiting for new input (--until-caught-up stops at this point, "
                    "--idle-timeout S after S s without input)"
                )
            elif (
                not self.in_batch
                and time.monotonic() - max(requests_checked, self.last_progress) > REQUEST_CHECK_S
            ):
                requests_checked = time.monotonic()
                if self.when_idle():
                    self.log(
                        "stop with savepoint while idle: its final checkpoint is the savepoint"
                    )
                    self.stop.set()

    def _waits_for_input(self, query) -> bool:
        """A run that does not stop when caught up has read all its input and waited
        :data:`WAITING_NOTE_S` since, and has not said so since its last micro-batch."""
        return (
            not self.until_caught_up
            and not self.in_batch
            and self._said_waiting != self.state.batches
            and time.monotonic() - self.last_progress > WAITING_NOTE_S
            and caught_up(query.status)
        )

    def _idle(self, query) -> bool:
        """The query has run a trigger (on a loaded machine the first can take longer than the
        idle timeout) and no micro-batch is running."""
        if not self.has_run:
            self.has_run = self.state.batches > 0 or query.lastProgress is not None
        return self.has_run and not self.in_batch


# what a micro-batch query's status says between two triggers (after its first)
BETWEEN_TRIGGERS = ("Waiting for next trigger", "Waiting for data to arrive")


def caught_up(status: dict) -> bool:
    """The query's last trigger found no new input in any source and none runs now: every
    record its sources offered has been read (and its micro-batch applied). Before the first
    trigger the status says it is initializing, so a run that starts with nothing to read is
    caught up after one trigger, not at once."""
    return (
        status.get("message") in BETWEEN_TRIGGERS
        and not status.get("isTriggerActive", True)
        and not status.get("isDataAvailable", True)
    )
