"""One subtask of one stage for one micro-batch, inside a Spark task (spark_jobs/executor/
dataflow.py routes the records to it), and the setup of a subtask's working state for a new
attempt.

Partition *i* of a stage's shuffle is exactly subtask *i* and runs on the host that holds its
working state (placement.py). The task opens the subtask's working RocksDB on the executor's
local disk (one per attempt: a zombie attempt never touches it), checks that it holds the state
the driver expects (right attempt, previous micro-batch applied), applies the batch and records
its progress, stages the sink output (under this attempt's staging directory; a replayed epoch
stages nothing), and at a barrier takes the synchronous snapshot and leaves the upload to a
background thread, whose :class:`~state.acks.Ack` lands in this attempt's inbox in durable
storage for the driver's coordinator. Bad records are split off first
(spark_jobs/sources/bad_records.py). It returns its
:class:`~spark_jobs.executor.reports.SubtaskStats`; a restore returns its
:class:`~spark_jobs.executor.reports.SubtaskRestoreReport`.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from cutline.job import DEAD_LETTER_SINK, JobDefinition
from cutline.keyed_process import SOURCE_COLUMN, ProcessOperator
from cutline.sinks.staging import StagedEpochs
from cutline.sources.base import NEXT_OFFSET_COLUMN, PARTITION_COLUMN
from spark_jobs.errors import IncompatibleStateError, carry_to_driver
from spark_jobs.executor.reports import SubtaskRestoreReport, SubtaskStats
from spark_jobs.sources.bad_records import dead_letters, first_bad, split_bad
from state.acks import Ack, ack_path
from state.backend import StateBackendError, corrupt_file, disk_full
from state.faults import kill_point, upload_executor
from state.handles import SubtaskStateHandle
from state.keygroups import key_group_range
from state.local_copies import LocalCopies
from state.manifest import Positions
from state.paths import JobLayout
from state.storage import CorruptFileError, MissingFileError, open_storage

if TYPE_CHECKING:
    from state.rocksdb_store import RocksDBStore

# rocksdict is imported inside the task functions only: the driver never opens state, and
# rocksdict loaded beside deltalake's runtime aborts the interpreter at exit.

PROGRESS = "__progress__"
# set by Spark in its Python workers' environment when a worker runs task after task (the
# default, spark.python.worker.reuse): only then does a store's release outlive its task
REUSED_WORKER = "SPARK_REUSE_WORKER"


@contextmanager
def naming_the_subtask(stage: str, subtask: int, copies: LocalCopies) -> Iterator[None]:
    """Around a subtask's work: a failure of its local state (the state backend's, or a full
    disk under it) names the stage, the subtask and the host, so the run's last line says which
    subtask could not write where. A corrupt block makes the next restore read every local file
    of ``copies`` again (their recorded checksums are forgotten): the one whose bytes changed
    is then taken from the primary copy."""
    try:
        yield
    except StateBackendError as e:
        if corrupt_file(e):
            copies.distrust()
        raise StateBackendError(f"stage {stage!r} subtask {subtask}: {e}") from e
    except OSError as e:
        if not disk_full(e):
            raise
        raise StateBackendError(
            f"stage {stage!r} subtask {subtask}: disk full (no space left on device) writing "
            f"{e.filename or 'its local state'} on {host_name()}"
        ) from e


def host_name() -> str:
    """The host this code runs on, as allocations and hints name it: ``CUTLINE_HOST`` where
    several workers share a machine (spark_jobs/deploy/standalone.py), else the host name."""
    return os.environ.get("CUTLINE_HOST") or socket.gethostname()


class SubtaskStateError(RuntimeError):
    """A subtask's working state is not what the driver expects (wrong host, lost, or stale)."""


@dataclass(frozen=True)
class RunContext:
    """What every task of one attempt needs; shipped inside each micro-batch's plan."""

    job: JobDefinition
    attempt: int
    checkpoint_root: str
    local_state_root: str
    staging_root: str

    def copies(self, uid: str, subtask: int) -> LocalCopies:
        """This host's working state and local copies of subtask ``subtask`` of stage ``uid``
        (``CUTLINE_LOCAL_STATE_ROOT`` in an executor's environment overrides the job's root, for
        several workers on one machine)."""
        root = os.environ.get("CUTLINE_LOCAL_STATE_ROOT") or self.local_state_root
        return LocalCopies(root, self.job.name, uid, subtask, self.attempt)

    def key_groups(self, subtask: int):
        return key_group_range(subtask, self.job.parallelism, self.job.max_parallelism)


