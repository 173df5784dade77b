"""An attempt's micro-batches: each is one Spark job through every stage
(spark_jobs/executor/dataflow.py), planned with its barrier when the coordinator triggers a
checkpoint.

After a micro-batch the subtasks' statistics are folded into the attempt's
:class:`~spark_jobs.driver.progress.Progress`, its end is recorded
(spark_jobs/driver/epoch_ends.py), and at a barrier its :class:`~spark_jobs.driver.barrier.Cut`
goes to the ack poller, which completes the checkpoint once every subtask acked. At least once,
the output is appended at once. The final checkpoint is a barrier with no records (Flink's
stop-with-checkpoint), and so is a checkpoint of an idle run whose output is staged but not
committed yet (Flink's checkpoints are timed, not driven by records: the output of a job whose
input stopped commits within the checkpoint interval). A replay runs committed epochs again,
exactly as they ran, without output.

Micro-batches hold :attr:`MicroBatches.lock` (the stream thread's, the idle barrier's on the main
thread, and a stop waiting for the running one), so no two run at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cutline.job import JobDefinition
from cutline.sinks import SinkWriter
from spark_jobs.catalog.tables import now_ms
from spark_jobs.driver.barrier import AckPoller, CompactionRequests, Cut
from spark_jobs.driver.epoch_ends import EpochEnds
from spark_jobs.driver.progress import Progress
from spark_jobs.driver.restore_fallback import ReplayEpoch
from spark_jobs.driver.run_state import RunState
from spark_jobs.driver.savepoints import SavepointRequests
from spark_jobs.executor.dataflow import execute
from spark_jobs.executor.reports import SubtaskStats
from spark_jobs.executor.subtask import BatchPlan, RunContext
from spark_jobs.sources.bad_records import bad_record_error
from spark_jobs.sources.frames import Routes, no_input, range_input, read_routes, source_columns
from state.coordinator import CheckpointCoordinator
from state.manifest import CheckpointManifest

EXPIRY_GRACE_S = 30.0  # past a checkpoint's timeout, for the ack poller's pass that aborts it


@dataclass(frozen=True)
class BatchOutcome:
    """One micro-batch, as its ``batch`` event reports it."""

    epoch: int
    checkpoint_id: int | None  # the barrier it carried
    records: int  # read from the sources
    in_flight: bool  # a checkpoint was in flight while it ran
    task_ms: float  # its slowest subtask's task (SubtaskStats.task_ms); the rest is Spark's


class MicroBatches:
    """Runs one attempt's micro-batches. ``anchor`` (the restore's placement) is set before the
    first; ``coordinator`` and ``acks`` before the first one that may carry a barrier."""

    def __init__(
        self,
        spark,
        ctx: RunContext,
        progress: Progress,
        state: RunState,
        sinks: Sequence[SinkWriter],
        ends: EpochEnds,
        compaction: CompactionRequests,
        savepoints: SavepointRequests,
        *,
        exactly_once: bool,
        log: Callable[[str], None],
    ) -> None:
        self.spark, self.ctx, self.job = spark, ctx, ctx.job
        self.progress, self.state, self.sinks = progress, state, sinks
        self.ends, self.compaction, self.exactly_once = ends, compaction, exactly_once
        self.savepoints, self.log = savepoints, log
        self.anchor = None
        self.coordinator: CheckpointCoordinator | None = None
        self.acks: AckPoller | None = None
        self.source_columns = source_columns(spark, self.job)
        # The sources prepared and their routes planned on a thread of their own while the
        # driver starts its restore (a Python data source's first registration starts a Python
        # process; Spark analyses the job's empty inputs: each most of a second in a new JVM).
        # The query's start waits for it.
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cutline-inputs")
        self._routes = pool.submit(_prepared_routes, spark, self.job)
        pool.shutdown(wait=False)  # its thread ends with its one task
        self.lock = threading.Lock()
        self.idle_barrier: threading.Thread | None = None
        self.barriers: dict[int, int] = {}  # checkpoint id -> its barrier's epoch (under lock)
        self._executed_one = False  # the attempt's first micro-batch starts no compaction

    @property
    def routes(self) -> Routes:
        """The sources' routes when their readers do the map side (``read_routes``), else None:
        the map side routes the tagged records."""
        return self._routes.result()

    def tasks(self) -> list[tuple[str, int]]:
        """Every (stage uid, subtask) of the job: the coordinator's tasks."""
        return [(stage.uid, i) for stage in self.job.stages for i in range(self.job.parallelism)]

    def run(self, df) -> BatchOutcome:
        """The next micro-batch on ``df``, with a barrier if the coordinator triggers one."""
        self.progress.epoch += 1
        epoch = self.progress.epoch
        pending = self.coordinator.trigger(epoch, None, now_ms())
        cid = pending.checkpoint_id if pending else None
        self._barrier_at(cid, epoch)
        self.savepoints.at_barrier(cid)
        in_flight = bool(self.coordinator.pending_ids())
        plan = self._plan(epoch, cid)
        stats = self._execute(df, plan)
        records = self._after(plan, stats)
        slowest = max((s.task_ms for s in stats), default=0.0)
        return BatchOutcome(epoch, cid, records, in_flight, slowest)

    def final_checkpoint(self) -> None:
        """A barrier with no records: commits all output. It waits as long as the job's own
        checkpoint timeout lets a checkpoint take, however slow the storage: for a free slot
        (each checkpoint in flight completes or expires within that timeout of its trigger),
        then for this one, which completes or is aborted when it expires (the ack poller's
        ``expire``). Fails the run if it is aborted or never completes."""
        timeout_s = self.job.checkpoint.timeout_ms / 1000
        self.progress.epoch += 1
        deadline = time.monotonic() + timeout_s
        pending = None
        while pending is None and time.monotonic() < deadline and not self.state.failed:
            # max_concurrent may be reached: the pending ones finish first
            pending = self.coordinator.trigger(self.progress.epoch, None, now_ms(), force=True)
            if pending is None:
                time.sleep(0.1)
        if pending is None:
            self.state.fail("no final checkpoint could be triggered")
            return
        cid = pending.checkpoint_id
        self.savepoints.at_final(cid)
        self._without_records(cid)
        # its own timeout, and a little for the expiry pass that aborts it
        if not self.state.wait_for_checkpoint(cid, timeout_s + EXPIRY_GRACE_S):
            self.state.fail(f"final checkpoint {cid} did not complete")

    def when_idle(self, committed: Callable[[], CheckpointManifest | None]) -> bool:
        """The watch's hook while no micro-batch runs (the main thread): when exactly-once output
        is staged after ``committed()`` (the latest checkpoint whose output is committed), a
        barrier with no records on a thread of its own, so the watch goes on watching the query
        and the hosts; then the savepoint requests (driver/savepoints.py; a barrier serves a
        pending one). Returns whether the run stops for a stop-with-savepoint."""
        running = self.idle_barrier is not None and self.idle_barrier.is_alive()
        if not running and self._output_staged(committed()):
            self.idle_barrier = threading.Thread(
                target=self._idle_barrier, args=(committed,), name="cutline-idle-barrier"
            )
            self.idle_barrier.daemon = True
            self.idle_barrier.start()
        return self.savepoints.when_idle(committed(), bool(self.coordinator.pending_ids()))

    def _output_staged(self, committed: CheckpointManifest | None) -> bool:
        """Whether an epoch's output is neither committed nor covered by a pending barrier: a
        barrier with no records has no output of its own, so an idle job takes one, not one
        per checkpoint the policy allows (``max_concurrent`` of them in flight, forever)."""
        pending = set(self.coordinator.pending_ids())
        covered = [e for cid, e in tuple(self.barriers.items()) if cid in pending]
        done = max([committed.batch_id if committed is not None else 0, *covered])
        return self.exactly_once and not self.state.stop.is_set() and done < self.progress.epoch

    def _barrier_at(self, checkpoint_id: int | None, epoch: int) -> None:
        """Checkpoint ``checkpoint_id`` (if one was triggered) cuts at ``epoch``; the barriers
        no longer pending are forgotten (under the micro-batch lock)."""
        pending = set(self.coordinator.pending_ids())
        self.barriers = {c: e for c, e in self.barriers.items() if c in pending}
        if checkpoint_id is not None:
            self.barriers[checkpoint_id] = epoch

    def _idle_barrier(self, committed: Callable[[], CheckpointManifest | None]) -> None:
        """The barrier with no records, if still due under the micro-batch lock and the
        checkpoint policy allows one now (interval, pause, concurrency)."""
        try:
            with self.lock:
                latest = committed()
                if not self._output_staged(latest):
                    return
                pending = self.coordinator.trigger(self.progress.epoch + 1, None, now_ms())
                if pending is None:
                    return
                self.progress.epoch += 1
                self._barrier_at(pending.checkpoint_id, self.progress.epoch)
                done = latest.batch_id if latest is not None else 0
                self.log(
                    f"idle: checkpoint {pending.checkpoint_id}, a barrier with no records, "
                    f"commits the output of epochs {done + 1}..{self.progress.epoch - 1}"
                )
                self.savepoints.at_barrier(pending.checkpoint_id)
                self._without_records(pending.checkpoint_id, count=False)
        except Exception as e:  # its Spark job cancelled (a host lost), storage, ...
            self.state.fail(f"idle barrier: {type(e).__name__}: {e}", e)

    def _without_records(self, checkpoint_id: int, *, count: bool = True) -> None:
        """A micro-batch of the current epoch with no records, carrying barrier
        ``checkpoint_id``."""
        plan = self._plan(self.progress.epoch, checkpoint_id)
        df = no_input(self.spark, self.job, self.routes)
        self._after(plan, self._execute(df, plan), count=count)

    def replay(self, epochs: list[ReplayEpoch]) -> None:
        """Run committed micro-batches again, exactly as they ran (the same source ranges and
        planned processing times), with no output: state and watermarks come out as they
        were."""
        records = 0
        for r in epochs:
            df = range_input(self.spark, self.job, r.start, r.end, self.routes)
            plan = self._plan(r.epoch, None, emit=False, processing_time=r.processing_time)
            stats = self._execute(df, plan)
            self.progress.fold(stats, plan.processing_time)
            records += sum(s.source_records for s in stats)
        self.state.replayed(len(epochs))
        self.log(
            f"replayed epochs {epochs[0].epoch}..{epochs[-1].epoch} ({records:,} records) "
            "without output: the sinks had committed them"
        )

    def _plan(
        self,
        epoch: int,
        checkpoint_id: int | None,
        *,
        emit: bool = True,
        processing_time: int | None = None,
    ) -> BatchPlan:
        coordinator = self.coordinator
        latest = coordinator.latest_completed if coordinator else None
        incremental = checkpoint_id is not None and self.job.checkpoint.incremental
        return BatchPlan(
            ctx=self.ctx,
            epoch=epoch,
            previous_epoch=epoch - 1,
            checkpoint_id=checkpoint_id,
            base_handles={
                task: coordinator.base_handle(task) for task in self.tasks() if incremental
            },
            confirmed_checkpoint=latest.checkpoint_id if latest else None,
            watermarks=dict(self.progress.watermarks),
            compact=self.compaction.subtasks_at(checkpoint_id),
            emit=emit,
            processing_time=now_ms() if processing_time is None else processing_time,
            compactions=self._executed_one,
            source_columns=self.source_columns,
            # routed at the read, the map side's schema is known here; else execute takes it
            schema=next(iter(self.routes.values())).chunks if self.routes else None,
        )

    def _execute(self, df, plan: BatchPlan) -> list[SubtaskStats]:
        """One micro-batch through every stage, each subtask on its slot's host. Returns the
        subtasks' statistics."""
        stats = execute(df, plan, self.anchor, routed_at_read=self.routes is not None)
        self._executed_one = True
        return stats

    def _after(self, plan: BatchPlan, stats: list[SubtaskStats], *, count: bool = True) -> int:
        """Fold the statistics into the progress, record the epoch's end (and planned
        processing time) and a barrier's cut, append at-least-once output, count the batch
        (unless not ``count``: an idle barrier is not one); returns the records read from the
        sources."""
        epoch, checkpoint_id, clock = plan.epoch, plan.checkpoint_id, plan.processing_time
        found = [r.first_bad for r in stats if r.first_bad]
        bad = sum(r.bad_records for r in stats)
        if found and self.job.bad_records == "fail":
            error = bad_record_error(found, bad)
            self.state.fail(str(error), error)
            return 0
        records = sum(r.source_records for r in stats)
        progress = self.progress
        progress.fold(stats, clock)
        ends = progress.position_copy()
        uncommitted = self.ends.record(epoch, ends, clock)
        if checkpoint_id is not None:
            self.compaction.compacted(checkpoint_id, max(r.compact_ms for r in stats))
            sink_epochs = {s.sink: epoch for s in self.sinks}
            self.acks.record_cut(
                Cut(
                    checkpoint_id,
                    ends,
                    sink_epochs,
                    dict(progress.watermarks),
                    uncommitted,
                    dict(progress.counters),
                    self.ends.times(uncommitted),
                    progress.clocks_copy(),
                )
            )
        if not self.exactly_once:
            for sink in self.sinks:
                sink.append_now(epoch, {epoch: ends}, {epoch: clock})
            self.ends.forget_through(epoch)
        if count:
            self.state.count_batch(records, sum(r.late_records for r in stats), bad)
        return records


def _prepared_routes(spark, job: JobDefinition) -> Routes:
    for name in job.source_inputs:
        job.source(name).prepare(spark)
    return read_routes(spark, job)
