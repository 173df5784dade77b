"""What runs inside a Spark task: one subtask of the keyed operator for one micro-batch.

Spark partition *i* of the repartitioned micro-batch is exactly subtask *i*. The task opens the
subtask's working RocksDB on the executor's local disk, checks that it holds the state the driver
expects (right attempt, previous micro-batch applied), applies the batch and records its progress
in the same write batch, stages the sink output, and at a barrier takes the synchronous snapshot
and leaves the upload to a background thread, whose ack (or decline) lands in durable storage for
the driver's coordinator. It returns one small statistics row.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from spark_jobs.job import JobDefinition
from spark_jobs.local_log import NEXT_OFFSET_COLUMN, PARTITION_COLUMN
from spark_jobs.operators import SOURCE_COLUMN, drop_markers, make_operator
from state.handles import SubtaskStateHandle
from state.keygroups import key_group_range
from state.local_copies import LocalCopies
from state.paths import JobLayout
from state.storage import open_storage

if TYPE_CHECKING:
    from state.rocksdb_store import RocksDBStore

# rocksdict is imported inside the task functions only: the driver never opens state, and
# rocksdict loaded beside deltalake's runtime aborts the interpreter at exit.

MARKER_COLUMN = "_marker"
SUBTASK_COLUMN = "_subtask"
KEY_COLUMN = "_key"
PROGRESS = "__progress__"
STATS_SCHEMA = (
    "subtask int, host string, records long, output_rows long, positions string, "
    "sync_ms double, compact_ms double, late_records long, max_event_time long"
)
_STATS_ARROW = pa.schema(
    [
        ("subtask", pa.int32()),
        ("host", pa.string()),
        ("records", pa.int64()),
        ("output_rows", pa.int64()),
        ("positions", pa.string()),
        ("sync_ms", pa.float64()),
        ("compact_ms", pa.float64()),
        ("late_records", pa.int64()),
        ("max_event_time", pa.int64()),
    ]
)


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

    def copies(self, subtask: int) -> LocalCopies:
        return LocalCopies(self.local_state_root, self.job.name, self.job.operator.name, subtask)

    def key_groups(self, subtask: int):
        return key_group_range(subtask, self.job.parallelism, self.job.max_parallelism)


@dataclass(frozen=True)
class BatchPlan:
    ctx: RunContext
    epoch: int
    previous_epoch: int
    checkpoint_id: int | None = None
    base_handles: dict[int, SubtaskStateHandle | None] = field(default_factory=dict)
    confirmed_checkpoint: int | None = None
    watermark: int | None = None
    compact: frozenset[int] = frozenset()  # subtasks that compact RocksDB before the snapshot


def ack_path(job_id: str, checkpoint_id: int, operator: str, subtask: int) -> str:
    return JobLayout(job_id).job_path(
        f"_acks/chk-{int(checkpoint_id)}/{operator}-{int(subtask)}.json"
    )


def staging_dir(staging_root: str, job_id: str, sink: str, epoch: int) -> Path:
    return Path(staging_root) / job_id / sink / f"epoch={int(epoch)}"


def read_progress(store: RocksDBStore) -> dict | None:
    start = store.key_group_range.start
    raw = store.get_many(PROGRESS, [start], [b"p"])[0]
    return json.loads(raw) if raw else None


def write_progress(txn, store: RocksDBStore, attempt: int, epoch: int) -> None:
    payload = json.dumps({"attempt": attempt, "epoch": epoch, "host": socket.gethostname()})
    txn.put(PROGRESS, [store.key_group_range.start], [b"p"], [payload.encode()])


def _positions(table: pa.Table) -> dict[str, dict[str, int]]:
    """Per source and partition, the position after the last record of this batch."""
    if table.num_rows == 0:
        return {}
    grouped = table.group_by([SOURCE_COLUMN, PARTITION_COLUMN]).aggregate(
        [(NEXT_OFFSET_COLUMN, "max")]
    )
    out: dict[str, dict[str, int]] = {}
    for src, part, end in zip(
        grouped.column(SOURCE_COLUMN).to_pylist(),
        grouped.column(PARTITION_COLUMN).to_pylist(),
        grouped.column(f"{NEXT_OFFSET_COLUMN}_max").to_pylist(),
        strict=True,
    ):
        out.setdefault(src, {})[str(part)] = int(end)
    return out


def _stage_output(plan: BatchPlan, subtask: int, output: pa.Table) -> None:
    import pyarrow.parquet as pq

    if output.num_rows == 0:
        return
    ctx = plan.ctx
    output = output.select([c for c in output.column_names if not c.startswith("_")])
    output = output.append_column("_epoch", pa.array([plan.epoch] * output.num_rows, pa.int64()))
    directory = staging_dir(ctx.staging_root, ctx.job.name, ctx.job.sink.name, plan.epoch)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"part-{subtask:05d}-a{ctx.attempt}.parquet"
    tmp = directory / f".tmp-{uuid.uuid4().hex}"
    pq.write_table(output, tmp)
    os.replace(tmp, final)


class _DelayedExecutor:
    """Fault injection (``CUTLINE_FAULT_UPLOAD_DELAY_S``): the asynchronous part of every snapshot
    starts late, so tests can kill a driver while uploads are in flight."""

    def __init__(self, delay_s: float) -> None:
        from state.snapshot import default_executor

        self.delay_s = delay_s
        self.inner = default_executor()

    def submit(self, fn, *args, **kwargs):
        def delayed():
            time.sleep(self.delay_s)
            return fn(*args, **kwargs)

        return self.inner.submit(delayed)


def _snapshot_executor():
    delay = float(os.environ.get("CUTLINE_FAULT_UPLOAD_DELAY_S", "0") or 0)
    return _DelayedExecutor(delay) if delay > 0 else None


def _send_ack(storage_url: str, path: str, future) -> None:
    storage = open_storage(storage_url)
    error = future.exception()
    doc = {"declined": repr(error)} if error else {"handle": future.result().to_dict()}
    storage.put_bytes(path, json.dumps(doc).encode())


def run_subtask(plan: BatchPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The mapInArrow body for one partition (= one subtask) of one micro-batch."""
    from pyspark import TaskContext

    from state.rocksdb_store import RocksDBStore
    from state.snapshot import SubtaskSnapshotter

    subtask = TaskContext.get().partitionId()
    ctx = plan.ctx
    op = ctx.job.operator
    batches = list(batches)
    table = drop_markers(pa.Table.from_batches(batches), MARKER_COLUMN)
    copies = ctx.copies(subtask)
    if plan.confirmed_checkpoint is not None:
        copies.confirm(plan.confirmed_checkpoint)
    if not copies.db_dir.is_dir():
        raise SubtaskStateError(
            f"subtask {subtask} of {ctx.job.name} runs on {socket.gethostname()}, which has no "
            f"working state at {copies.db_dir}: restore from a checkpoint"
        )
    sync_ms = compact_ms = 0.0
    store = RocksDBStore(copies.db_dir, ctx.key_groups(subtask))
    try:
        progress = read_progress(store)
        expected = {"attempt": ctx.attempt, "epoch": plan.previous_epoch}
        if progress is None or {k: progress.get(k) for k in expected} != expected:
            raise SubtaskStateError(
                f"subtask {subtask} of {ctx.job.name} on {socket.gethostname()}: working state is "
                f"at {progress}, expected {expected}; restore from a checkpoint"
            )
        result = make_operator(op).apply(store, table, plan.watermark)
        txn = store.begin()
        write_progress(txn, store, ctx.attempt, plan.epoch)
        txn.commit()
        output = result.output
        _stage_output(plan, subtask, output)
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
                op.name,
                subtask,
                incremental=ctx.job.checkpoint.incremental,
                local_recovery=ctx.job.checkpoint.local_recovery,
                executor=_snapshot_executor(),
            )
            future = snapshotter.snapshot(store, plan.checkpoint_id, plan.base_handles.get(subtask))
            path = ack_path(ctx.job.name, plan.checkpoint_id, op.name, subtask)
            future.add_done_callback(lambda f: _send_ack(ctx.checkpoint_root, path, f))
            sync_ms = (time.perf_counter() - started) * 1000
    finally:
        store.close()
    yield pa.RecordBatch.from_pylist(
        schema=_STATS_ARROW,
        mapping=[
            {
                "subtask": subtask,
                "host": socket.gethostname(),
                "records": table.num_rows,
                "output_rows": output.num_rows,
                "positions": json.dumps(_positions(table)),
                "sync_ms": sync_ms,
                "compact_ms": compact_ms,
                "late_records": result.late_records,
                "max_event_time": result.max_event_time,
            }
        ],
    )


