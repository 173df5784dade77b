"""The driver of a checkpointed streaming job: one attempt, from its start to its stop.

1. Start (spark_jobs/start.py, on a thread while the JVM starts): a new attempt that fences every
   older one, the sinks fenced, the checkpoint to restore chosen and its sink commit redone.
2. Restore (spark_jobs/recovery.py), on a thread beside the streaming query's start: every
   subtask's working state local-first, placed on the host its executor hint names, falling back
   past checkpoints that fail their checksums; then the epochs the sinks committed after the
   restored checkpoint are replayed without output. The first micro-batch waits for it.
3. Run the streaming query from the positions the restore ends at. Each micro-batch (in
   ``foreachBatch``) is one Spark job: records are routed by key group to subtask partitions,
   every subtask runs on the host that holds its working state (placement.py), and at a barrier
   each takes its synchronous snapshot. The ack poller delivers the subtasks' acks to the
   coordinator, so uploads never hold up the next micro-batch; a completed checkpoint commits the
   sinks.
4. Stop (max batches or idle): take a final checkpoint, wait for it, commit, mark FINISHED.

An attempt that learns that a newer one has started (its checkpoint or sink commit is fenced, or
its heartbeat sees the newer attempt) stops at once (exit 3); it could not commit anything anyway.
"""

from __future__ import annotations

import os
import queue
import shutil
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from spark_jobs.bad_records import bad_record_error
from spark_jobs.dataflow import execute
from spark_jobs.delta_catalog import DeltaCatalog, now_ms
from spark_jobs.errors import (
    AttemptFailedError,
    NonRetryableError,
    NoRestorableCheckpointError,
    UserCodeError,
)
from spark_jobs.events import EventChannel
from spark_jobs.job import JobDefinition
from spark_jobs.keyed_process import USER_ERROR_MARKER, user_error_text
from spark_jobs.placement import anchor_rdd, executor_hosts, lost_subtasks, preferred_hosts
from spark_jobs.recovery import (
    ReplayEpoch,
    Restored,
    recovery_row,
    replay_epochs,
    restore_with_fallback,
)
from spark_jobs.settings import RuntimePaths
from spark_jobs.sources import empty_frame, partitions_of, range_frame, stream_frame, tag_and_union
from spark_jobs.start import StartPlan, plan_start, sink_writers
from spark_jobs.startup import StartupTimeline
from spark_jobs.subtask import BatchPlan, RunContext, warm_up_worker
from state.acks import Ack, ack_location, ack_path, inbox
from state.catalog import FencedError
from state.compaction import (
    COMPACT_REQUEST,
    CompactionRequest,
    CompactionRequestError,
    clear_request,
    read_request,
)
from state.config import EXACTLY_ONCE
from state.coordinator import CheckpointCoordinator
from state.faults import kill_point
from state.manifest import CheckpointManifest
from state.paths import JobLayout
from state.storage import StorageError, open_storage

HEARTBEAT_S = 10.0
EXECUTOR_WAIT_S = 60.0  # how long a restore waits for executors on the hinted hosts
HOST_CHECK_S = 2.0  # how often a run on a cluster checks that its subtasks' hosts have executors

Positions = dict[str, dict[str, int]]  # source -> partition -> position


@dataclass
class RunSummary:
    job: str
    attempt: int
    restored_from: int | None
    batches: int = 0
    records: int = 0
    checkpoints: list[int] = field(default_factory=list)
    restore_reports: list[dict[str, Any]] = field(default_factory=list)
    positions: dict[str, dict[str, int]] = field(default_factory=dict)
    late_records: int = 0
    bad_records: int = 0
    replayed_epochs: int = 0  # committed epochs replayed without output after the restore
    failure: str | None = None
    batch_ms: list[float] = field(default_factory=list)  # wall time of each micro-batch
    batch_checkpointing: list[bool] = field(default_factory=list)  # a checkpoint was in flight


