"""The driver of a checkpointed streaming job: one attempt, from its start to its stop.

1. Start (spark_jobs/driver/attempt_start.py, on a thread while the JVM starts): a new attempt that
   fences every older one, the sinks fenced, the checkpoint to restore chosen and its sink commit
   redone.
2. Restore (spark_jobs/driver/restore_fallback.py), on a thread beside the query's start: every
   subtask's working state local-first, placed on the host its executor hint names, falling back
   past checkpoints that fail their checksums; then the epochs the sinks committed after the
   restored checkpoint are replayed without output. The first micro-batch waits for it.
3. Run the streaming query from the positions the restore ends at (driver/epoch_ends.py). Each
   micro-batch (in ``foreachBatch``, driver/micro_batches.py) is one Spark job through every
   stage, each subtask on the host that holds its working state (placement.py); at a barrier each
   takes its synchronous snapshot. The ack poller (driver/barrier.py) delivers the cut and the
   subtasks' acks to the coordinator, so uploads never hold up the next micro-batch; a completed
   checkpoint commits the sinks (driver/completion.py).
4. Stop (max batches, idle, or a stop-with-savepoint request: driver/savepoints.py): take a
   final checkpoint, wait for it, commit, mark FINISHED.

An attempt that learns that a newer one has started (its checkpoint or sink commit is fenced, or
its heartbeat sees the newer attempt: driver/liveness.py) stops at once (exit 3); it could not
commit anything anyway.

Threads: Spark's stream thread runs the micro-batches, the restore thread runs before the first
(which waits for it), the ack poller completes checkpoints, the heartbeat watches liveness; the
main thread watches the query and stops the run (driver/watch.py). What they share (the
failure, the stop event, the run's report, the compaction and savepoint requests being served)
is the :class:`~spark_jobs.driver.run_state.RunState`, which says who does what; the progress
is handed on (driver/progress.py says which reads cross threads).

A failure a Spark task marked as not retryable (spark_jobs/errors.py) is raised as its typed
error with its clean message, so the run exits 2.
"""

from __future__ import annotations

import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

from cutline.job import JobDefinition
from cutline.sources.log import with_log_root
from spark_jobs.catalog import open_catalog
from spark_jobs.catalog.tables import now_ms
from spark_jobs.catalog.upkeep import driver_upkeep
from spark_jobs.deploy.settings import RuntimePaths
from spark_jobs.driver.attempt_start import StartPlan, plan_start, sink_writers
from spark_jobs.driver.barrier import AckPoller, CompactionRequests
from spark_jobs.driver.completion import Completion
from spark_jobs.driver.epoch_ends import EpochEnds, starting_point
from spark_jobs.driver.liveness import Heartbeat
from spark_jobs.driver.micro_batches import MicroBatches
from spark_jobs.driver.progress import Progress
from spark_jobs.driver.restore_step import AttemptRestore
from spark_jobs.driver.run_state import RunState, RunSummary
from spark_jobs.driver.savepoints import SavepointRequests, is_location
from spark_jobs.driver.scratch import query_scratch
from spark_jobs.driver.startup_phases import StartupTimeline
from spark_jobs.driver.warm_up import warm_up_workers
from spark_jobs.driver.watch import QueryWatch
from spark_jobs.errors import AttemptFailedError
from spark_jobs.events import EventChannel
from spark_jobs.executor.subtask import RunContext
from spark_jobs.sources.frames import stream_input
from state.catalog import FencedError
from state.config import EXACTLY_ONCE
from state.coordinator import CheckpointCoordinator
from state.errors import NonRetryableError
from state.manifest import CheckpointManifest, Positions
from state.paths import JobLayout
from state.storage import open_storage

HEARTBEAT_S = 10.0
EXECUTOR_WAIT_S = 60.0  # how long a restore waits for executors on the hinted hosts