def prepare_subtask(
    ctx: RunContext, subtask: int, handle: SubtaskStateHandle | None, epoch: int
) -> dict:
    """Set up subtask ``subtask``'s working state for a new attempt (runs in a Spark task).

    With a handle, restore it local-first; without, start empty. Either way the state is then
    marked as belonging to this attempt at ``epoch``. Returns the restore report as a dict.
    """
    import shutil

    from state.restore import restore_subtask
    from state.rocksdb_store import RocksDBStore

    copies = ctx.copies(subtask)
    report = {"subtask": subtask, "host": socket.gethostname(), "source": "empty"}
    if handle is None:
        shutil.rmtree(copies.root, ignore_errors=True)
    else:
        if handle.key_group_range != ctx.key_groups(subtask):
            raise SubtaskStateError(
                f"checkpoint {handle.checkpoint_id} holds key groups {handle.key_group_range} for "
                f"subtask {subtask}, but the job now assigns {ctx.key_groups(subtask)} "
                "(changing parallelism on restore is not supported yet)"
            )
        r = restore_subtask(
            handle,
            open_storage(ctx.checkpoint_root),
            JobLayout(ctx.job.name),
            copies.db_dir,
            copies if ctx.job.checkpoint.local_recovery else None,
        )
        report.update(
            source=r.source,
            bytes_local=r.bytes_local,
            bytes_remote=r.bytes_remote,
            files_local=r.files_local,
            files_remote=r.files_remote,
            fallbacks=r.fallbacks,
            duration_ms=r.duration_s * 1000,
        )
    with RocksDBStore(copies.db_dir, ctx.key_groups(subtask)) as store:
        txn = store.begin()
        write_progress(txn, store, ctx.attempt, epoch)
        txn.commit()
    return report
