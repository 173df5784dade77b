"""The barrier's return path on the driver: cuts and acks into the coordinator, off Spark's
stream thread.

A micro-batch that carried barrier *n* records its :class:`Cut` (where the sources, sinks,
watermarks and counters stood at the barrier); each subtask's :class:`~state.acks.Ack` arrives in
this attempt's inbox in durable storage once its upload is done. The :class:`AckPoller` thread
hands both to the coordinator, which completes the checkpoint when it has all of them (writing
the manifest, then committing the catalog row: state/coordinator.py) and notifies its listener
(spark_jobs/driver/completion.py). Completion commits Delta transactions, so it runs
here, never on Spark's stream thread, which a stopping query interrupts.

:class:`CompactionRequests` serves a compaction request
(spark_jobs/maintenance/compaction.py) at a barrier: the named subtasks compact RocksDB before
their snapshot, and the request is cleared once a checkpoint holding the compacted state
completes.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from spark_jobs.catalog.tables import now_ms
from spark_jobs.driver.run_state import RunState, ServedCompaction
from spark_jobs.events import EventChannel
from state.acks import Ack, AckError, ack_location, ack_path, inbox
from state.compaction import (
    COMPACT_REQUEST,
    CompactionRequestError,
    clear_request,
    read_request,
)
from state.coordinator import CheckpointCoordinator
from state.manifest import CheckpointManifest, PartitionClocks, Positions
from state.paths import JobLayout
from state.storage import DurableStorage, StorageError


@dataclass(frozen=True)
class Cut:
    """Where a checkpoint's barrier stood, recorded after its micro-batch: the sources'
    positions, each sink's epoch, the stages' watermarks, where every epoch the sinks have not
    committed ended (and the processing time it was planned with), the counters, and the
    stages' per-partition clocks the watermarks come from."""

    checkpoint_id: int
    positions: Positions
    sink_epochs: dict[str, int]
    watermarks: dict[str, int]
    epoch_ends: dict[int, Positions]
    counters: dict[str, int]
    epoch_times: dict[int, int]
    partition_clocks: PartitionClocks


class AckPoller:
    """A thread that delivers cuts and this attempt's acks to the coordinator and expires
    overdue checkpoints. Acks of older attempts are never delivered: their inboxes are
    deleted at the start, and this attempt's acks once their checkpoint is no longer pending.
    It lists the inbox every 0.1 s while a checkpoint is pending or the last listing found
    acks, and not at all otherwise (on object storage, a listing is a billed request)."""

    def __init__(
        self,
        coordinator: CheckpointCoordinator,
        storage: DurableStorage,
        layout: JobLayout,
        attempt: int,
        tasks: list[tuple[str, int]],
        log: Callable[[str], None],
    ) -> None:
        self.coordinator, self.storage, self.layout = coordinator, storage, layout
        self.attempt, self.tasks, self.log = attempt, tasks, log
        self._cuts: queue.Queue[Cut] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cutline-acks", daemon=True)

    def record_cut(self, cut: Cut) -> None:
        """Hand a barrier's cut to the coordinator (on the poller's thread)."""
        self._cuts.put(cut)

    def start(self) -> AckPoller:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        delivered: set[str] = set()  # an ack whose read failed is read again the next round
        try:  # older attempts' acks: never read (only this attempt's inbox is), so only tidied
            self._drop_acks(self._acks_under("_acks"), lambda attempt, cid: attempt < self.attempt)
        except Exception as e:
            self.log(f"ack poller: older attempts' acks not deleted: {type(e).__name__}: {e}")
        listed: dict[str, tuple[int, int]] = {}
        while not self._stop.is_set():
            try:
                self._deliver_cuts()
                self.coordinator.expire(now_ms())
                if not self.coordinator.pending_ids() and not listed:
                    self._stop.wait(0.1)  # no ack to wait for, none to tidy: no listing
                    continue
                listed = self._acks_under(inbox(self.attempt))  # one listing a round
                for cid in self.coordinator.pending_ids():
                    for op, subtask in self.tasks:
                        path = ack_path(self.layout, self.attempt, cid, op, subtask)
                        if path in delivered or path not in listed:
                            continue
                        data = self.storage.get_bytes(path)  # a failed read: the next round
                        try:
                            ack = Ack.from_json(data, source=path)
                        except AckError as e:  # read whole and wrong: it stays wrong
                            self.coordinator.decline(cid, (op, subtask), str(e))
                        else:
                            self.coordinator.receive(ack, now_ms())
                        delivered.add(path)
                pending = set(self.coordinator.pending_ids())
                self._drop_acks(listed, lambda _, cid, live=pending: cid not in live)
            except Exception as e:  # keep polling; persistent failures show up as timeouts
                self.log(f"ack poller: {type(e).__name__}: {e}")
            self._stop.wait(0.1)

    def _deliver_cuts(self) -> None:
        while not self._cuts.empty():
            cut = self._cuts.get_nowait()
            self.coordinator.record_cut(
                cut.checkpoint_id,
                cut.positions,
                now_ms(),
                sink_epochs=cut.sink_epochs,
                watermarks=cut.watermarks,
                epoch_ends=cut.epoch_ends,
                counters=cut.counters,
                epoch_times=cut.epoch_times,
                partition_clocks=cut.partition_clocks,
            )

    def _acks_under(self, prefix: str) -> dict[str, tuple[int, int]]:
        """The acks stored under ``prefix`` (relative to the job root): storage path ->
        ``(attempt, checkpoint id)``."""
        skip = len(self.layout.job_id) + 1  # storage paths are "<job>/<relative path>"
        return {
            info.path: where
            for info in self.storage.list(self.layout.job_path(prefix))
            if (where := ack_location(info.path[skip:])) is not None
        }

    def _drop_acks(self, acks: dict[str, tuple[int, int]], stale) -> None:
        """Delete the ``acks`` for which ``stale(attempt, checkpoint_id)`` holds."""
        paths = [path for path, where in acks.items() if stale(*where)]
        if paths:
            self.storage.delete_many(paths)