class _Listener:
    def __init__(self, run: StreamingRun) -> None:
        self.run = run

    def on_checkpoint_complete(self, record, manifest: CheckpointManifest) -> None:
        self.run.on_complete(record, manifest)

    def on_checkpoint_aborted(self, checkpoint_id: int, reason: str) -> None:
        self.run.on_aborted(checkpoint_id)
        self.run.log(f"checkpoint {checkpoint_id} aborted: {reason}")

    def on_job_failed(self, error: BaseException) -> None:
        self.run.fail(f"checkpointing failed: {error}", error)


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
        run_id: str = "",
        log=None,
        events: EventChannel | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        watch_pid: int | None = None,
        executor_wait_s: float = EXECUTOR_WAIT_S,
        timeline: StartupTimeline | None = None,
        plan: Future[StartPlan] | None = None,
    ) -> None:
        self.spark = spark
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
        self.storage = open_storage(paths.checkpoint_root)
        self.catalog = DeltaCatalog(spark, paths.warehouse)
        self.layout = JobLayout(job.name)
        self.exactly_once = job.checkpoint.mode == EXACTLY_ONCE
        self._failure: str | None = None
        self._error: BaseException | None = None  # the typed cause, when there is one
        self._stop = threading.Event()  # stop taking micro-batches
        self._restored = threading.Event()  # the working state is restored: micro-batches may run
        self._shutdown = threading.Event()  # stop the ack poller (after the final checkpoint)
        self._batch_lock = threading.Lock()
        self._cuts: queue.Queue = queue.Queue()  # cuts recorded by micro-batches, for the poller
        self._ends_lock = threading.Lock()
        self._epoch_ends: dict[int, Positions] = {}  # epochs the sinks have not committed yet
        self._history: dict[int, dict[int, Positions]] = {}  # sink history after an epoch
        self._last_progress = time.monotonic()
        self._query_has_run = False
        self._in_batch = False
        # on a cluster, a host that loses its executors takes its subtasks' working state along
        self._watch_hosts = not spark.sparkContext.master.startswith("local")
        self.aborted: set[int] = set()
        self.coordinator: CheckpointCoordinator | None = None  # once the state is restored
        # a compaction request being served: (checkpoint id, request, compaction ms)
        self._compaction: tuple[int, CompactionRequest, float] | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def fail(self, reason: str, error: BaseException | None = None) -> None:
        if self._failure is None:
            self._failure, self._error = reason, error
        self._stop.set()

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
        self.attempt = plan.attempt
        self.sinks = sink_writers(job, self.paths.warehouse, self.attempt)
        manifest = plan.manifest
        self.ctx = RunContext(
            job=job,
            attempt=self.attempt,
            checkpoint_root=self.paths.checkpoint_root,
            local_state_root=self.paths.local_state_root,
            staging_root=str(self.sinks[0].staging_root),
        )
        self.summary = RunSummary(
            job.name, self.attempt, manifest.checkpoint_id if manifest else None
        )
        self.allocation: dict[str, str] = {}
        self.positions: Positions = {}
        self._adopt(manifest)
        poller = query = None
        spark_checkpoint = tempfile.mkdtemp(prefix=f"cutline-{job.name}-query-")
        try:
            self.epoch, self.positions = self._starting_point(manifest, plan.committed_epoch)
            threading.Thread(target=self._heartbeat, name="cutline-heartbeat", daemon=True).start()
            # The state restores on a thread of its own while the query starts: Spark starts
            # its source and plans the first trigger meanwhile; the first micro-batch waits.
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cutline-restore") as pool:
                restoring = pool.submit(self._restore_state, manifest, plan.fallbacks)
                threading.Thread(target=self._warm_up, name="cutline-warm-up", daemon=True).start()
                try:
                    query = self._start_query(spark_checkpoint)
                    self.timeline.mark("query started")
                except BaseException:
                    restoring.exception()  # wait for it; the query's error is the run's
                    raise
                restored = restoring.result()
            self.timeline.mark("state restored")
            self.coordinator = CheckpointCoordinator(
                job.name,
                self.attempt,
                job.checkpoint,
                self._tasks(),
                self.storage,
                self.catalog,
                listeners=[_Listener(self)],
                restored=restored.manifest,
                now_ms=now_ms(),
                stages={stage.uid: stage.state_schema() for stage in job.stages},
            )
            poller = threading.Thread(target=self._poll_acks, name="cutline-acks", daemon=True)
            poller.start()
            self._restored.set()
            self.events.emit(
                "started",
                {
                    "attempt": self.attempt,
                    "restored_from": self.summary.restored_from,
                    "allocation": self.allocation,
                    "restore_reports": self.summary.restore_reports,
                },
            )
            self._last_progress = time.monotonic()
            self._watch(query)
            with self._batch_lock:  # let a running micro-batch finish; later ones are skipped
                pass
            query.stop()
            query = None
            if self._failure is None:
                self._final_checkpoint()
        except Exception as e:  # the attempt failed: classified and raised below
            self.fail(f"{type(e).__name__}: {e}", e)
        finally:
            self._stop.set()
            self._restored.set()  # a micro-batch waiting for the restore is skipped
            if query is not None:
                query.stop()
            self._shutdown.set()
            if poller is not None:
                poller.join(timeout=5)
            shutil.rmtree(spark_checkpoint, ignore_errors=True)
            self._check_superseded()
            self._record_end()
        if self._failure:
            if isinstance(self._error, NonRetryableError | FencedError):
                raise self._error
            if USER_ERROR_MARKER in self._failure:
                raise UserCodeError(user_error_text(self._failure)) from self._error
            raise AttemptFailedError(
                f"{job.name} attempt {self.attempt} failed: {self._failure}"
            ) from self._error
        return self.summary

    def _check_superseded(self) -> None:
        """A failed attempt that a newer one superseded failed because of it (its working state
        was cleaned away, its commit fenced): say so, so that nobody restarts it."""
        if self._failure is None or isinstance(self._error, FencedError):
            return
        try:
            newest = self.catalog.newest_attempt(self.job.name)
        except Exception:
            return
        if newest > self.attempt:
            self._error = FencedError(
                f"attempt {newest} of {self.job.name} has started: attempt {self.attempt} is "
                f"superseded ({self._failure})"
            )

    def _record_end(self) -> None:
        self.summary.failure = self._failure
        self.summary.positions = {k: dict(v) for k, v in self.positions.items()}
        status = "FINISHED"
        if isinstance(self._error, FencedError):
            status = "SUPERSEDED"
        elif self._failure:
            status = "FAILED"
        try:
            self.catalog.set_job_status(self.job.name, self.attempt, status, self._failure or "")
        except Exception as e:  # the run's own error matters more; the sensor sees the rest
            self.log(f"could not record the attempt's end: {type(e).__name__}: {e}")

    def _watch(self, query) -> None:
        """Until the run stops: the query's health, lost hosts, and the idle timeout."""
        hosts_checked, suspect = time.monotonic(), None
        while not self._stop.wait(0.2):
            if self._watch_hosts and time.monotonic() - hosts_checked > HOST_CHECK_S:
                hosts_checked = time.monotonic()
                lost = lost_subtasks(self.allocation, executor_hosts(self.spark.sparkContext))
                if lost and lost == suspect:  # two checks in a row: not a registration race
                    self.fail(
                        f"executors lost on {sorted(lost)}, which held the working state of "
                        f"subtasks {sorted(s for v in lost.values() for s in v)}: "
                        "restore from the latest checkpoint"
                    )
                    # a micro-batch waiting for those subtasks' tasks would wait forever
                    self.spark.sparkContext.cancelAllJobs()
                suspect = lost or None
            if query.exception() is not None:
                self.fail(f"micro-batch failed: {query.exception()}")
            elif not query.isActive:
                self.fail("the streaming query stopped")
            elif self.idle_timeout_s is not None and not self._idle(query):
                self._last_progress = time.monotonic()  # idle time counts from here
            elif (
                self.idle_timeout_s is not None
                and time.monotonic() - self._last_progress > self.idle_timeout_s
            ):
                self.log(f"no new input for {self.idle_timeout_s} s: stopping")
                self._stop.set()

    # -- start and restore -------------------------------------------------------------------

    def _starting_point(
        self, manifest: CheckpointManifest | None, committed: int
    ) -> tuple[int, Positions]:
        """The epoch the streaming micro-batches continue after, and the positions they read
        from: the checkpoint's, or (exactly once, when the sinks committed epochs after it)
        where the last committed epoch ended, which the restore reaches by replaying them."""
        base = manifest.source_positions if manifest else {}
        positions: Positions = {}
        for name in self.job.source_inputs:
            parts, unread = partitions_of(self.job.source(name), self.paths.log_root)
            start = base.get(name, {})
            positions[name] = {str(p): int(start.get(str(p), unread)) for p in parts}
        if manifest is None:
            return committed, positions  # epochs continue above the sinks' committed ones
        if not self.exactly_once:
            return max(manifest.batch_id, committed), positions
        if committed <= manifest.batch_id:
            with self._ends_lock:
                self._epoch_ends = {e: p for e, p in manifest.epoch_ends.items() if e > committed}
            return manifest.batch_id, positions
        ends = self._committed_ends(manifest, committed)
        for name, parts in ends[committed].items():
            positions.setdefault(name, {}).update(parts)
        return committed, positions

    def _committed_ends(self, manifest: CheckpointManifest, through: int) -> dict[int, Positions]:
        """Where each epoch after ``manifest``'s ended, up to ``through``: from the commit
        history of the sink that committed furthest, and the first candidate's own record of
        its epochs the sinks had not committed."""
        ends = self._history.get(manifest.batch_id)
        if ends is None:  # read once per checkpoint: the start and the restore both need it
            sink = max(self.sinks, key=lambda s: s.committed_epoch())
            try:
                ends = sink.committed_ends(manifest.batch_id)
            except LookupError as e:
                raise NoRestorableCheckpointError(
                    f"restoring checkpoint {manifest.checkpoint_id} would emit committed output "
                    f"again: {e}"
                ) from e
            self._history[manifest.batch_id] = ends
        with self._ends_lock:
            known = {**self._epoch_ends, **ends}
        missing = [e for e in range(manifest.batch_id + 1, through + 1) if e not in known]
        if missing:
            raise NoRestorableCheckpointError(
                f"restoring checkpoint {manifest.checkpoint_id}: no record of where epochs "
                f"{missing} ended, so they cannot be replayed exactly"
            )
        return known

    def _adopt(self, manifest: CheckpointManifest | None) -> None:
        """Take the restored checkpoint's watermark, counters and shared files as the run's."""
        self._known_shared = {f.path for f in manifest.files() if f.shared} if manifest else set()
        self._latest_manifest = manifest
        held = manifest.watermarks if manifest else {}
        self.watermarks = {s.uid: held[s.uid] for s in self.job.stages if s.uid in held}
        self.counters = dict(manifest.counters) if manifest else {}

    def _restore_state(self, manifest: CheckpointManifest | None, fallbacks: list[str]) -> Restored:
        """Restore every subtask (falling back past checkpoints with positive evidence against
        them), anchor the subtasks to their hosts, replay committed epochs, record the
        recovery."""
        job, started = self.job, time.perf_counter()
        target = self.epoch

        def epoch_of(m: CheckpointManifest | None) -> int:
            return m.batch_id if m is not None and self.exactly_once else target

        restored = restore_with_fallback(
            self.spark,
            self.ctx,
            self.catalog,
            self.storage,
            manifest,
            epoch_of,
            wanted=self.restore,
            hints=self.hints,
            executor_wait_s=self.executor_wait_s,
            log=self.log,
        )
        restored.fallbacks[:0] = fallbacks
        if restored.manifest is not manifest:
            self._adopt(restored.manifest)
            self.summary.restored_from = restored.manifest.checkpoint_id
        self.summary.restore_reports = restored.reports
        self.allocation = {str(r["subtask"]): r["host"] for r in restored.reports}
        sc = self.spark.sparkContext
        # every micro-batch task of subtask i runs where subtask i was restored (placement.py)
        self._anchor = anchor_rdd(
            sc, preferred_hosts(self.allocation, job.parallelism, executor_hosts(sc))
        )
        m = restored.manifest
        if m is not None and epoch_of(m) < target:
            self._replay(replay_epochs(m, target, self._committed_ends(m, target)))
        self.catalog.set_restored(
            job.name, self.attempt, m.checkpoint_id if m else None, self.allocation
        )
        if m is not None:
            row = recovery_row(
                job.name, self.attempt, restored, self.hints, time.perf_counter() - started
            )
            self.catalog.record_recovery(row)
            self.log(
                f"restored checkpoint {m.checkpoint_id} (batch {m.batch_id}): "
                f"{row['subtasks_local']} subtasks local, {row['subtasks_remote']} remote, "
                f"{row['files_local'] + row['files_remote']} files: "
                f"{row['bytes_local']:,} B local, {row['bytes_remote']:,} B remote"
            )
        self.timeline.note_overlapped("restore", time.perf_counter() - started)
        return restored

    def _replay(self, epochs: list[ReplayEpoch]) -> None:
        """Run committed micro-batches again, exactly as they ran, without output."""
        records = 0
        for r in epochs:
            frames = {
                name: range_frame(
                    self.spark, self.job, name, self.paths.log_root, r.start[name], r.end[name]
                )
                for name in self.job.source_inputs
            }
            stats = self._execute(
                tag_and_union(self.job, frames), self._plan(r.epoch, None, emit=False)
            )
            self._fold(stats)
            records += sum(s["records"] for s in stats)
        self.summary.replayed_epochs = len(epochs)
        self.log(
            f"replayed epochs {epochs[0].epoch}..{epochs[-1].epoch} ({records:,} records) "
            "without output: the sinks had committed them"
        )

    def _start_query(self, spark_checkpoint: str):
        frames = {
            name: stream_frame(
                self.spark, self.job, name, self.paths.log_root, dict(self.positions[name])
            )
            for name in self.job.source_inputs
        }
        return (
            tag_and_union(self.job, frames)
            .writeStream.foreachBatch(self._process_batch)
            .option("checkpointLocation", spark_checkpoint)
            .queryName(f"cutline-{self.job.name}-{self.attempt}")
            .start()
        )

    def _warm_up(self) -> None:
        """Start the Python workers of Spark's SQL side (they are not the restore's) and load
        what they run, with a tiny job of the first micro-batch's shape, beside the restore: a
        cold start of them made the first micro-batch take about twice as long as the next
        ones. Best effort: a failure only costs the first micro-batch that time."""
        started = time.perf_counter()
        p = self.job.parallelism
        try:
            (
                self.spark.range(p, numPartitions=p)
                .mapInArrow(warm_up_worker, "id long")
                .mapInArrow(warm_up_worker, "id long")
                .collect()
            )
        except Exception as e:
            self.log(f"warming up Python workers failed (the first micro-batch does it): {e}")
            return
        self.timeline.note_overlapped("Python workers warmed", time.perf_counter() - started)

    # -- micro-batches -----------------------------------------------------------------------

    def _idle(self, query) -> bool:
        """The query has run a trigger (on a loaded machine the first can take longer than the
        idle timeout) and no micro-batch is running: a micro-batch longer than the idle timeout
        is not idle time."""
        if not self._query_has_run:
            self._query_has_run = self.summary.batches > 0 or query.lastProgress is not None
        return self._query_has_run and not self._in_batch

    def _plan(self, epoch: int, checkpoint_id: int | None, *, emit: bool = True) -> BatchPlan:
        coordinator = self.coordinator
        latest = coordinator.latest_completed if coordinator else None
        incremental = checkpoint_id is not None and self.job.checkpoint.incremental
        return BatchPlan(
            ctx=self.ctx,
            epoch=epoch,
            previous_epoch=epoch - 1,
            checkpoint_id=checkpoint_id,
            base_handles={
                task: coordinator.base_handle(task) for task in self._tasks() if incremental
            },
            confirmed_checkpoint=latest.checkpoint_id if latest else None,
            watermarks=dict(self.watermarks),
            compact=self._compact_at(checkpoint_id),
            emit=emit,
            processing_time=now_ms(),
        )

    def _tasks(self) -> list[tuple[str, int]]:
        """Every (stage uid, subtask) of the job: the coordinator's tasks."""
        return [(stage.uid, i) for stage in self.job.stages for i in range(self.job.parallelism)]

    def _execute(self, df, plan: BatchPlan) -> list[dict]:
        """One micro-batch through every stage, each subtask on its slot's host
        (spark_jobs/dataflow.py). Returns the subtasks' statistics."""
        return execute(df, plan, self._anchor)

    def _process_batch(self, df, spark_batch_id: int) -> None:
        self._restored.wait()  # the query starts while the state restores
        with self._batch_lock:  # a graceful stop waits for a running micro-batch
            if not self._stop.is_set():
                self._in_batch = True
                try:
                    self._run_batch(df)
                finally:
                    self._in_batch = False
                    self._last_progress = time.monotonic()

    def _run_batch(self, df) -> None:
        first = not self.summary.batch_ms
        if first:
            self.timeline.mark("first trigger planned")
        started = time.perf_counter()
        self.epoch += 1
        epoch = self.epoch
        pending = self.coordinator.trigger(epoch, None, now_ms())
        cid = pending.checkpoint_id if pending else None
        in_flight = bool(self.coordinator.pending_ids())
        stats = self._execute(df, self._plan(epoch, cid))
        records = self._after_batch(epoch, cid, stats)
        ms = (time.perf_counter() - started) * 1000
        self.summary.batch_ms.append(ms)
        self.summary.batch_checkpointing.append(in_flight)
        self.events.emit(
            "batch", {"epoch": epoch, "records": records, "checkpoint": cid, "ms": round(ms, 1)}
        )
        if first:
            self.timeline.mark("first micro-batch")
            self.log(f"startup: {self.timeline.summary()}")
            self.events.emit("startup", self.timeline.as_dict())
        if self.max_batches is not None and self.summary.batches >= self.max_batches:
            self._stop.set()

    def _fold(self, stats: list[dict]) -> None:
        """The subtasks' reports of one micro-batch into the stages' watermarks and the
        counters."""
        for stage in self.job.stages:
            lag = stage.watermark_lag_ms()
            times = [
                r["max_event_time"]
                for r in stats
                if r["stage"] == stage.uid and r["max_event_time"] is not None
            ]
            if lag is not None and times:
                candidate = max(times) - lag
                self.watermarks[stage.uid] = max(
                    self.watermarks.get(stage.uid, candidate), candidate
                )
        bad = sum(r["bad_records"] for r in stats)
        if bad:
            self.counters["bad_records"] = self.counters.get("bad_records", 0) + bad

    def _after_batch(self, epoch: int, checkpoint_id: int | None, stats: list) -> int:
        """Folds the subtasks' reports into the run's positions and counters, records the cut
        of a checkpoint, and commits at-least-once output; returns the record count."""
        found = [r["first_bad"] for r in stats if r["first_bad"]]
        if found and self.job.bad_records == "fail":
            error = bad_record_error(found, sum(r["bad_records"] for r in stats))
            self.fail(str(error), error)
            return 0
        first = self.job.stages[0].uid
        records = sum(r["records"] for r in stats if r["stage"] == first)
        for r in stats:
            for source, parts in r["positions"].items():
                current = self.positions[source]
                for part, end in parts.items():
                    current[part] = max(current.get(part, 0), end)
        self._fold(stats)
        self.summary.late_records += sum(r["late_records"] for r in stats)
        self.summary.bad_records += sum(r["bad_records"] for r in stats)
        ends = {k: dict(v) for k, v in self.positions.items()}
        with self._ends_lock:
            self._epoch_ends[epoch] = ends
            uncommitted = dict(self._epoch_ends)
        served = self._compaction
        if checkpoint_id is not None and served is not None and served[0] == checkpoint_id:
            self._compaction = (*served[:2], max(r["compact_ms"] for r in stats))
        if checkpoint_id is not None:
            # Completion commits Delta transactions: it runs on the ack poller's thread, never on
            # Spark's stream thread, which a stopping query interrupts.
            self._cuts.put(
                (
                    checkpoint_id,
                    ends,
                    {s.sink: epoch for s in self.sinks},
                    dict(self.watermarks),
                    uncommitted,
                    dict(self.counters),
                )
            )
        if not self.exactly_once:
            for sink in self.sinks:
                sink.append_now(epoch, {epoch: ends})
            self._forget_ends(epoch)
        self.summary.batches += 1
        self.summary.records += records
        return records

    def _final_checkpoint(self, timeout_s: float = 120.0) -> None:
        """A barrier with no records (Flink's stop-with-checkpoint): commits all output."""
        self.epoch += 1
        deadline = time.monotonic() + timeout_s
        pending = None
        while pending is None and time.monotonic() < deadline and self._failure is None:
            # max_concurrent may be reached: the pending ones finish first
            pending = self.coordinator.trigger(self.epoch, None, now_ms(), force=True)
            if pending is None:
                time.sleep(0.1)
        if pending is None:
            self.fail("no final checkpoint could be triggered")
            return
        cid = pending.checkpoint_id
        empty = tag_and_union(
            self.job,
            {n: empty_frame(self.spark, self.job, n) for n in self.job.source_inputs},
        )
        stats = self._execute(empty, self._plan(self.epoch, cid))
        self._after_batch(self.epoch, cid, stats)
        while time.monotonic() < deadline and self._failure is None:
            if cid in self.summary.checkpoints or cid in self.aborted:
                break
            time.sleep(0.1)
        if cid not in self.summary.checkpoints:
            self.fail(f"final checkpoint {cid} did not complete")

    # -- completion --------------------------------------------------------------------------

    def on_complete(self, record, manifest: CheckpointManifest) -> None:
        """Checkpoint ``manifest`` is complete: commit the sinks through its epoch, register its
        new shared files, report it."""
        kill_point("catalog-committed")
        committed = 0
        if self.exactly_once:
            try:
                for sink in self.sinks:
                    epoch = manifest.sink_epochs.get(sink.sink)
                    if epoch is not None:
                        rows = sink.commit_through(epoch, manifest.epoch_ends)
                        committed += rows if sink is self.sinks[0] else 0
            except Exception as e:  # the restore redoes the commit; never go on without it
                self.fail(f"sink commit of checkpoint {manifest.checkpoint_id}: {e}", e)
                return
            self._forget_ends(manifest.batch_id)
        new_files = [
            {
                "job_id": self.job.name,
                "path": f.path,
                "operator": h.operator,
                "subtask": h.subtask,
                "size": f.size,
                "created_by": manifest.checkpoint_id,
                "last_used": manifest.checkpoint_id,
                "refcount": 1,
                "status": "LIVE",
            }
            for h in manifest.subtasks
            for f in h.files
            if f.shared and f.path not in self._known_shared
        ]
        self._known_shared.update(f.path for f in manifest.files() if f.shared)
        if new_files:
            self.catalog.record_shared_files(new_files)
        self._compaction_done(manifest)
        self._latest_manifest = manifest
        self.summary.checkpoints.append(manifest.checkpoint_id)
        self.log(
            f"checkpoint {manifest.checkpoint_id} complete: batch {manifest.batch_id}, "
            f"full {manifest.full_size:,} B, uploaded {manifest.uploaded_bytes:,} B, "
            f"sink rows committed {committed}"
        )
        self.events.emit("checkpoint", {**record.to_dict(), "counters": manifest.counters})

    def _forget_ends(self, through: int) -> None:
        with self._ends_lock:
            self._epoch_ends = {e: p for e, p in self._epoch_ends.items() if e > through}

    def on_aborted(self, checkpoint_id: int) -> None:
        self.aborted.add(checkpoint_id)
        served = self._compaction
        if served is not None and served[0] == checkpoint_id:
            self._compaction = None  # the next barrier serves the request

    # -- state compaction --------------------------------------------------------------------

    def _compact_at(self, checkpoint_id: int | None) -> frozenset[int]:
        """The subtasks that compact RocksDB before this checkpoint's snapshot: those of the
        pending compaction request, if no earlier checkpoint is serving it already."""
        if checkpoint_id is None or self._compaction is not None:
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
        everyone = range(self.job.parallelism)
        subtasks = frozenset(s for s in request.subtasks if s in everyone) or frozenset(everyone)
        self._compaction = (checkpoint_id, request, 0.0)
        self.log(
            f"checkpoint {checkpoint_id}: subtasks {sorted(subtasks)} compact their state first"
            f" ({request.reason or 'requested'})"
        )
        return subtasks

    def _compaction_done(self, manifest: CheckpointManifest) -> None:
        """Once a checkpoint that holds the compacted state completes, the request is served."""
        served = self._compaction
        if served is None or manifest.checkpoint_id < served[0]:
            return
        self._compaction = None
        cid, request, compact_ms = served
        before = self._latest_manifest.file_count if self._latest_manifest else 0
        self.log(
            f"state compacted at checkpoint {cid} in {compact_ms:.0f} ms: a restore now reads "
            f"{manifest.file_count} files (before: {before})"
        )
        self.events.emit(
            "compacted",
            {
                "checkpoint_id": manifest.checkpoint_id,
                "subtasks": sorted(request.subtasks),
                "files_before": before,
                "files_after": manifest.file_count,
                "compact_ms": compact_ms,
            },
        )
        # last: whoever waits for the request to go has the log line and the event
        clear_request(self.storage, self.layout, request)

    # -- liveness ----------------------------------------------------------------------------

    def _heartbeat(self) -> None:
        """Every ``heartbeat_s``: record a heartbeat in ``streaming_jobs`` (an orchestrator
        that sees it stop fails the run); stop if a newer attempt of the job has begun (this one
        is superseded) or if the orchestrator process that launched this driver is gone (so an
        orphaned driver never runs beside the restore that replaces it)."""
        while not self._shutdown.wait(self.heartbeat_s):
            if self.watch_pid is not None and not _alive(self.watch_pid):
                self.fail(f"the orchestrator process {self.watch_pid} is gone")
                return
            try:
                self.catalog.heartbeat(self.job.name, self.attempt)
                newest = self.catalog.newest_attempt(self.job.name)
            except Exception as e:  # a missed heartbeat is not a failure; many are
                self.log(f"heartbeat: {type(e).__name__}: {e}")
                continue
            if newest > self.attempt:
                error = FencedError(
                    f"attempt {newest} of {self.job.name} has started: attempt {self.attempt} "
                    "is superseded and stops"
                )
                self.fail(str(error), error)
                return

    # -- acks --------------------------------------------------------------------------------

    def _poll_acks(self) -> None:
        """Deliver the acks subtasks left in this attempt's inbox; expire overdue checkpoints."""
        seen: set[tuple[int, str, int]] = set()
        self._drop_acks(lambda attempt, cid: attempt < self.attempt)  # older attempts' inboxes
        while not self._shutdown.is_set():
            try:
                while not self._cuts.empty():
                    cid, positions, epochs, watermarks, ends, counters = self._cuts.get_nowait()
                    self.coordinator.record_cut(
                        cid,
                        positions,
                        now_ms(),
                        sink_epochs=epochs,
                        watermarks=watermarks,
                        epoch_ends=ends,
                        counters=counters,
                    )
                self.coordinator.expire(now_ms())
                for cid in self.coordinator.pending_ids():
                    for op, subtask in self._tasks():
                        if (cid, op, subtask) in seen:
                            continue
                        path = ack_path(self.layout, self.attempt, cid, op, subtask)
                        if not self.storage.exists(path):
                            continue
                        seen.add((cid, op, subtask))
                        ack = Ack.from_json(self.storage.get_bytes(path), source=path)
                        self.coordinator.receive(ack, now_ms())
                pending = set(self.coordinator.pending_ids())
                self._drop_acks(lambda _, cid, live=pending: cid not in live, inbox(self.attempt))
            except Exception as e:  # keep polling; persistent failures show up as timeouts
                self.log(f"ack poller: {type(e).__name__}: {e}")
            self._shutdown.wait(0.1)

    def _drop_acks(self, stale, prefix: str = "_acks") -> None:
        """Delete the acks under ``prefix`` for which ``stale(attempt, checkpoint_id)`` holds."""
        skip = len(self.layout.job_id) + 1  # storage paths are "<job>/<relative path>"
        paths = [
            info.path
            for info in self.storage.list(self.layout.job_path(prefix))
            if (where := ack_location(info.path[skip:])) is not None and stale(*where)
        ]
        if paths:
            self.storage.delete_many(paths)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_job(
    spark,
    job: JobDefinition,
    paths: RuntimePaths,
    **kwargs: Any,
) -> RunSummary:
    """Run one attempt of ``job`` (see :class:`StreamingRun` for the keyword arguments)."""
    return StreamingRun(spark, job, paths, **kwargs).run()
