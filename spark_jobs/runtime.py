"""The driver of a checkpointed streaming job: one attempt, from restore to stop.

1. Start a new attempt in the catalog (fencing every older one).
2. Restore: pick the latest completed checkpoint that validates (marking bad ones CORRUPT and
   falling back), redo its sink commit, drop later staged output, and restore every subtask's
   working state local-first in a Spark job of ``parallelism`` tasks, each placed on the host its
   executor hint names. Record the recovery.
3. Run the streaming query from the checkpoint's source positions. Each micro-batch (in
   ``foreachBatch``) is one Spark job: records are routed by key group to subtask partitions,
   every subtask runs on the host that holds its working state (placement.py), and at a barrier
   each takes its synchronous snapshot. The coordinator collects acks from durable storage on a
   background thread, so uploads never hold up the next micro-batch; a completed checkpoint
   commits the sink.
4. Stop (max batches or idle): take a final checkpoint, wait for it, commit, mark FINISHED.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from spark_jobs.delta_catalog import DeltaCatalog, now_ms
from spark_jobs.delta_sink import DeltaSinkWriter
from spark_jobs.events import EventChannel
from spark_jobs.job import JobDefinition, KafkaSource, WindowedAggregate
from spark_jobs.local_log import (
    NEXT_OFFSET_COLUMN,
    PARTITION_COLUMN,
    register_data_source,
    topic_partitions,
)
from spark_jobs.operators import KEY_GROUP_COLUMN, SOURCE_COLUMN
from spark_jobs.placement import (
    anchor_rdd,
    executor_hosts,
    lost_subtasks,
    pin_to_anchor,
    placed_rdd,
    preferred_hosts,
    subtask_partition,
    wait_for_hosts,
)
from spark_jobs.startup import StartupTimeline
from spark_jobs.subtask import (
    CHUNKS_SCHEMA,
    KEY_COLUMN,
    SUBTASK_COLUMN,
    BatchPlan,
    RunContext,
    ack_path,
    prepare_subtask,
    run_subtask,
    split_by_subtask,
    warm_up_worker,
)
from state.catalog import CheckpointStatus
from state.compaction import (
    COMPACT_REQUEST,
    CompactionRequest,
    CompactionRequestError,
    clear_request,
    read_request,
)
from state.config import EXACTLY_ONCE
from state.coordinator import CheckpointCoordinator
from state.handles import SubtaskStateHandle
from state.keygroups import spark_key_group_sql
from state.manifest import CheckpointManifest, ManifestError
from state.paths import JobLayout
from state.restore import read_manifest, validate_checkpoint
from state.storage import StorageError, open_storage

HEARTBEAT_S = 10.0
EXECUTOR_WAIT_S = 60.0  # how long a restore waits for executors on the hinted hosts
HOST_CHECK_S = 2.0  # how often a run on a cluster checks that its subtasks' hosts have executors


class NoRestorableCheckpointError(RuntimeError):
    """Checkpoints exist, but none of them validates."""


@dataclass(frozen=True)
class RuntimePaths:
    """Where a job keeps its checkpoints, catalog and output, local state and input log."""

    checkpoint_root: str
    warehouse: str
    local_state_root: str
    log_root: str

    @classmethod
    def under(cls, home: str | Path) -> RuntimePaths:
        home = Path(home).resolve()
        return cls(
            checkpoint_root=str(home / "checkpoints"),
            warehouse=str(home / "warehouse"),
            local_state_root=str(home / "local-state"),
            log_root=str(home / "log"),
        )


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
    failure: str | None = None
    batch_ms: list[float] = field(default_factory=list)  # wall time of each micro-batch
    batch_checkpointing: list[bool] = field(default_factory=list)  # a checkpoint was in flight


@dataclass(frozen=True)
class StartPlan:
    """What a start decided before it needs Spark: its attempt (every older one fenced) and the
    checkpoint it restores (validated; ``None``: start empty), with the fallbacks taken."""

    attempt: int
    manifest: CheckpointManifest | None
    fallbacks: list[str]
    seconds: float = 0.0  # how long deciding took


def plan_start(
    catalog: DeltaCatalog,
    storage,
    job_id: str,
    restore: str | int | None,
    run_id: str = "",
    log=print,
) -> StartPlan:
    """Begin a new attempt and choose the checkpoint it restores. Needs no Spark session once
    the catalog tables exist (delta-rs and durable storage only), so a driver runs it while its
    session starts (:func:`plan_start_early`)."""
    started = time.monotonic()
    attempt = catalog.begin_attempt(job_id, run_id=run_id)
    manifest, fallbacks = (None, [])
    if restore is not None:
        manifest, fallbacks = select_checkpoint(catalog, storage, job_id, restore, log)
    return StartPlan(attempt, manifest, fallbacks, time.monotonic() - started)


def plan_start_early(
    job: JobDefinition, paths: RuntimePaths, restore: str | int | None, run_id: str = "", log=print
) -> Future[StartPlan] | None:
    """:func:`plan_start` on a thread of its own, to overlap the JVM's start; ``None`` when the
    catalog tables do not exist yet (creating them takes Spark: the run plans after it)."""
    if not DeltaCatalog.tables_exist(paths.warehouse):
        return None
    catalog = DeltaCatalog(None, paths.warehouse)
    storage = open_storage(paths.checkpoint_root)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cutline-plan")
    future = pool.submit(plan_start, catalog, storage, job.name, restore, run_id, log)
    pool.shutdown(wait=False)
    return future


def abandon_plan(
    plan: Future[StartPlan] | None, paths: RuntimePaths, job_id: str, reason: str
) -> None:
    """A start planned early that cannot go on (its Spark session failed): its attempt, if one
    began, is marked FAILED with ``reason``."""
    if plan is None:
        return
    try:
        attempt = plan.result().attempt
    except Exception:  # the plan failed too; no attempt to close, or it is left to the sensor
        return
    DeltaCatalog(None, paths.warehouse).set_job_status(job_id, attempt, "FAILED", reason)


def select_checkpoint(
    catalog: DeltaCatalog, storage, job_id: str, wanted: str | int, log=print
) -> tuple[CheckpointManifest | None, list[str]]:
    """The checkpoint to restore: ``latest`` (falling back past corrupt ones) or an id."""
    rows = catalog.checkpoints(job_id, (CheckpointStatus.COMPLETED,))
    if wanted != "latest":
        rows = [r for r in catalog.checkpoints(job_id) if r.checkpoint_id == int(wanted)]
        if not rows:
            raise NoRestorableCheckpointError(f"{job_id} has no checkpoint {wanted}")
    fallbacks: list[str] = []
    for row in sorted(rows, key=lambda r: r.checkpoint_id, reverse=True):
        try:
            manifest = read_manifest(storage, row.metadata_path)
            problems = validate_checkpoint(manifest, storage)
            if problems:
                raise StorageError(f"checkpoint {row.checkpoint_id}: " + "; ".join(problems[:3]))
            return manifest, fallbacks
        except (ManifestError, StorageError) as e:
            log(f"checkpoint {row.checkpoint_id} is not restorable, marking it CORRUPT: {e}")
            catalog.mark_corrupt(job_id, row.checkpoint_id, str(e))
            fallbacks.append(f"checkpoint {row.checkpoint_id}: {e}")
    if rows:
        raise NoRestorableCheckpointError(
            f"no restorable checkpoint of {job_id}: " + " | ".join(fallbacks)
        )
    return None, fallbacks


class _Listener:
    def __init__(self, run: StreamingRun) -> None:
        self.run = run

    def on_checkpoint_complete(self, record, manifest: CheckpointManifest) -> None:
        self.run.on_complete(record, manifest)

    def on_checkpoint_aborted(self, checkpoint_id: int, reason: str) -> None:
        self.run.on_aborted(checkpoint_id)
        self.run.log(f"checkpoint {checkpoint_id} aborted: {reason}")

    def on_job_failed(self, error: BaseException) -> None:
        self.run.fail(f"checkpointing failed: {error}")


class StreamingRun:
    """One attempt of a job on a Spark session."""

    def __init__(
        self,
        spark,
        job: JobDefinition,
        paths: RuntimePaths,
        *,
        restore: str | int | None = "latest",
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
        self.sink = DeltaSinkWriter(spark, job.name, job.sink, paths.warehouse)
        self.exactly_once = job.checkpoint.mode == EXACTLY_ONCE
        self._failure: str | None = None
        self._stop = threading.Event()  # stop taking micro-batches
        self._restored = threading.Event()  # the working state is restored: micro-batches may run
        self._shutdown = threading.Event()  # stop the ack poller (after the final checkpoint)
        self._batch_lock = threading.Lock()
        self._cuts: queue.Queue = queue.Queue()  # cuts recorded by micro-batches, for the poller
        self._last_progress = time.monotonic()
        self._query_has_run = False
        self._in_batch = False
        # on a cluster, a host that loses its executors takes its subtasks' working state along
        self._watch_hosts = not spark.sparkContext.master.startswith("local")
        self.aborted: set[int] = set()
        self.layout = JobLayout(job.name)
        # a compaction request being served: (checkpoint id, request, compaction ms)
        self._compaction: tuple[int, CompactionRequest, float] | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def fail(self, reason: str) -> None:
        if self._failure is None:
            self._failure = reason
        self._stop.set()

    def on_complete(self, record, manifest: CheckpointManifest) -> None:
        epoch = manifest.sink_epochs.get(self.job.sink.name)
        committed = 0
        if self.exactly_once and epoch is not None:
            committed = self.sink.commit_through(epoch)
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
        self.events.emit("checkpoint", record.to_dict())

    def run(self) -> RunSummary:
        job = self.job
        if self._early_plan is not None:
            plan = self._early_plan.result()
            self.timeline.note_overlapped("attempt and checkpoint", plan.seconds)
            self.timeline.mark("waiting for the plan")
        else:
            plan = plan_start(
                self.catalog, self.storage, job.name, self.restore, self.run_id, self.log
            )
            self.timeline.mark("attempt and checkpoint")
        self.attempt = plan.attempt
        manifest = plan.manifest
        self.ctx = RunContext(
            job=job,
            attempt=self.attempt,
            checkpoint_root=self.paths.checkpoint_root,
            local_state_root=self.paths.local_state_root,
            staging_root=str(Path(self.paths.warehouse) / "staging"),
        )
        self.summary = RunSummary(
            job.name, self.attempt, manifest.checkpoint_id if manifest else None
        )
        self._known_shared = {f.path for f in manifest.files() if f.shared} if manifest else set()
        self._latest_manifest = manifest
        self.partitions: dict[str, list[int]] = {}
        self.positions: dict[str, dict[str, int]] = {}
        self.allocation: dict[str, str] = {}
        self.watermark = manifest.watermarks.get(job.operator.name) if manifest else None
        poller = None
        query = None
        spark_checkpoint = tempfile.mkdtemp(prefix=f"cutline-{job.name}-query-")
        try:
            self._recover_sink(manifest)
            self.epoch = self._start_epoch
            self._rewind_sources(manifest)
            self.coordinator = CheckpointCoordinator(
                job.name,
                self.attempt,
                job.checkpoint,
                [(job.operator.name, i) for i in range(job.parallelism)],
                self.storage,
                self.catalog,
                listeners=[_Listener(self)],
                restored=manifest,
                now_ms=now_ms(),
            )
            poller = threading.Thread(target=self._poll_acks, name="cutline-acks", daemon=True)
            poller.start()
            threading.Thread(target=self._heartbeat, name="cutline-heartbeat", daemon=True).start()
            # The state restores on a thread of its own while the query starts: Spark starts
            # its source and plans the first trigger meanwhile, and the first micro-batch waits
            # for the restore.
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cutline-restore") as pool:
                restoring = pool.submit(self._restore_state, manifest, plan.fallbacks)
                threading.Thread(target=self._warm_up, name="cutline-warm-up", daemon=True).start()
                try:
                    query = self._start_query(spark_checkpoint)
                    self.timeline.mark("query started")
                except BaseException:
                    restoring.exception()  # wait for it; the query's error is the run's
                    raise
                restoring.result()
            self.timeline.mark("state restored")
            self.summary.restore_reports = self._restore_reports
            self._restored.set()
            self.events.emit(
                "started",
                {
                    "attempt": self.attempt,
                    "restored_from": self.summary.restored_from,
                    "allocation": self.allocation,
                    "restore_reports": self._restore_reports,
                },
            )
            self._last_progress = time.monotonic()
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
            with self._batch_lock:  # let a running micro-batch finish; later ones are skipped
                pass
            query.stop()
            query = None
            if self._failure is None:
                self._final_checkpoint()
        except BaseException as e:
            self.fail(f"{type(e).__name__}: {e}")
            raise
        finally:
            self._stop.set()
            self._restored.set()  # a micro-batch waiting for the restore is skipped
            if query is not None:
                query.stop()
            self._shutdown.set()
            if poller is not None:
                poller.join(timeout=5)
            shutil.rmtree(spark_checkpoint, ignore_errors=True)
            status = "FAILED" if self._failure else "FINISHED"
            self.summary.failure = self._failure
            self.summary.positions = {k: dict(v) for k, v in self.positions.items()}
            self.catalog.set_job_status(job.name, self.attempt, status, self._failure or "")
        if self._failure:
            raise RuntimeError(f"{job.name} attempt {self.attempt} failed: {self._failure}")
        return self.summary

    # -- restore -----------------------------------------------------------------------------

    def _recover_sink(self, manifest: CheckpointManifest | None) -> None:
        """Redo the restored checkpoint's sink commit (a no-op if it landed), drop output staged
        after it, and set the epoch micro-batches continue from."""
        job = self.job
        started = time.perf_counter()
        if manifest is not None:
            epoch = manifest.sink_epochs.get(job.sink.name, manifest.batch_id)
            if self.exactly_once:
                redone = self.sink.commit_through(epoch)
                self.log(f"sink: epoch {epoch} commit redone ({redone} rows were missing)")
            dropped = self.sink.discard_after(epoch)
            if dropped:
                self.log(f"sink: discarded staged epochs {dropped} (recomputed after restore)")
        else:
            self.sink.discard_after(-1)
        # Epochs continue above what the sink already committed, even on a fresh start
        # (--restore none): Delta would silently skip a reused transaction version.
        self._start_epoch = max(
            manifest.batch_id if manifest else -1, self.sink.committed_version()
        )
        self._sink_recovery_s = time.perf_counter() - started
        self.timeline.mark("sink recovered")

    def _rewind_sources(self, manifest: CheckpointManifest | None) -> None:
        """Every input partition's start: the checkpoint's position, else the beginning."""
        for name in self.job.operator.inputs:
            source = self.job.source(name)
            if isinstance(source, KafkaSource):
                parts = list(range(source.partitions))
                unread = -2  # Kafka's "earliest"
            else:
                parts = topic_partitions(self.paths.log_root, source.topic)
                unread = 0
            if not parts:
                raise ValueError(
                    f"source {name!r}: no partitions under {self.paths.log_root}/{source.topic}"
                )
            start = (manifest.source_positions.get(name) if manifest else None) or {}
            self.partitions[name] = parts
            self.positions[name] = {str(p): int(start.get(str(p), unread)) for p in parts}

    def _restore_state(self, manifest: CheckpointManifest | None, fallbacks: list[str]) -> None:
        """Restore every subtask's working state local-first, each on the host its executor
        hint names (a Spark job of ``parallelism`` tasks), record the recovery and anchor the
        subtasks to their hosts for the attempt."""
        job = self.job
        started = time.perf_counter()
        handles: dict[int, SubtaskStateHandle | None] = {
            i: manifest.handle(job.operator.name, i) if manifest else None
            for i in range(job.parallelism)
        }
        ctx, epoch = self.ctx, self._start_epoch
        sc = self.spark.sparkContext
        if self.hints and not sc.master.startswith("local"):
            missing = wait_for_hosts(sc, set(self.hints.values()), self.executor_wait_s)
            if missing:
                self.log(
                    f"no executor on hinted hosts {sorted(missing)} after {self.executor_wait_s} s:"
                    " their subtasks restore wherever Spark has room"
                )
        prefs = preferred_hosts(self.hints, job.parallelism, executor_hosts(sc))
        reports = (
            placed_rdd(sc, prefs)
            .mapPartitionsWithIndex(
                lambda i, _: [json.dumps(prepare_subtask(ctx, i, handles[i], epoch))]
            )
            .collect()
        )
        self._restore_reports = sorted((json.loads(r) for r in reports), key=lambda r: r["subtask"])
        for report, preferred in zip(self._restore_reports, prefs, strict=True):
            report["hint"] = self.hints.get(str(report["subtask"]))
            report["placed"] = bool(preferred)  # an executor ran on the hinted host
        self.allocation = {str(r["subtask"]): r["host"] for r in self._restore_reports}
        self.catalog.set_restored(
            job.name, self.attempt, manifest.checkpoint_id if manifest else None, self.allocation
        )
        if manifest is not None:
            local = [r for r in self._restore_reports if r["source"] == "local"]
            row = {
                "job_id": job.name,
                "attempt": self.attempt,
                "checkpoint_id": manifest.checkpoint_id,
                "subtasks_local": len(local),
                "subtasks_remote": len(self._restore_reports) - len(local),
                "bytes_local": sum(r.get("bytes_local", 0) for r in self._restore_reports),
                "bytes_remote": sum(r.get("bytes_remote", 0) for r in self._restore_reports),
                "duration_ms": (time.perf_counter() - started + self._sink_recovery_s) * 1000,
                "fallbacks": json.dumps(
                    fallbacks + [f for r in self._restore_reports for f in r.get("fallbacks", [])]
                ),
                "hints": json.dumps(self.hints),
                "recovered_at_ms": now_ms(),
                "files_local": sum(r.get("files_local", 0) for r in self._restore_reports),
                "files_remote": sum(r.get("files_remote", 0) for r in self._restore_reports),
                "placement": json.dumps(
                    [
                        {k: r.get(k) for k in ("subtask", "host", "hint", "source")}
                        for r in self._restore_reports
                    ]
                ),
            }
            self.catalog.record_recovery(row)
            self.log(
                f"restored checkpoint {manifest.checkpoint_id} (batch {manifest.batch_id}): "
                f"{row['subtasks_local']} subtasks local, {row['subtasks_remote']} remote, "
                f"{row['files_local'] + row['files_remote']} files: "
                f"{row['bytes_local']:,} B local, {row['bytes_remote']:,} B remote"
            )
        # every micro-batch task of subtask i runs where subtask i was restored (placement.py)
        self._anchor = anchor_rdd(
            sc, preferred_hosts(self.allocation, job.parallelism, executor_hosts(sc))
        )
        self.timeline.note_overlapped("restore", time.perf_counter() - started)

    # -- micro-batches -----------------------------------------------------------------------

    def _idle(self, query) -> bool:
        """The query has run a trigger (on a loaded machine the first can take longer than the
        idle timeout) and no micro-batch is running: a micro-batch longer than the idle timeout
        is not idle time."""
        if not self._query_has_run:
            self._query_has_run = self.summary.batches > 0 or query.lastProgress is not None
        return self._query_has_run and not self._in_batch

    def _source_ddl(self, name: str) -> str:
        return f"{self.job.source(name).schema}, {PARTITION_COLUMN} int, {NEXT_OFFSET_COLUMN} long"

    def _tag_and_union(self, frames: dict[str, Any]):
        """One DataFrame of all operator inputs, each record tagged with its source and key."""
        from pyspark.sql import functions as F

        tagged = [
            df.withColumn(SOURCE_COLUMN, F.lit(name)).withColumn(
                KEY_COLUMN, F.col(self.job.operator.inputs[name])
            )
            for name, df in frames.items()
        ]
        union = tagged[0]
        for df in tagged[1:]:
            union = union.unionByName(df, allowMissingColumns=True)
        return union

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

    def _start_query(self, spark_checkpoint: str):
        register_data_source(self.spark)
        frames = {}
        for name in self.job.operator.inputs:
            source = self.job.source(name)
            if isinstance(source, KafkaSource):
                frames[name] = self._kafka_frame(name, source)
                continue
            frames[name] = (
                self.spark.readStream.format("cutline_log")
                .schema(self._source_ddl(name))
                .option("path", self.paths.log_root)
                .option("topic", source.topic)
                .option("partitions", json.dumps(self.partitions[name]))
                .option("startingOffsets", json.dumps(self.positions[name]))
                .option("maxRecordsPerPartition", str(source.max_records_per_partition))
                .load()
            )
        return (
            self._tag_and_union(frames)
            .writeStream.foreachBatch(self._process_batch)
            .option("checkpointLocation", spark_checkpoint)
            .queryName(f"cutline-{self.job.name}-{self.attempt}")
            .start()
        )

    def _kafka_frame(self, name: str, source: KafkaSource):
        """JSON records of a Kafka topic from the recorded offsets, with the log source's
        position columns (partition, offset of the next record)."""
        from pyspark.sql import functions as F

        raw = (
            self.spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", source.servers())
            .option("subscribe", source.topic)
            .option("startingOffsets", json.dumps({source.topic: self.positions[name]}))
            .option(
                "maxOffsetsPerTrigger", str(source.max_records_per_partition * source.partitions)
            )
            .option("failOnDataLoss", "true")
            .load()
        )
        return raw.select(
            F.from_json(F.col("value").cast("string"), source.schema).alias("_v"),
            F.col("partition").alias(PARTITION_COLUMN),
            (F.col("offset") + 1).alias(NEXT_OFFSET_COLUMN),
        ).select("_v.*", PARTITION_COLUMN, NEXT_OFFSET_COLUMN)

    def _plan(self, epoch: int, checkpoint_id: int | None) -> BatchPlan:
        latest = self.coordinator.latest_completed
        op = self.job.operator.name
        return BatchPlan(
            ctx=self.ctx,
            epoch=epoch,
            previous_epoch=epoch - 1,
            checkpoint_id=checkpoint_id,
            base_handles={
                i: self.coordinator.base_handle((op, i))
                for i in range(self.job.parallelism)
                if checkpoint_id is not None and self.job.checkpoint.incremental
            },
            confirmed_checkpoint=latest.checkpoint_id if latest else None,
            watermark=self.watermark,
            compact=self._compact_at(checkpoint_id),
        )

    def _execute(self, df, plan: BatchPlan) -> list[dict]:
        """One micro-batch: route records to subtasks by key group, in Arrow IPC chunks, then
        run each subtask where its working state lives. Returns the subtasks' statistics."""
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import to_arrow_schema

        job = self.job
        p, m = job.parallelism, job.max_parallelism
        keyed = df.withColumn(KEY_GROUP_COLUMN, F.expr(spark_key_group_sql(KEY_COLUMN, m)))
        keyed = keyed.withColumn(
            SUBTASK_COLUMN, F.expr(f"CAST({KEY_GROUP_COLUMN} * {p} DIV {m} AS INT)")
        )
        plan = replace(plan, schema=to_arrow_schema(keyed.schema))
        chunks = keyed.mapInArrow(split_by_subtask, CHUNKS_SCHEMA).rdd.partitionBy(
            p, subtask_partition
        )
        return (
            pin_to_anchor(chunks, self._anchor)
            .mapPartitionsWithIndex(
                lambda i, it: [run_subtask(plan, i, (chunk for _, chunk in it))]
            )
            .collect()
        )

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
        now = now_ms()
        pending = self.coordinator.trigger(epoch, None, now)
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

    def _after_batch(self, epoch: int, checkpoint_id: int | None, stats: list) -> int:
        """Folds the subtasks' reports into the run's positions and counters; returns the
        micro-batch's record count."""
        records = sum(r["records"] for r in stats)
        for r in stats:
            for source, parts in r["positions"].items():
                current = self.positions[source]
                for part, end in parts.items():
                    current[part] = max(current.get(part, 0), end)
        op = self.job.operator
        event_times = [r["max_event_time"] for r in stats if r["max_event_time"] is not None]
        if isinstance(op, WindowedAggregate) and event_times:
            candidate = max(event_times) - op.out_of_orderness_ms
            self.watermark = candidate if self.watermark is None else max(self.watermark, candidate)
        self.summary.late_records += sum(r["late_records"] for r in stats)
        served = self._compaction
        if checkpoint_id is not None and served is not None and served[0] == checkpoint_id:
            self._compaction = (*served[:2], max(r["compact_ms"] for r in stats))
        if checkpoint_id is not None:
            # Completion commits Delta transactions: it runs on the ack poller's thread, never on
            # Spark's stream thread, which a stopping query interrupts.
            self._cuts.put(
                (
                    checkpoint_id,
                    {k: dict(v) for k, v in self.positions.items()},
                    {self.job.sink.name: epoch},
                    {op.name: self.watermark} if self.watermark is not None else {},
                )
            )
        if not self.exactly_once:
            self.sink.append_now(epoch)
        self.summary.batches += 1
        self.summary.records += records
        return records

    def _final_checkpoint(self, timeout_s: float = 120.0) -> None:
        """A barrier with no records (Flink's stop-with-checkpoint): commits all output."""
        self.epoch += 1
        deadline = time.monotonic() + timeout_s
        pending = None
        while pending is None and time.monotonic() < deadline:
            # max_concurrent may be reached: the pending ones finish first
            pending = self.coordinator.trigger(self.epoch, None, now_ms(), force=True)
            if pending is None:
                time.sleep(0.1)
        if pending is None:
            self.fail("no final checkpoint could be triggered")
            return
        cid = pending.checkpoint_id
        empty = self._tag_and_union(
            {
                n: self.spark.createDataFrame([], self._source_ddl(n))
                for n in self.job.operator.inputs
            }
        )
        stats = self._execute(empty, self._plan(self.epoch, cid))
        self._after_batch(self.epoch, cid, stats)
        while time.monotonic() < deadline:
            if cid in self.summary.checkpoints or cid in self.aborted:
                break
            time.sleep(0.1)
        if cid not in self.summary.checkpoints:
            self.fail(f"final checkpoint {cid} did not complete")

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

    def on_aborted(self, checkpoint_id: int) -> None:
        self.aborted.add(checkpoint_id)
        served = self._compaction
        if served is not None and served[0] == checkpoint_id:
            self._compaction = None  # the next barrier serves the request

    # -- liveness ----------------------------------------------------------------------------

    def _heartbeat(self) -> None:
        """Every ``heartbeat_s``: record a heartbeat in ``streaming_jobs`` (an orchestrator
        that sees it stop fails the run) and stop if the orchestrator process that launched this
        driver is gone (so an orphaned driver never runs beside the restore that replaces it)."""
        while not self._shutdown.wait(self.heartbeat_s):
            if self.watch_pid is not None and not _alive(self.watch_pid):
                self.fail(f"the orchestrator process {self.watch_pid} is gone")
                return
            try:
                self.catalog.heartbeat(self.job.name, self.attempt)
            except Exception as e:  # a missed heartbeat is not a failure; many are
                self.log(f"heartbeat: {type(e).__name__}: {e}")

    # -- acks --------------------------------------------------------------------------------

    def _poll_acks(self) -> None:
        """Deliver acks that subtasks left in durable storage; expire overdue checkpoints."""
        op = self.job.operator.name
        seen: set[tuple[int, int]] = set()
        while not self._shutdown.is_set():
            try:
                while not self._cuts.empty():
                    cid, positions, epochs, watermarks = self._cuts.get_nowait()
                    self.coordinator.record_cut(
                        cid, positions, now_ms(), sink_epochs=epochs, watermarks=watermarks
                    )
                self.coordinator.expire(now_ms())
                for cid in self.coordinator.pending_ids():
                    for subtask in range(self.job.parallelism):
                        if (cid, subtask) in seen:
                            continue
                        path = ack_path(self.job.name, cid, op, subtask)
                        if not self.storage.exists(path):
                            continue
                        seen.add((cid, subtask))
                        doc = json.loads(self.storage.get_bytes(path))
                        if "declined" in doc:
                            self.coordinator.decline(cid, (op, subtask), doc["declined"])
                        else:
                            handle = SubtaskStateHandle.from_dict(doc["handle"])
                            self.coordinator.acknowledge(cid, (op, subtask), handle, now_ms())
                self._drop_finished_acks()
            except Exception as e:  # keep polling; a persistent failure shows up as timeouts
                self.log(f"ack poller: {type(e).__name__}: {e}")
            self._shutdown.wait(0.1)

    def _drop_finished_acks(self) -> None:
        pending = set(self.coordinator.pending_ids())
        prefix = JobLayout(self.job.name).job_path("_acks")
        stale = [
            i.path
            for i in self.storage.list(prefix)
            if JobLayout.checkpoint_id_of(i.path[len(prefix) + 1 :]) not in pending
        ]
        if stale:
            self.storage.delete_many(stale)


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