class StreamingRun:
    """One attempt of a job on a Spark session."""

    def __init__(
        self,
        spark,
        job: JobDefinition,
        paths: RuntimePaths,
        *,
        restore: str | int | None = "latest",
        reset_sink: bool = False,
        allow_non_restored: bool = False,
        hints: dict[str, str] | None = None,
        max_batches: int | None = None,
        idle_timeout_s: float | None = None,
        until_caught_up: bool = False,
        run_id: str = "",
        log=None,
        events: EventChannel | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        watch_pid: int | None = None,
        executor_wait_s: float = EXECUTOR_WAIT_S,
        timeline: StartupTimeline | None = None,
        plan: Future[StartPlan] | None = None,
        workers_warm: bool = False,
    ) -> None:
        self.spark = spark
        job = with_log_root(job, paths.log_root)
        self.job = job
        self.paths = paths
        self.restore = restore
        self.reset_sink = reset_sink
        self.allow_non_restored = allow_non_restored
        self.hints = hints or {}
        self.max_batches = max_batches
        self.idle_timeout_s = idle_timeout_s
        self.run_id = run_id
        self.events = events or EventChannel()
        self.log = log or self.events.log
        self.heartbeat_s = heartbeat_s
        self.watch_pid = watch_pid
        self.executor_wait_s = executor_wait_s
        self.timeline = timeline or StartupTimeline()
        self._early_plan = plan  # the attempt and checkpoint, decided while the session started
        self.workers_warm = workers_warm  # a standby's takeover: its Python workers are started
        self.storage = open_storage(paths.checkpoint_root)
        self.catalog = open_catalog(paths.catalog)
        self.layout = JobLayout(job.name)
        self.exactly_once = job.checkpoint.mode == EXACTLY_ONCE
        self.state = RunState()  # what the threads share: the failure, the stop, the report
        self._restored = threading.Event()  # the working state is restored: micro-batches may run
        self._heartbeat: Heartbeat | None = None  # stopped after the final checkpoint
        self.watch = QueryWatch(
            spark.sparkContext, idle_timeout_s, self.state, self.log, until_caught_up
        )
        self.ends = EpochEnds()
        self.progress = Progress(job)
        self.allocation: dict[str, str] = {}
        self.compaction = CompactionRequests(
            self.storage, self.layout, job.parallelism, self.state, self.log, self.events
        )
        self.savepoints = SavepointRequests(
            job, self.storage, self.catalog, paths.savepoints, self.state, self.log, self.events
        )
        self.acks: AckPoller | None = None  # once the state is restored

    # -- lifecycle ---------------------------------------------------------------------------

    def _plan_start(self) -> StartPlan:
        if self._early_plan is not None:
            plan = self._early_plan.result()
            self.timeline.note_overlapped("attempt and checkpoint", plan.seconds)
            self.timeline.mark("waiting for the plan")
            return plan
        plan = plan_start(
            self.catalog,
            self.storage,
            self.job,
            self.paths,
            self.restore,
            self.run_id,
            self.log,
            reset_sink=self.reset_sink,
            allow_non_restored=self.allow_non_restored,
        )
        self.timeline.mark("attempt and checkpoint")
        return plan

    def run(self) -> RunSummary:
        job = self.job
        plan = self._plan_start()
        self.attempt, manifest = plan.attempt, plan.manifest
        query = None
        spark_checkpoint = query_scratch(job.name)
        try:  # from here on, whatever fails ends the attempt recorded FAILED with its reason
            self.sinks = sink_writers(job, self.paths, self.attempt)
            self.ctx = RunContext(
                job=job,
                attempt=self.attempt,
                checkpoint_root=self.paths.checkpoint_root,
                local_state_root=self.paths.local_state_root,
                staging_root=self.paths.staging,
            )
            self.state.restored(manifest.checkpoint_id if manifest else None, ())
            self.batches = MicroBatches(  # runs the job's transforms on their schemas
                self.spark,
                self.ctx,
                self.progress,
                self.state,
                self.sinks,
                self.ends,
                self.compaction,
                self.savepoints,
                exactly_once=self.exactly_once,
                log=self.log,
            )
            self.progress.adopt(manifest)
            self.progress.epoch, self.progress.positions = starting_point(
                job,
                manifest,
                plan.committed_epoch,
                self.exactly_once,
                self.ends,
                self.sinks,
            )
            self._heartbeat = Heartbeat(
                self.catalog,
                job.name,
                self.attempt,
                self.heartbeat_s,
                fail=self.state.fail,
                log=self.log,
                watch_pid=self.watch_pid,
                upkeep=partial(driver_upkeep, self.catalog, job.name, self.sinks),
            ).start()
            # The state restores on a thread of its own while the query starts: Spark starts
            # its source and plans the first trigger meanwhile; the first micro-batch waits.
            # The query starts from a copy of the positions: the restore's replay folds into them.
            positions = self.progress.position_copy()
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cutline-restore") as pool:
                restore = AttemptRestore(
                    self.spark,
                    self.catalog,
                    self.storage,
                    self.sinks,
                    self.ends,
                    self.batches,
                    self.progress,
                    self.state,
                    self.restore,
                    self.hints,
                    self.executor_wait_s,
                    self.exactly_once,
                    self.log,
                    self.timeline,
                )
                restoring = pool.submit(restore, manifest, plan.fallbacks)
                if not self.workers_warm:
                    threading.Thread(
                        target=warm_up_workers,
                        args=(self.spark, job.parallelism, self.timeline, self.log),
                        name="cutline-warm-up",
                        daemon=True,
                    ).start()
                try:
                    query = self._start_query(spark_checkpoint, positions)
                    self.timeline.mark("query started")
                except BaseException:
                    restoring.exception()  # wait for it; the query's error is the run's
                    raise
                restored, self.allocation = restoring.result()
            self.timeline.mark("state restored")
            self._start_checkpointing(restored.manifest)
            self._restored.set()
            self.events.emit(
                "started",
                {
                    "attempt": self.attempt,
                    "restored_from": self.state.restored_from,
                    "savepoint": self.restore if is_location(self.restore) else None,
                    "allocation": self.allocation,
                    "restore_reports": [r.to_dict() for r in self.state.restore_reports],
                },
            )
            self.watch.restart_idle_clock()
            self.watch(query, self.allocation)
            with self.batches.lock:  # let a running micro-batch finish; later ones are skipped
                pass
            query.stop()
            query = None
            if not self.state.failed:
                self.batches.final_checkpoint()
        except Exception as e:  # the attempt failed: classified and raised below
            self.state.fail(f"{type(e).__name__}: {e}", e)
        except BaseException as e:  # interrupted: recorded FAILED, never FINISHED
            self.state.fail(f"interrupted ({type(e).__name__})", e)
            raise
        finally:
            self.state.stop.set()
            self._restored.set()  # a micro-batch waiting for the restore is skipped
            if query is not None:
                query.stop()
            if self._heartbeat is not None:
                self._heartbeat.stop()
            if self.acks is not None:
                self.acks.stop()
            shutil.rmtree(spark_checkpoint, ignore_errors=True)
            self._check_superseded()
            summary = self._record_end()
        if summary.failure:
            error = self.state.error
            if isinstance(error, NonRetryableError | FencedError):
                raise error
            raise AttemptFailedError(
                f"{job.name} attempt {self.attempt} failed: {summary.failure}"
            ) from error
        return summary

    def _start_checkpointing(self, restored: CheckpointManifest | None) -> None:
        """The coordinator, continuing after the restored checkpoint, with its listener and the
        ack poller: from here on micro-batches may carry barriers."""
        completion = Completion(
            self.job.name,
            self.sinks,
            self.catalog,
            self.ends,
            self.compaction,
            self.savepoints,
            self.state,
            restored,
            exactly_once=self.exactly_once,
            log=self.log,
            events=self.events,
        )
        coordinator = CheckpointCoordinator(
            self.job.name,
            self.attempt,
            self.job.checkpoint,
            self.batches.tasks(),
            self.storage,
            self.catalog,
            listeners=[completion],
            restored=restored,
            now_ms=now_ms(),
            stages={stage.uid: stage.state_schema() for stage in self.job.stages},
        )
        self.acks = AckPoller(
            coordinator, self.storage, self.layout, self.attempt, self.batches.tasks(), self.log
        ).start()
        self.batches.coordinator, self.batches.acks = coordinator, self.acks
        self.watch.when_idle = lambda: self.batches.when_idle(lambda: completion.committed)

    def _check_superseded(self) -> None:
        """A failed attempt that a newer one superseded failed because of it (its working state
        was cleaned away, its commit fenced): say so, so that nobody restarts it."""
        failure = self.state.failure
        if failure is None or isinstance(self.state.error, FencedError):
            return
        try:
            newest = self.catalog.newest_attempt(self.job.name)
        except Exception as e:  # judged as a failure (exit 1): the next start is fenced anyway
            self.log(f"whether a newer attempt started is unknown: {type(e).__name__}: {e}")
            return
        if newest > self.attempt:
            self.state.supersede(
                FencedError(
                    f"attempt {newest} of {self.job.name} has started: attempt {self.attempt} "
                    f"is superseded ({failure})"
                )
            )

    def _record_end(self) -> RunSummary:
        """The run's report, its end recorded in the catalog."""
        summary = self.state.summary(self.job.name, self.attempt, self.progress.position_copy())
        status = "FINISHED"
        if isinstance(self.state.error, FencedError):
            status = "SUPERSEDED"
        elif summary.failure:
            status = "FAILED"
        try:
            self.catalog.set_job_status(self.job.name, self.attempt, status, summary.failure or "")
        except Exception as e:  # the run's own error matters more; the sensor sees the rest
            self.log(f"could not record the attempt's end: {type(e).__name__}: {e}")
        return summary

    # -- start -----------------------------------------------------------------------------

    def _start_query(self, spark_checkpoint: str, positions: Positions):
        df = stream_input(self.spark, self.job, positions, self.batches.routes)
        return (
            df.writeStream.foreachBatch(self._process_batch)
            .option("checkpointLocation", spark_checkpoint)
            .queryName(f"cutline-{self.job.name}-{self.attempt}")
            .start()
        )

    # -- micro-batches -----------------------------------------------------------------------

    def _process_batch(self, df, spark_batch_id: int) -> None:
        """``foreachBatch``: one micro-batch, unless the run is stopping."""
        self._restored.wait()  # the query starts while the state restores
        with self.batches.lock:  # a graceful stop waits for a running micro-batch
            if not self.state.stop.is_set():
                with self.watch.batch():
                    self._run_batch(df)

    def _run_batch(self, df) -> None:
        first = self.state.batches == 0
        if first:
            self.timeline.mark("first trigger planned")
        started = time.perf_counter()
        done = self.batches.run(df)
        ms = (time.perf_counter() - started) * 1000
        self.state.time_batch(ms, done.in_flight)
        self.events.emit("batch", {
            "epoch": done.epoch, "records": done.records, "checkpoint": done.checkpoint_id,
            "ms": round(ms, 1), "task_ms": round(done.task_ms, 1),
            "at_ms": int(time.time() * 1000),  # when it ended, on the wall clock
        })  # fmt: skip
        if first:
            self.timeline.mark("first micro-batch")
            self.log(f"startup: {self.timeline.summary()}")
            self.events.emit("startup", self.timeline.as_dict())
        if self.max_batches is not None and self.state.batches >= self.max_batches:
            self.state.stop.set()


def run_job(
    spark,
    job: JobDefinition,
    paths: RuntimePaths,
    **kwargs: Any,
) -> RunSummary:
    """Run one attempt of ``job`` (see :class:`StreamingRun` for the keyword arguments)."""
    return StreamingRun(spark, job, paths, **kwargs).run()
