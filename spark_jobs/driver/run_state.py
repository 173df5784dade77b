"""What the threads of one attempt's driver share: :class:`RunState`, every part under a lock.

The threads (spark_jobs/driver/run.py) and what each does here:

- *main*: starts the query, watches it (driver/watch.py: reads the batch count, may fail the
  run or stop it), takes the final checkpoint and waits for it, builds the report.
- *restore* (``cutline-restore``): records the restored checkpoint, the subtasks' restore
  reports and the epochs replayed.
- *stream* (Spark's ``foreachBatch`` thread, driver/micro_batches.py): counts and times the
  micro-batches; at a barrier serves a compaction request and takes up a savepoint request.
- *acks* (``cutline-acks``, driver/barrier.py and completion.py): records completed and aborted
  checkpoints; clears a served compaction request, or releases it when its checkpoint aborts;
  writes a requested savepoint.
- *heartbeat* (``cutline-heartbeat``, driver/liveness.py): may fail the run.

Any of them may fail the run: the first failure stands, its reason and error set together, and
failing sets ``stop``. Readers get copies (:meth:`RunState.summary`, the properties), never the
lists the writers append to.

Not here: the :class:`~spark_jobs.driver.progress.Progress`, which is handed on rather than
shared (the restore's replay, then the stream thread, then the main thread once the query has
stopped: the first micro-batch waits for the restore, the final checkpoint for the query's
stop); the epochs' ends, which :class:`~spark_jobs.driver.epoch_ends.EpochEnds` locks itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from spark_jobs.errors import task_error
from spark_jobs.executor.reports import SubtaskRestoreReport
from state.catalog import FencedError
from state.compaction import CompactionRequest
from state.errors import NonRetryableError
from state.manifest import Positions
from state.savepoint import SavepointRequest


@dataclass(frozen=True)
class RunSummary:
    """One attempt's report to whoever started it: a copy, taken when the run ended."""

    job: str
    attempt: int
    restored_from: int | None
    batches: int = 0
    records: int = 0
    checkpoints: list[int] = field(default_factory=list)  # completed, in order
    aborted: list[int] = field(default_factory=list)
    restore_reports: list[SubtaskRestoreReport] = field(default_factory=list)
    positions: Positions = field(default_factory=dict)
    late_records: int = 0
    bad_records: int = 0
    replayed_epochs: int = 0  # committed epochs replayed without output after the restore
    failure: str | None = None
    batch_ms: list[float] = field(default_factory=list)  # wall time of each micro-batch
    batch_checkpointing: list[bool] = field(default_factory=list)  # a checkpoint was in flight


@dataclass(frozen=True)
class ServedCompaction:
    """A compaction request being served: ``checkpoint_id`` is the first checkpoint whose
    snapshot holds the compacted state; ``compact_ms`` its slowest subtask's compaction."""

    checkpoint_id: int
    request: CompactionRequest
    compact_ms: float = 0.0


class CompactionSlot:
    """The compaction request being served, if any; changed only inside
    :meth:`RunState.compaction`."""

    def __init__(self) -> None:
        self.serving: ServedCompaction | None = None


@dataclass(frozen=True)
class ServedSavepoint:
    """A savepoint request being served by checkpoint ``checkpoint_id`` (None: by the final
    checkpoint of a run stopping for it)."""

    request: SavepointRequest
    checkpoint_id: int | None


class SavepointSlot:
    """The savepoint request being served, if any; changed only inside
    :meth:`RunState.savepoint`."""

    def __init__(self) -> None:
        self.serving: ServedSavepoint | None = None