class CompactionRequests:
    """Serves the job's compaction request, one at a time: at the next barrier the named
    subtasks (all, if it names none) compact RocksDB before their snapshot; once a checkpoint
    with the compacted state completes, the request is cleared (after the log line and event,
    so whoever waits for it to go sees them). An aborted checkpoint leaves it to the next
    barrier.

    The request being served is the run state's (driver/run_state.py): the stream thread
    serves it (:meth:`subtasks_at`, :meth:`compacted`), the ack thread completes or releases it
    (:meth:`on_complete`, :meth:`on_aborted`), each transition atomic, so a request is served by
    exactly one completed checkpoint."""

    def __init__(
        self,
        storage: DurableStorage,
        layout: JobLayout,
        parallelism: int,
        state: RunState,
        log: Callable[[str], None],
        events: EventChannel,
    ) -> None:
        self.storage, self.layout, self.parallelism = storage, layout, parallelism
        self.state, self.log, self.events = state, log, events

    def subtasks_at(self, checkpoint_id: int | None) -> frozenset[int]:
        """The subtasks that compact before ``checkpoint_id``'s snapshot: those of a pending
        request, unless an earlier checkpoint is serving it already."""
        if checkpoint_id is None:
            return frozenset()
        with self.state.compaction() as slot:
            if slot.serving is not None:
                return frozenset()
            try:
                request = read_request(self.storage, self.layout)
            except CompactionRequestError as e:
                self.log(f"{e}: removed")
                self.storage.delete(self.layout.job_path(COMPACT_REQUEST))
                return frozenset()
            except StorageError as e:  # tried again at the next barrier
                self.log(f"compaction request unreadable: {e}")
                return frozenset()
            if request is None:
                return frozenset()
            everyone = range(self.parallelism)
            subtasks = frozenset(s for s in request.subtasks if s in everyone)
            subtasks = subtasks or frozenset(everyone)
            slot.serving = ServedCompaction(checkpoint_id, request)
        self.log(
            f"checkpoint {checkpoint_id}: subtasks {sorted(subtasks)} compact their state first"
            f" ({request.reason or 'requested'})"
        )
        return subtasks

    def compacted(self, checkpoint_id: int, compact_ms: float) -> None:
        """The micro-batch of ``checkpoint_id`` ran; its slowest compaction took ``compact_ms``."""
        with self.state.compaction() as slot:
            serving = slot.serving
            if serving is not None and serving.checkpoint_id == checkpoint_id:
                slot.serving = replace(serving, compact_ms=compact_ms)

    def on_complete(self, manifest: CheckpointManifest, files_before: int) -> None:
        """Checkpoint ``manifest`` completed: if it holds the compacted state, report the
        compaction and clear the request (the slot stays taken until it is cleared)."""
        with self.state.compaction() as slot:
            serving = slot.serving
            if serving is None or manifest.checkpoint_id < serving.checkpoint_id:
                return
            self.log(
                f"state compacted at checkpoint {serving.checkpoint_id} in "
                f"{serving.compact_ms:.0f} ms: a restore now reads {manifest.file_count} files "
                f"(before: {files_before})"
            )
            self.events.emit(
                "compacted",
                {
                    "checkpoint_id": manifest.checkpoint_id,
                    "subtasks": sorted(serving.request.subtasks),
                    "files_before": files_before,
                    "files_after": manifest.file_count,
                    "compact_ms": serving.compact_ms,
                },
            )
            try:
                clear_request(self.storage, self.layout, serving.request)
            finally:
                slot.serving = None

    def on_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` aborted: a request it served waits for the next
        barrier."""
        with self.state.compaction() as slot:
            serving = slot.serving
            if serving is not None and serving.checkpoint_id == checkpoint_id:
                slot.serving = None
