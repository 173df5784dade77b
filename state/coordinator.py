"""The checkpoint coordinator: trigger, collect acks, complete, notify (Flink's protocol).

A protocol object with time injected: every method that depends on time takes ``now_ms``, so
tests drive it without sleeping. Thread-safe: acks arrive from snapshot threads while the driver
loop triggers. Listener callbacks run outside the state lock, in the order the events happened.

Lifecycle of checkpoint n:

1. :meth:`trigger` at a micro-batch cut, when the interval has elapsed since the last trigger,
   ``min_pause`` since the last completion, and fewer than ``max_concurrent`` are pending. The id
   is claimed first (``chk-<n>/_claim``, created exclusively in durable storage), skipping ids
   another attempt claimed: ids never collide, with a zombie attempt or with the orphan manifest
   of a driver killed before its catalog commit.
2. :meth:`receive` per task with its :class:`~state.acks.Ack` (a state handle, or a decline that
   aborts); duplicate, late, unknown and other attempts' acks are answered, not applied;
   :meth:`expire` aborts those past ``timeout``.
3. With all acks in: write ``_metadata``, commit the catalog row (only now is n complete), abort
   older pending checkpoints, subsume completed ones beyond ``num_retained``, notify.
4. Consecutive failures beyond ``tolerable_failed_checkpoints`` fail the job.

When a checkpoint may start and when failures fail the job are policy objects
(state/checkpoint_policies.py); what a checkpoint holds while it waits for its acks, the answers
to an ack and the listener's events are in state/pending_checkpoint.py.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from state.acks import Ack
from state.catalog import CheckpointCatalog, CheckpointStatus, CompletedCheckpoint, FencedError
from state.checkpoint_policies import (
    CheckpointFailureError,
    FailurePolicy,
    ListenerError,
    TriggerPolicy,
)
from state.claims import claim_checkpoint_id
from state.config import CheckpointConfig
from state.faults import kill_point
from state.handles import SubtaskStateHandle
from state.manifest import CheckpointManifest, PartitionClocks
from state.paths import JobLayout
from state.pending_checkpoint import (
    AckResult,
    CheckpointListener,
    PendingCheckpoint,
    TaskId,
)
from state.registry import select_subsumed
from state.storage import AlreadyExistsError, DurableStorage, StorageError

log = logging.getLogger(__name__)


class CheckpointCoordinator:
    """Coordinates the checkpoints of one attempt of one job."""

    def __init__(
        self,
        job_id: str,
        attempt: int,
        config: CheckpointConfig,
        tasks: Iterable[TaskId],
        storage: DurableStorage,
        catalog: CheckpointCatalog,
        *,
        listeners: Iterable[CheckpointListener] = (),
        restored: CheckpointManifest | None = None,
        now_ms: int = 0,
        stages: dict[str, dict[str, str]] | None = None,
    ) -> None:
        self.layout = JobLayout(job_id)
        self.job_id = job_id
        self.attempt = attempt
        self.config = config
        self.tasks = frozenset(tasks)
        if not self.tasks:
            raise ValueError("a coordinator needs at least one task to acknowledge checkpoints")
        self.storage = storage
        self.catalog = catalog
        self.listeners = list(listeners)
        self.stages = dict(stages or {})  # uid -> state fingerprints, into every manifest
        self._lock = threading.Lock()
        self._delivery = threading.Lock()
        self._events: list[Callable[[CheckpointListener], Any]] = []
        self._pending: dict[int, PendingCheckpoint] = {}
        self._finished: set[int] = set()
        self._retained: list[CompletedCheckpoint] = [
            c for c in catalog.checkpoints(job_id, (CheckpointStatus.COMPLETED,))
        ]
        newest = catalog.newest_checkpoint_id(job_id)
        self._next_id = max(newest, restored.checkpoint_id if restored else 0) + 1
        self._latest: CheckpointManifest | None = restored
        self.trigger_policy = TriggerPolicy(config, now_ms)
        self.failure_policy = FailurePolicy(config.tolerable_failed_checkpoints)
        self.failure: CheckpointFailureError | FencedError | ListenerError | None = None
        self.stats = {
            "triggered": 0,
            "completed": 0,
            "aborted": 0,
            "late_acks": 0,
            "ids_skipped": 0,  # claimed by another attempt
        }

    # -- queries -----------------------------------------------------------------------------

    @property
    def latest_completed(self) -> CheckpointManifest | None:
        """The last confirmed checkpoint (or the one restored from): the base for increments."""
        with self._lock:
            return self._latest

    def base_handle(self, task: TaskId) -> SubtaskStateHandle | None:
        latest = self.latest_completed
        return latest.handle(*task) if latest else None

    def pending_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._pending)

    def pending_paths(self) -> set[str]:
        """Paths uploaded for pending checkpoints so far (protected from GC)."""
        with self._lock:
            return {
                f.path
                for p in self._pending.values()
                for h in p.acks.values()
                if h is not None
                for f in h.files
            }

    def retained(self) -> list[CompletedCheckpoint]:
        with self._lock:
            return list(self._retained)

    # -- trigger -----------------------------------------------------------------------------

    def should_trigger(self, now_ms: int) -> bool:
        with self._lock:
            return self._may_trigger(now_ms)

    def _may_trigger(self, now_ms: int) -> bool:
        return self.failure is None and self.trigger_policy.may_trigger(now_ms, len(self._pending))

    def trigger(
        self,
        batch_id: int,
        source_positions: dict[str, dict[str, int]] | None,
        now_ms: int,
        *,
        sink_epochs: dict[str, int] | None = None,
        force: bool = False,
        savepoint: bool = False,
    ) -> PendingCheckpoint | None:
        """Start checkpoint n after micro-batch ``batch_id`` if the policy allows (or ``force``).

        ``source_positions`` are the positions at the cut: everything up to and including
        ``batch_id`` is in the state this checkpoint captures. When they are only known after the
        micro-batch ran, pass None and call :meth:`record_cut` then; the checkpoint cannot
        complete before.
        """
        with self._lock:
            if self.failure is not None:
                return None
            if not force and not self._may_trigger(now_ms):
                return None
            if force and len(self._pending) >= self.config.max_concurrent:
                return None
            try:
                checkpoint_id = self._claim_locked(self._next_id)
            except (StorageError, OSError) as e:
                self._count_failure_locked(f"claiming checkpoint {self._next_id}: {e}")
                checkpoint_id = None
            if checkpoint_id is not None:
                pending = PendingCheckpoint(
                    checkpoint_id=checkpoint_id,
                    batch_id=batch_id,
                    trigger_time_ms=now_ms,
                    source_positions={s: dict(p) for s, p in (source_positions or {}).items()},
                    sink_epochs=dict(sink_epochs or {}),
                    waiting=set(self.tasks),
                    savepoint=savepoint,
                    cut_recorded=source_positions is not None,
                )
                self._next_id = checkpoint_id + 1
                self._pending[checkpoint_id] = pending
                self.trigger_policy.triggered(now_ms)
                self.stats["triggered"] += 1
                return pending
        self._deliver()  # the claim failed, and with it maybe the job
        return None

    def _claim_locked(self, first: int) -> int:
        """The lowest id from ``first`` that this attempt could claim (state/claims.py)."""
        checkpoint_id, skipped = claim_checkpoint_id(self.storage, self.layout, self.attempt, first)
        self.stats["ids_skipped"] += skipped
        return checkpoint_id

    def record_cut(
        self,
        checkpoint_id: int,
        source_positions: dict[str, dict[str, int]],
        now_ms: int,
        *,
        sink_epochs: dict[str, int] | None = None,
        watermarks: dict[str, int] | None = None,
        epoch_ends: dict[int, dict[str, dict[str, int]]] | None = None,
        counters: dict[str, int] | None = None,
        epoch_times: dict[int, int] | None = None,
        partition_clocks: PartitionClocks | None = None,
    ) -> AckResult:
        """Record the source positions (sink epochs, watermarks, the end positions and planned
        processing times of the epochs the sinks have not committed, counters, the stages'
        per-partition clocks) at ``checkpoint_id``'s cut."""
        with self._lock:
            pending = self._pending.get(checkpoint_id)
            if pending is None:
                return AckResult.LATE if checkpoint_id in self._finished else AckResult.UNKNOWN
            pending.source_positions = {s: dict(p) for s, p in source_positions.items()}
            pending.sink_epochs.update(sink_epochs or {})
            pending.watermarks.update(watermarks or {})
            pending.epoch_ends.update(epoch_ends or {})
            pending.counters.update(counters or {})
            pending.epoch_times.update(epoch_times or {})
            pending.partition_clocks.update(partition_clocks or {})
            pending.cut_recorded = True
            if not self._take_if_ready_locked(pending):
                return AckResult.ACCEPTED
        return self._complete_and_notify(pending, now_ms)

    # -- acks --------------------------------------------------------------------------------

    def receive(self, ack: Ack, now_ms: int) -> AckResult:
        """Deliver a subtask's ack: its handle, or its decline. An ack of another attempt is
        answered UNKNOWN and never applied."""
        if ack.attempt != self.attempt:
            return AckResult.UNKNOWN
        if ack.declined is not None:
            self.decline(ack.checkpoint_id, ack.task, ack.declined)
            return AckResult.ACCEPTED
        return self.acknowledge(ack.checkpoint_id, ack.task, ack.handle, now_ms)

    def acknowledge(
        self, checkpoint_id: int, task: TaskId, handle: SubtaskStateHandle | None, now_ms: int
    ) -> AckResult:
        """Record ``task``'s ack; completes the checkpoint when it is the last one missing."""
        with self._lock:
            pending = self._pending.get(checkpoint_id)
            if pending is None:
                if checkpoint_id in self._finished:
                    self.stats["late_acks"] += 1
                    return AckResult.LATE
                return AckResult.UNKNOWN
            if task not in self.tasks:
                return AckResult.UNKNOWN
            if task in pending.acks:
                return AckResult.DUPLICATE
            if handle is not None and (
                handle.checkpoint_id != checkpoint_id or handle.task != task
            ):
                raise ValueError(
                    f"handle {handle.task}@{handle.checkpoint_id} acked as {task}@{checkpoint_id}"
                )
            pending.acks[task] = handle
            pending.waiting.discard(task)
            if not self._take_if_ready_locked(pending):
                return AckResult.ACCEPTED
        return self._complete_and_notify(pending, now_ms)

    def decline(self, checkpoint_id: int, task: TaskId, reason: str) -> None:
        """A task could not take its snapshot: abort the checkpoint."""
        with self._lock:
            self._abort_locked(checkpoint_id, f"declined by {task}: {reason}")
        self._deliver()

    def expire(self, now_ms: int) -> list[int]:
        """Abort pending checkpoints older than ``timeout``; returns their ids."""
        with self._lock:
            expired = [
                p.checkpoint_id
                for p in self._pending.values()
                if now_ms - p.trigger_time_ms >= self.config.timeout_ms
            ]
            for cid in expired:
                self._abort_locked(cid, f"expired after {self.config.timeout_ms} ms")
        self._deliver()
        return expired

    def abort_all(self, reason: str, *, count_failure: bool = False) -> None:
        """Abort every pending checkpoint (a graceful stop or a failed attempt)."""
        with self._lock:
            for cid in list(self._pending):
                self._abort_locked(cid, reason, count_failure=count_failure)
        self._deliver()

    # -- internals ---------------------------------------------------------------------------

    def _take_if_ready_locked(self, pending: PendingCheckpoint) -> bool:
        """Remove ``pending`` for completion once all acks and its cut are in."""
        if pending.waiting or not pending.cut_recorded:
            return False
        del self._pending[pending.checkpoint_id]
        self._finished.add(pending.checkpoint_id)
        return True

    def _complete_and_notify(self, pending: PendingCheckpoint, now_ms: int) -> AckResult:
        try:
            self._complete(pending, now_ms)
        finally:
            self._deliver()
        return AckResult.COMPLETED

    def _abort_locked(self, checkpoint_id: int, reason: str, *, count_failure: bool = True) -> None:
        if self._pending.pop(checkpoint_id, None) is None:
            return
        self._finished.add(checkpoint_id)
        self.stats["aborted"] += 1
        log.warning("checkpoint %s of %s aborted: %s", checkpoint_id, self.job_id, reason)
        self._events.append(lambda lst: lst.on_checkpoint_aborted(checkpoint_id, reason))
        if count_failure:
            self._count_failure_locked(f"checkpoint {checkpoint_id}: {reason}")

    def _count_failure_locked(self, reason: str) -> None:
        error = self.failure_policy.failed(reason)
        if error is not None:
            self._fail_locked(error)

    def _fail_locked(self, error: CheckpointFailureError | FencedError | ListenerError) -> None:
        if self.failure is None:
            self.failure = error
            self._events.append(lambda lst: lst.on_job_failed(error))

    def _complete(self, pending: PendingCheckpoint, now_ms: int) -> None:
        manifest = pending.to_manifest(self.job_id, self.attempt, self.stages)
        record = CompletedCheckpoint.from_manifest(manifest, now_ms)
        try:
            # Exclusive: a zombie attempt that reached the same id can never replace it.
            self.storage.put_bytes(
                self.layout.job_path(self.layout.metadata(manifest.checkpoint_id)),
                manifest.to_json(),
                exclusive=True,
            )
            kill_point("metadata-written")
            self.catalog.commit_checkpoint(record)
        except AlreadyExistsError as e:
            self._abort_completion(
                pending, f"id taken by another attempt: {e}", count_failure=False
            )
            return
        except FencedError as e:
            self._abort_completion(pending, f"fenced: {e}", count_failure=False, error=e)
            return
        except Exception as e:  # storage or catalog failure: the checkpoint did not complete
            self._abort_completion(pending, f"completion failed: {e!r}", count_failure=True)
            return
        with self._lock:
            self.failure_policy.succeeded()
            self.stats["completed"] += 1
            if self._latest is None or manifest.checkpoint_id > self._latest.checkpoint_id:
                self._latest = manifest
                self.trigger_policy.completed(now_ms)
            for older in [cid for cid in self._pending if cid < manifest.checkpoint_id]:
                self._abort_locked(
                    older,
                    f"subsumed by completed checkpoint {manifest.checkpoint_id}",
                    count_failure=False,
                )
            self._retained.append(record)
            self._retained.sort(key=lambda c: c.checkpoint_id)
            subsumed = set(
                select_subsumed(
                    [(c.checkpoint_id, c.savepoint) for c in self._retained],
                    self.config.num_retained,
                )
            )
            self._retained = [c for c in self._retained if c.checkpoint_id not in subsumed]
            self._events.append(lambda lst: lst.on_checkpoint_complete(record, manifest))
        if subsumed:
            try:
                self.catalog.mark_subsumed(self.job_id, sorted(subsumed))
            except Exception:  # retention recomputes from the catalog; never loses a checkpoint
                log.exception("could not mark checkpoints %s subsumed", sorted(subsumed))

    def _abort_completion(
        self,
        pending: PendingCheckpoint,
        reason: str,
        *,
        count_failure: bool,
        error: FencedError | None = None,
    ) -> None:
        with self._lock:
            self._pending[pending.checkpoint_id] = pending  # so the abort is recorded as usual
            self._abort_locked(pending.checkpoint_id, reason, count_failure=count_failure)
            if error is not None:
                self._fail_locked(error)

    def _deliver(self) -> None:
        with self._delivery:
            while True:
                with self._lock:
                    if not self._events:
                        return
                    event = self._events.pop(0)
                for listener in self.listeners:
                    try:
                        event(listener)
                    except Exception as e:  # fails the job (delivered next): never vanishes
                        log.exception("checkpoint listener %r failed", listener)
                        with self._lock:
                            self._fail_locked(ListenerError(e))