class RunState:
    """The failure, the run's report and the compaction and savepoint requests being served,
    shared by one attempt's driver threads (see the module docstring for who does what)."""

    def __init__(self) -> None:
        self.stop = threading.Event()  # stop taking micro-batches
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a checkpoint ended, or the run failed
        self._failure: str | None = None
        self._error: BaseException | None = None
        self._completed: list[int] = []
        self._aborted: list[int] = []
        self._batches = self._records = self._late = self._bad = self._replayed = 0
        self._batch_ms: list[float] = []
        self._batch_checkpointing: list[bool] = []
        self._restored_from: int | None = None
        self._restore_reports: tuple[SubtaskRestoreReport, ...] = ()
        # held across a request's read and clear (storage calls), so never with ``_lock``
        self._compaction_lock = threading.Lock()
        self._compaction = CompactionSlot()
        self._savepoint_lock = threading.Lock()  # held briefly: never across a savepoint's copy
        self._savepoint = SavepointSlot()

    # -- the failure ---------------------------------------------------------------------------

    def fail(self, reason: str, error: BaseException | None = None) -> None:
        """Fail the attempt and stop its micro-batches. The first failure stands. A failure
        whose text carries an error a Spark task marked (spark_jobs/errors.py) stands as that
        typed error, with its clean message as the reason."""
        if not isinstance(error, NonRetryableError | FencedError):
            marked = task_error(reason) or (task_error(str(error)) if error is not None else None)
            if marked is not None:
                marked.__cause__ = error
                reason, error = str(marked), marked
        with self._changed:
            if self._failure is None:
                self._failure, self._error = reason, error
            self._changed.notify_all()
        self.stop.set()

    def supersede(self, error: FencedError) -> None:
        """A failed attempt turns out superseded: ``error`` replaces its error (not its
        reason)."""
        with self._lock:
            if self._failure is not None:
                self._error = error

    @property
    def failure(self) -> str | None:
        """The reason the attempt failed, or ``None``."""
        with self._lock:
            return self._failure

    @property
    def error(self) -> BaseException | None:
        """The failure's error, when it had one."""
        with self._lock:
            return self._error

    @property
    def failed(self) -> bool:
        return self.failure is not None

    # -- checkpoints (the ack thread writes, the main thread waits) ---------------------------

    def checkpoint_completed(self, checkpoint_id: int) -> None:
        with self._changed:
            self._completed.append(checkpoint_id)
            self._changed.notify_all()

    def checkpoint_aborted(self, checkpoint_id: int) -> None:
        with self._changed:
            self._aborted.append(checkpoint_id)
            self._changed.notify_all()

    def wait_for_checkpoint(self, checkpoint_id: int, timeout_s: float) -> bool:
        """Wait until checkpoint ``checkpoint_id`` completes or aborts, the run fails, or
        ``timeout_s`` passes; whether it completed."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while (
                checkpoint_id not in self._completed
                and checkpoint_id not in self._aborted
                and self._failure is None
                and (left := deadline - time.monotonic()) > 0
            ):
                self._changed.wait(left)
            return checkpoint_id in self._completed

    @property
    def checkpoints(self) -> list[int]:
        """The completed checkpoints so far, in order (a copy)."""
        with self._lock:
            return list(self._completed)

    # -- micro-batches (the stream thread writes; the final checkpoint's on the main thread) ---

    def count_batch(self, records: int, late_records: int, bad_records: int) -> None:
        """A micro-batch ran: the records its first stage read, its late and bad records."""
        with self._lock:
            self._batches += 1
            self._records += records
            self._late += late_records
            self._bad += bad_records

    def time_batch(self, ms: float, checkpointing: bool) -> None:
        """A micro-batch took ``ms``; a checkpoint was in flight meanwhile (``checkpointing``)."""
        with self._lock:
            self._batch_ms.append(ms)
            self._batch_checkpointing.append(checkpointing)

    @property
    def batches(self) -> int:
        """How many micro-batches have run."""
        with self._lock:
            return self._batches

    # -- the restore (the restore thread writes) ----------------------------------------------

    def restored(self, checkpoint_id: int | None, reports: Sequence[SubtaskRestoreReport]) -> None:
        """The state was restored from ``checkpoint_id`` (``None``: started empty)."""
        with self._lock:
            self._restored_from, self._restore_reports = checkpoint_id, tuple(reports)

    def replayed(self, epochs: int) -> None:
        """``epochs`` committed epochs were replayed without output."""
        with self._lock:
            self._replayed = epochs

    @property
    def restored_from(self) -> int | None:
        with self._lock:
            return self._restored_from

    @property
    def restore_reports(self) -> tuple[SubtaskRestoreReport, ...]:
        with self._lock:
            return self._restore_reports

    # -- the compaction request being served --------------------------------------------------

    @contextmanager
    def compaction(self) -> Iterator[CompactionSlot]:
        """The compaction request being served, for one transition
        (driver/barrier.py ``CompactionRequests``): one thread at a time, from reading the
        request to setting the slot, or from completing it to clearing the request, so no
        request is read while it is being cleared and none is served by two checkpoints."""
        with self._compaction_lock:
            yield self._compaction

    @contextmanager
    def savepoint(self) -> Iterator[SavepointSlot]:
        """The savepoint request being served, for one transition (driver/savepoints.py): set
        when a barrier reads the request, cleared once its savepoint is recorded."""
        with self._savepoint_lock:
            yield self._savepoint

    # -- the report ----------------------------------------------------------------------------

    def summary(self, job: str, attempt: int, positions: Positions) -> RunSummary:
        """A copy of the run's report as it stands, with ``positions`` (the progress's)."""
        with self._lock:
            return RunSummary(
                job,
                attempt,
                self._restored_from,
                batches=self._batches,
                records=self._records,
                checkpoints=list(self._completed),
                aborted=list(self._aborted),
                restore_reports=list(self._restore_reports),
                positions=positions,
                late_records=self._late,
                bad_records=self._bad,
                replayed_epochs=self._replayed,
                failure=self._failure,
                batch_ms=list(self._batch_ms),
                batch_checkpointing=list(self._batch_checkpointing),
            )
