"""One micro-batch through the job's chain of keyed stages, as one Spark job.

The map side (:func:`split_by_subtask`, in ``mapInArrow``) cuts each source partition's records
into one Arrow IPC chunk per subtask of the first stage; after the shuffle, partition *i* is
subtask *i*, pinned to its slot's host (placement.py). A subtask of a stage that feeds another
cuts its output rows the same way by the next stage's key (key groups computed as Spark SQL's
``hash`` does, state/keygroups.py), and the next shuffle takes them to that stage's subtasks on
the same hosts: subtask *i* of every stage shares slot *i*, as in Flink's slot sharing. Every
task passes on the statistics of the subtasks before it, so the driver collects all stages'
statistics from the last stage in one ``collect``.

A re-keyed record carries the upstream subtask as ``_partition`` and its row number as
``_next_offset``: the next stage reads its records in that order, the same on every replay.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.job import JobDefinition, Operator
from cutline.keyed_process import SOURCE_COLUMN, Key, key_columns
from spark_jobs.driver.placement import pin_to_anchor, subtask_partition
from spark_jobs.errors import ConfigurationError, carry_to_driver
from spark_jobs.executor.reports import SubtaskStats
from spark_jobs.executor.subtask import (
    KEY_COLUMN,
    KEY_GROUP_COLUMN,
    SUBTASK_COLUMN,
    BatchPlan,
    read_chunks,
    run_subtask,
)
from spark_jobs.sources.local_log import NEXT_OFFSET_COLUMN, PARTITION_COLUMN
from state.keygroups import key_groups, key_types_of, spark_key_group_sql, subtask_for_key_group

CHUNKS_SCHEMA = "subtask int, chunk binary"  # split_by_subtask's output
_KEY_ARROW_TYPES = {
    "string": pa.string(),
    "binary": pa.binary(),
    "int": pa.int32(),
    "bigint": pa.int64(),
}


def execute(df, plan: BatchPlan, anchor) -> list[SubtaskStats]:
    """Run one micro-batch of ``df`` (the first stage's tagged input) through every stage;
    returns every subtask's statistics, all stages'."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema

    job = plan.ctx.job
    p, m = job.parallelism, job.max_parallelism
    keyed = df.withColumn(KEY_GROUP_COLUMN, F.expr(spark_key_group_sql(KEY_COLUMN, m)))
    keyed = keyed.withColumn(
        SUBTASK_COLUMN, F.expr(f"CAST({KEY_GROUP_COLUMN} * {p} DIV {m} AS INT)")
    )
    plan = replace(plan, schema=to_arrow_schema(keyed.schema))
    routed = keyed.mapInArrow(split_by_subtask, CHUNKS_SCHEMA).rdd
    for stage in range(len(job.stages)):
        routed = pin_to_anchor(routed.partitionBy(p, subtask_partition), anchor)
        routed = routed.mapPartitionsWithIndex(
            lambda i, items, stage=stage: run_stage(plan, stage, i, items)
        )
    return routed.collect()


def run_stage(plan: BatchPlan, stage: int, subtask: int, items: Iterable) -> Iterator:
    """The task of subtask ``subtask`` of stage ``stage``. ``items`` are ``(subtask, value)``
    pairs: an Arrow IPC chunk of records, the :class:`SubtaskStats` of an upstream subtask, or
    the anchor's ``None``. Yields the statistics (the last stage) or ``(subtask, value)`` pairs
    for the next stage: its record chunks, and the statistics so far. A
    :class:`~spark_jobs.errors.NonRetryableError` reaches the driver typed (``carry_to_driver``)."""
    with carry_to_driver():
        job = plan.ctx.job
        chunks, passed = [], []
        for _, value in items:
            if isinstance(value, SubtaskStats):
                passed.append(value)
            elif value is not None:
                chunks.append(value)
        schema = plan.schema if stage == 0 else empty_input(job.stages[stage]).schema
        stats, output = run_subtask(plan, stage, subtask, read_chunks(chunks, schema))
        passed.append(stats)
        if stage == len(job.stages) - 1:
            yield from passed
            return
        yield from ((subtask, s) for s in passed)
        yield from rekey(output, job, stage + 1, subtask)


def rekey(output: pa.Table, job: JobDefinition, stage: int, upstream: int) -> list[tuple]:
    """Stage ``stage - 1``'s output rows of subtask ``upstream``, cut into one Arrow IPC chunk
    per subtask of ``stage`` by that stage's key. Output without the key's columns is a
    :class:`~spark_jobs.errors.ConfigurationError` (the job's stages do not fit together)."""
    output = output.select([c for c in output.column_names if not c.startswith("_")])
    if output.num_rows == 0:
        return []
    spec, before = job.stages[stage], job.stages[stage - 1].name
    key = spec.inputs[before]
    missing = [c for c in key_columns(key) if c not in output.column_names]
    if missing:
        raise ConfigurationError(
            f"stage {spec.name!r} is keyed by {key!r}, but the output of stage {before!r} has "
            f"no {missing}: its columns are {output.column_names}"
        )
    p, m = job.parallelism, job.max_parallelism
    keys = key_array(output, key)
    groups = key_groups(keys, spec.key_type, m)
    n = output.num_rows
    table = (
        output.append_column(KEY_COLUMN, keys)
        .append_column(SOURCE_COLUMN, pa.array([before] * n, pa.string()))
        .append_column(PARTITION_COLUMN, pa.array(np.full(n, upstream, np.int32)))
        .append_column(NEXT_OFFSET_COLUMN, pa.array(np.arange(1, n + 1, dtype=np.int64)))
        .append_column(KEY_GROUP_COLUMN, pa.array(groups.astype(np.int32)))
        .append_column(SUBTASK_COLUMN, pa.array(subtask_for_key_group(groups, p, m)))
    )
    return cut_by_subtask(table)


def key_array(table: pa.Table, key: Key) -> pa.Array:
    """``table``'s keys: its key column, or a struct array of a composite key's columns."""
    if isinstance(key, str):
        return table.column(key).combine_chunks()
    return pa.StructArray.from_arrays([table.column(c).combine_chunks() for c in key], list(key))


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


def cut_by_subtask(table: pa.Table) -> list[tuple[int, bytes]]:
    """``table`` (with ``_subtask``) as one Arrow IPC stream per subtask it has records for."""
    table = table.sort_by(SUBTASK_COLUMN).combine_chunks()
    counts = pc.value_counts(table.column(SUBTASK_COLUMN)).flatten()
    out, offset = [], 0
    for subtask, count in zip(counts[0].to_pylist(), counts[1].to_pylist(), strict=True):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table.slice(offset, count))
        out.append((subtask, sink.getvalue().to_pybytes()))
        offset += count
    return out


def split_by_subtask(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The mapInArrow body of a micro-batch's map side: this partition's records, cut into one
    Arrow IPC stream per subtask (``CHUNKS_SCHEMA``), ready for the subtask shuffle."""
    batches = [b for b in batches if b.num_rows]
    if not batches:
        return
    pairs = cut_by_subtask(pa.Table.from_batches(batches))
    yield pa.RecordBatch.from_arrays(
        [pa.array([s for s, _ in pairs], pa.int32()), pa.array([c for _, c in pairs], pa.binary())],
        ["subtask", "chunk"],
    )
