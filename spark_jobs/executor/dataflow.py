"""One micro-batch through the job's chain of keyed stages, as one Spark job.

The map side (:func:`split_by_subtask`, in ``mapInArrow``, or the sources' readers themselves when
they route at the read, spark_jobs/sources/frames.py) cuts each source partition's records into
one Arrow IPC chunk per subtask of the first stage; after the shuffle, partition *i* is
subtask *i*, pinned to its slot's host (placement.py). A subtask of a stage that feeds another
cuts its output rows the same way by the next stage's key (key groups computed as Spark SQL's
``hash`` does, state/keygroups.py), and the next shuffle takes them to that stage's subtasks on
the same hosts: subtask *i* of every stage shares slot *i*, as in Flink's slot sharing. Every
task passes on the statistics of the subtasks before it, so the driver collects all stages'
statistics from the last stage in one ``collect``.

A re-keyed record carries the upstream subtask as ``_partition`` and its row number as
``_next_offset``: the next stage reads its records in that order, the same on every replay.

A stage later in the chain may read sources, and earlier stages' outputs, besides the stage
before it. Their records travel as :class:`Forwarded` chunks: routed at the map side (or by the
producing stage) by the reading stage's key, they stay in the partition of the subtask that
reads them, passed through by the stages between, and the reading stage applies them in the
same micro-batch as its upstream records, so both inputs are cut at the same barrier.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from cutline.job import JobDefinition, Operator
from cutline.keyed_process import SOURCE_COLUMN, key_columns
from cutline.routing import (
    CHUNKS_DDL,
    KEY_COLUMN,
    KEY_GROUP_COLUMN,
    SUBTASK_COLUMN,
    chunk_rows,
    is_runtime_column,
    read_chunks,
    rekey,
    sort_in_log_order,
)
from cutline.sources.base import NEXT_OFFSET_COLUMN, PARTITION_COLUMN
from spark_jobs.driver.placement import pin_to_anchor, subtask_partition
from spark_jobs.errors import ConfigurationError, carry_to_driver
from spark_jobs.executor.reports import SubtaskStats
from spark_jobs.executor.subtask import BatchPlan, naming_the_subtask, run_subtask
from state.keygroups import key_types_of, spark_key_group_sql

_KEY_ARROW_TYPES = {
    "string": pa.string(),
    "binary": pa.binary(),
    "int": pa.int32(),
    "bigint": pa.int64(),
}


class Forwarded(NamedTuple):
    """Records for stage ``stage``, beyond the next one: from the map side (``origin`` empty:
    sources that stage reads) or from the output of the stage named ``origin``."""

    stage: int
    chunk: bytes
    origin: str = ""


def execute(df, plan: BatchPlan, anchor, *, routed_at_read: bool = False) -> list[SubtaskStats]:
    """Run one micro-batch of ``df`` through every stage; returns every subtask's statistics,
    all stages'. ``df``: every source's tagged records, or, ``routed_at_read``, the chunks their
    readers cut (``CHUNKS_DDL``; ``plan.schema`` then set by the driver)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    job = plan.ctx.job
    p = job.parallelism
    if routed_at_read:
        routed = chunk_items(df)
    else:
        keyed, routed = map_side(df, job)
        plan = replace(plan, schema=to_arrow_schema(keyed.schema))
    for stage in range(len(job.stages)):
        routed = pin_to_anchor(routed.partitionBy(p, subtask_partition), anchor)
        routed = routed.mapPartitionsWithIndex(
            lambda i, items, stage=stage: run_stage(plan, stage, i, items)
        )
    return routed.collect()


def map_side(df, job: JobDefinition):
    """A micro-batch's map side: ``df`` with each record's key group and first subtask
    (:func:`keyed_records`), and the RDD of its chunks (``(subtask, chunk)`` items,
    :func:`split_by_subtask`'s cuts) for the subtask shuffle."""
    keyed = keyed_records(df, job)
    return keyed, chunk_items(keyed.mapInArrow(split_by_subtask, CHUNKS_DDL))


def keyed_records(df, job: JobDefinition):
    """``df`` (tagged records) with each record's key group (Spark SQL's ``hash``) and the
    subtask of its reading stage that owns it."""
    from pyspark.sql import functions as F

    p, m = job.parallelism, job.max_parallelism
    keyed = df.withColumn(KEY_GROUP_COLUMN, F.expr(spark_key_group_sql(KEY_COLUMN, m)))
    return keyed.withColumn(
        SUBTASK_COLUMN, F.expr(f"CAST({KEY_GROUP_COLUMN} * {p} DIV {m} AS INT)")
    )


def chunk_items(chunks):
    """The subtask shuffle's items (``(subtask, chunk)``) of a DataFrame of map-side chunks
    (``CHUNKS_DDL``: :func:`split_by_subtask`'s, or the readers' when they route). The chunks
    leave the JVM as Arrow record batches: ``DataFrame.rdd`` pickled each row, megabytes of
    chunk, through the JVM's pickler (0.3 s more for two chunks of 10 MB, measured alone)."""
    from pyspark.rdd import RDD
    from pyspark.serializers import NoOpSerializer
    from pyspark.sql.pandas.types import to_arrow_schema

    spark = chunks.sparkSession
    large = spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"
    schema = to_arrow_schema(chunks.schema, prefers_large_types=large)  # as the JVM writes them
    batches = RDD(chunks._jdf.toArrowBatchRdd().toJavaRDD(), spark.sparkContext, NoOpSerializer())
    return batches.flatMap(lambda message: _routed(message, schema))