@dataclass(frozen=True)
class BatchPlan:
    ctx: RunContext
    epoch: int
    previous_epoch: int
    checkpoint_id: int | None = None
    base_handles: dict[tuple[str, int], SubtaskStateHandle | None] = field(default_factory=dict)
    confirmed_checkpoint: int | None = None
    watermarks: dict[str, int] = field(default_factory=dict)  # per stage uid, as of the last cut
    compact: frozenset[int] = frozenset()  # subtasks that compact RocksDB before the snapshot
    schema: pa.Schema | None = None  # of the first stage's routed records (for an idle subtask)
    emit: bool = True  # False: a replayed epoch whose output the sinks already committed
    processing_time: int = 0  # ms since the epoch, as the driver planned the micro-batch
    # False in an attempt's first micro-batch: its stores' opens start no compaction (one due
    # at a restore would share the cores with the micro-batch a restart waits for; the next
    # micro-batch's open starts it)
    compactions: bool = True
    # the columns of each source a later stage reads, after its transforms (dataflow.py)
    source_columns: dict[str, tuple[str, ...]] = field(default_factory=dict)


def read_progress(store: RocksDBStore) -> dict | None:
    start = store.key_group_range.start
    raw = store.get_many(PROGRESS, [start], [b"p"])[0]
    return json.loads(raw) if raw else None


def write_progress(txn, store: RocksDBStore, attempt: int, epoch: int) -> None:
    payload = json.dumps({"attempt": attempt, "epoch": epoch, "host": host_name()})
    txn.put(PROGRESS, [store.key_group_range.start], [b"p"], [payload.encode()])


def _positions(table: pa.Table) -> Positions:
    """Per source and partition, the position after the last record of this batch."""
    if table.num_rows == 0:
        return {}
    grouped = table.group_by([SOURCE_COLUMN, PARTITION_COLUMN]).aggregate(
        [(NEXT_OFFSET_COLUMN, "max")]
    )
    out: Positions = {}
    for src, part, end in zip(
        grouped.column(SOURCE_COLUMN).to_pylist(),
        grouped.column(PARTITION_COLUMN).to_pylist(),
        grouped.column(f"{NEXT_OFFSET_COLUMN}_max").to_pylist(),
        strict=True,
    ):
        out.setdefault(src, {})[str(part)] = int(end)
    return out


def _from(table: pa.Table, sources: list[str], inputs: int) -> pa.Table:
    """The rows of ``table`` read from ``sources`` (not from an upstream stage; ``inputs``: how
    many inputs the stage has)."""
    if not sources or table.num_rows == 0:
        return table.slice(0, 0)
    if len(sources) == inputs or SOURCE_COLUMN not in table.column_names:
        return table
    return table.filter(pc.is_in(table.column(SOURCE_COLUMN), pa.array(sources, pa.string())))


def stage_output(plan: BatchPlan, stage: int, subtask: int, sink: str, output: pa.Table) -> None:
    """Stage ``output`` as subtask ``subtask`` of stage ``stage``'s part of epoch ``plan.epoch``
    of ``sink`` (the dead-letter sink takes parts from every stage that reads a source)."""
    if plan.emit:
        ctx = plan.ctx
        staged = StagedEpochs(ctx.staging_root, ctx.job.name, sink, ctx.attempt)
        staged.write(plan.epoch, f"part-{subtask:05d}-s{stage}", output)


def _send_ack(ctx: RunContext, checkpoint_id: int, operator: str, subtask: int, future) -> None:
    """Put the ack of a finished snapshot (its handle, or its failure as a decline) into the
    attempt's inbox. Run as the snapshot future's callback, where an exception would vanish: an
    ack that cannot be stored (after the storage's own retries) is said on the worker's stderr,
    and the checkpoint expires on the driver."""
    error = future.exception()
    if error is None:
        ack = Ack(ctx.attempt, checkpoint_id, operator, subtask, future.result())
    else:
        ack = Ack(ctx.attempt, checkpoint_id, operator, subtask, None, repr(error))
    path = ack_path(JobLayout(ctx.job.name), ctx.attempt, checkpoint_id, operator, subtask)
    try:
        open_storage(ctx.checkpoint_root).put_bytes(path, ack.to_json())
    except Exception as e:
        print(
            f"ack not stored: checkpoint {checkpoint_id} by {operator} subtask {subtask} "
            f"on {host_name()} ({type(e).__name__}: {e}); it will expire",
            file=sys.stderr,
            flush=True,
        )


def warm_up_worker(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A mapInArrow body that passes its input through, run once at an attempt's start: the
    Python worker it runs in imports what a micro-batch's map side needs (this module, the log
    source's reader) and stays in Spark's pool for the first micro-batch."""
    import cutline.sources.log_format  # noqa: F401 - the source's reader runs in these workers

    yield from batches


def run_subtask(
    plan: BatchPlan, stage: int, subtask: int, table: pa.Table
) -> tuple[SubtaskStats, pa.Table]:
    """Subtask ``subtask`` of stage ``stage`` in one micro-batch, on the host that holds its
    working state: apply ``table`` (its records, in log order), commit the state with the
    progress marker, stage the sinks' output, and at a barrier take the snapshot. Returns the
    statistics and the output rows (the next stage's input)."""
    from state.rocksdb_store import RocksDBStore
    from state.snapshot import SubtaskSnapshotter

    task_started = time.perf_counter()
    ctx = plan.ctx
    op = ctx.job.stages[stage]
    sources = [n for n in op.inputs if n in ctx.job.source_inputs]
    table, bad = split_bad(table) if sources else (table, table.schema.empty_table())
    copies = ctx.copies(op.uid, subtask)
    if plan.confirmed_checkpoint is not None:
        copies.confirm(plan.confirmed_checkpoint)
        copies.drop_beyond(ctx.job.parallelism, plan.confirmed_checkpoint)  # after a scale-in
    if not copies.db_dir.is_dir():
        raise SubtaskStateError(
            f"subtask {subtask} of stage {op.uid!r} of {ctx.job.name} runs on {host_name()}, "
            f"which has no working state at {copies.db_dir}: restore from a checkpoint"
        )
    sync_ms = compact_ms = 0.0
    store = RocksDBStore(copies.db_dir, ctx.key_groups(subtask), compactions=plan.compactions)
    try:
        progress = read_progress(store)
        expected = {"attempt": ctx.attempt, "epoch": plan.previous_epoch}
        if progress is None or {k: progress.get(k) for k in expected} != expected:
            raise SubtaskStateError(
                f"subtask {subtask} of stage {op.uid!r} of {ctx.job.name} on {host_name()}: "
                f"working state is at {progress}, expected {expected}; restore from a checkpoint"
            )
        operator = ProcessOperator(op, ctx.job.max_parallelism)
        result = operator.apply(store, table, plan.watermarks.get(op.uid), plan.processing_time)
        write_progress(result.txn, store, ctx.attempt, plan.epoch)  # one write batch with the
        result.txn.commit()  # stage's writes
        kill_point("batch-applied")
        output = result.output
        for sink in ctx.job.sinks_of(op):
            stage_output(plan, stage, subtask, sink.name, output)
        if bad.num_rows and ctx.job.bad_records == "dead_letter":
            stage_output(plan, stage, subtask, DEAD_LETTER_SINK, dead_letters(bad))
        if plan.checkpoint_id is not None:
            if subtask in plan.compact:  # at the barrier, so this snapshot holds the result
                started = time.perf_counter()
                store.compact()
                compact_ms = (time.perf_counter() - started) * 1000
            started = time.perf_counter()
            snapshotter = SubtaskSnapshotter(
                open_storage(ctx.checkpoint_root),
                copies,
                ctx.job.name,
                op.uid,
                subtask,
                incremental=ctx.job.checkpoint.incremental,
                local_recovery=ctx.job.checkpoint.local_recovery,
                codec=ctx.job.checkpoint.snapshot_compression,
                executor=upload_executor(),
            )
            cid, uid = plan.checkpoint_id, op.uid
            future = snapshotter.snapshot(store, cid, plan.base_handles.get((uid, subtask)))
            future.add_done_callback(lambda f: _send_ack(ctx, cid, uid, subtask, f))
            sync_ms = (time.perf_counter() - started) * 1000
            kill_point("snapshot-taken")
        release = store.close_after_compactions()  # the next task's open waits for them
        if release is not None and not os.environ.get(REUSED_WORKER):
            release.join()  # the worker exits with its task: they would die with it
    finally:
        store.close()  # on a failure: at once (a closed store's close does nothing)
    from_sources = _from(table, sources, len(op.inputs))
    read = pa.concat_tables([from_sources, bad]) if bad.num_rows else from_sources
    stats = SubtaskStats(
        stage=op.uid,
        subtask=subtask,
        host=host_name(),
        records=table.num_rows,
        source_records=from_sources.num_rows,
        output_rows=output.num_rows,
        positions=_positions(read),
        sync_ms=sync_ms,
        compact_ms=compact_ms,
        late_records=result.late_records,
        max_event_time=result.max_event_time,
        event_times=result.event_times,
        bad_records=bad.num_rows,
        first_bad=first_bad(bad),
        task_ms=(time.perf_counter() - task_started) * 1000,
    )
    return stats, output


def prepare_slot(
    ctx: RunContext,
    subtask: int,
    handles: dict[str, tuple[SubtaskStateHandle, ...]],
    epoch: int,
) -> list[SubtaskRestoreReport]:
    """The body of a restore's Spark task: set up the working state of subtask ``subtask`` of
    every stage (``handles``: per stage uid, what to restore it from) for a new attempt: the
    stages' subtasks *i* share a host, as Flink's slot sharing puts them in one slot. Returns
    the restore reports; a :class:`~spark_jobs.errors.NonRetryableError` reaches the driver
    typed (``carry_to_driver``)."""
    reports = []
    with carry_to_driver():
        for uid, h in handles.items():
            with naming_the_subtask(uid, subtask, ctx.copies(uid, subtask)):
                reports.append(prepare_subtask(ctx, uid, subtask, h, epoch))
    return reports


def prepare_subtask(
    ctx: RunContext,
    uid: str,
    subtask: int,
    handles: tuple[SubtaskStateHandle, ...],
    epoch: int,
) -> SubtaskRestoreReport:
    """Set up subtask ``subtask`` of stage ``uid``'s working state for a new attempt.

    ``handles``: its own handle at the checkpoint's parallelism, or (rescaled) the handles of
    every old subtask whose key groups overlap its own (state/rescale.py), or none: it starts
    empty. Either way the state is then marked as belonging to this attempt at ``epoch``.
    Handles that do not cover its key groups raise :class:`IncompatibleStateError` (a restart
    cannot fix it); positive evidence against the checkpoint is reported (``corrupt``), not
    raised.
    """
    import shutil

    from state.rescale import RescaleError, restore_rescaled
    from state.restore import ChecksumMismatchError, restore_subtask
    from state.rocksdb_store import RocksDBStore

    copies = ctx.copies(uid, subtask)
    copies.drop_older_working_dirs()
    shutil.rmtree(copies.db_dir, ignore_errors=True)
    report = SubtaskRestoreReport(uid, subtask, host_name(), "empty")
    key_groups = ctx.key_groups(subtask)
    rescaled = bool(handles) and (len(handles) > 1 or handles[0].key_group_range != key_groups)
    if handles:
        storage, layout = open_storage(ctx.checkpoint_root), JobLayout(ctx.job.name)
        local = ctx.job.checkpoint.local_recovery
        try:
            if rescaled:
                r = restore_rescaled(
                    handles,
                    subtask,
                    key_groups,
                    storage,
                    layout,
                    copies.db_dir,
                    lambda old: ctx.copies(uid, old) if local else None,
                )
            else:
                r = restore_subtask(
                    handles[0], storage, layout, copies.db_dir, copies if local else None
                )
        except RescaleError as e:
            raise IncompatibleStateError(
                f"checkpoint {handles[0].checkpoint_id}, stage {uid!r}, subtask {subtask} of "
                f"parallelism {ctx.job.parallelism}: {e}"
            ) from None
        except (ChecksumMismatchError, MissingFileError, CorruptFileError) as e:
            # positive evidence against the checkpoint: the driver marks it CORRUPT, falls back
            return replace(report, corrupt=f"{type(e).__name__}: {e}")
        report = replace(
            report,
            source=r.source,
            bytes_local=r.bytes_local,
            bytes_remote=r.bytes_remote,
            files_local=r.files_local,
            files_remote=r.files_remote,
            fallbacks=tuple(r.fallbacks),
            duration_ms=r.duration_s * 1000,
        )
        if rescaled and len(r.restores) > 1:
            joined = "files" if r.merged_by_files else f"keys: {r.copy_reason}"
            report = replace(report, joined=joined)
    with RocksDBStore(copies.db_dir, key_groups, compactions=False) as store:
        txn = store.begin()
        if rescaled:  # the old subtasks' progress markers, each at its first key group
            stale = [kg for kg in key_groups if kg != key_groups.start]
            txn.delete(PROGRESS, stale, [b"p"] * len(stale))
        write_progress(txn, store, ctx.attempt, epoch)
        txn.commit()
    kill_point("subtask-restored")
    return report