def _routed(message: bytes, schema: pa.Schema) -> list[tuple]:
    """One Arrow record batch of map-side chunks as shuffle items: the first stage's records,
    or forwarded ones."""
    rows = pa.ipc.read_record_batch(pa.py_buffer(message), schema).to_pydict()
    return [
        (subtask, chunk if stage == 0 else Forwarded(stage, chunk))
        for subtask, stage, chunk in zip(rows["subtask"], rows["stage"], rows["chunk"], strict=True)
    ]


def run_stage(plan: BatchPlan, stage: int, subtask: int, items: Iterable) -> Iterator:
    """The task of subtask ``subtask`` of stage ``stage``. ``items`` are ``(subtask, value)``
    pairs: an Arrow IPC chunk of records, a :class:`Forwarded` chunk, the
    :class:`SubtaskStats` of an upstream subtask, or the anchor's ``None``. Yields the
    statistics (the last stage) or ``(subtask, value)`` pairs for the next stage: the record
    chunks of the stages after it, forwarded chunks passed through, and the statistics so far.
    A :class:`~spark_jobs.errors.NonRetryableError` reaches the driver typed
    (``carry_to_driver``)."""
    with carry_to_driver():
        job = plan.ctx.job
        chunks, forwarded, passed, later = [], [], [], []
        for _, value in items:
            if isinstance(value, SubtaskStats):
                passed.append(value)
            elif isinstance(value, Forwarded):
                (forwarded if value.stage == stage else later).append(value)
            elif value is not None:
                chunks.append(value)
        schema = plan.schema if stage == 0 else empty_input(job.stages[stage]).schema
        table = read_chunks(chunks, schema)
        if forwarded:
            table = stage_input(table, forwarded, plan.source_columns)
        uid = job.stages[stage].uid
        with naming_the_subtask(uid, subtask, plan.ctx.copies(uid, subtask)):
            stats, output = run_subtask(plan, stage, subtask, table)
        passed.append(stats)
        if stage == len(job.stages) - 1:
            yield from passed
            return
        yield from ((subtask, s) for s in passed)
        yield from ((subtask, f) for f in later)
        origin = job.stages[stage].name
        for reader in job.readers_of(stage):
            for target, chunk in rekey(output, job, reader, subtask, producer=stage):
                item = chunk if reader == stage + 1 else Forwarded(reader, chunk, origin)
                yield target, item


def stage_input(
    upstream: pa.Table, forwarded: list[Forwarded], source_columns: Mapping[str, tuple[str, ...]]
) -> pa.Table:
    """A stage's records: the stage before it's (``upstream``) and the forwarded ones, each
    input with its own columns (a source's as its transforms left them, without the other
    sources' that the map side's union carries), in log order."""
    tables = [upstream] if upstream.num_rows else []
    for origin in sorted({f.origin for f in forwarded}):
        part = read_chunks([f.chunk for f in forwarded if f.origin == origin], None)
        if origin:  # an earlier stage's output
            tables.append(part)
            continue
        names = part.column(SOURCE_COLUMN)
        for name in pc.unique(names).to_pylist():
            rows = part.filter(pc.equal(names, name))
            keep = set(source_columns.get(name, rows.column_names))
            tables.append(
                rows.select([c for c in rows.column_names if c in keep or is_runtime_column(c)])
            )
    if not tables:
        return upstream
    try:
        return sort_in_log_order(pa.concat_tables(tables, promote_options="permissive"))
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise ConfigurationError(
            f"the inputs of a stage have a column of the same name with different types: {e}"
        ) from e


def empty_input(spec: Operator) -> pa.Table:
    """No records for a later stage: its key column(s) and the routing columns."""
    columns = key_columns(spec.key_column)
    types = [_KEY_ARROW_TYPES[t] for t in key_types_of(spec.key_type)]
    fields = list(zip(columns, types, strict=True))
    key_type = types[0] if isinstance(spec.key_column, str) else pa.struct(fields)
    return pa.schema(
        [
            *fields,
            (KEY_COLUMN, key_type),
            (SOURCE_COLUMN, pa.string()),
            (PARTITION_COLUMN, pa.int32()),
            (NEXT_OFFSET_COLUMN, pa.int64()),
            (KEY_GROUP_COLUMN, pa.int32()),
        ]
    ).empty_table()


def split_by_subtask(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The mapInArrow body of a micro-batch's map side: this partition's records, cut into one
    Arrow IPC stream per reading stage and subtask (``CHUNKS_DDL``), ready for the subtask
    shuffle."""
    batches = [b for b in batches if b.num_rows]
    if batches:
        yield chunk_rows(pa.Table.from_batches(batches))
