"""A job's inputs as Spark DataFrames: streaming from recorded positions, or one exact range,
each source read by itself (cutline/sources/); then each source's
transforms, and one tagged union of them all, routed at the map side to the stages that read
them.

When every source can (a reader that routes, no transforms, its stage's key among its fields:
:func:`read_routes`), the readers do the map side themselves: the job's input is then the union
of their chunks (``CHUNKS_DDL``) and no record passes through Spark's rows before the subtask
shuffle (:func:`stream_input`, :func:`range_input`, :func:`no_input` give either form).

Every record carries its partition and the position after it (``_partition``,
``_next_offset``: the runtime takes the position at each cut from them) and the bad-record
columns (see spark_jobs/sources/bad_records.py).
"""

from __future__ import annotations

import traceback
from typing import Any

from cutline.errors import UserCodeError
from cutline.job import JobDefinition
from cutline.keyed_process import SOURCE_COLUMN, key_columns
from cutline.routing import CHUNKS_DDL, KEY_COLUMN, STAGE_COLUMN, ReadRoute
from cutline.sources.base import (
    BAD_OFFSET,
    BAD_RAW,
    BAD_REASON,
    NEXT_OFFSET_COLUMN,
    PartitionPositions,
    PositionedSource,
)
from spark_jobs.errors import ConfigurationError

Routes = dict[str, ReadRoute] | None  # per source, when the readers route (read_routes)


def read_routes(spark, job: JobDefinition) -> Routes:
    """Each source's :class:`~cutline.routing.ReadRoute` when every source of ``job`` can route
    its records at the read: a kind whose reader does, no transforms, the reading stage's key
    among the source's own fields. None otherwise: the map side routes the tagged union."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from spark_jobs.executor.dataflow import keyed_records

    names = list(job.source_inputs)
    routable = all(
        isinstance(job.source(n), PositionedSource)
        and job.source(n).routes_at_read
        and not any(t.source == n for t in job.transforms)
        and _raw_key(job, n) == key_columns(job.source_inputs[n])
        for n in names
    )
    if not routable:
        return None
    empty = {n: empty_frame(spark, job, n) for n in names}
    chunks = to_arrow_schema(keyed_records(tag_and_union(job, empty), job).schema)
    return {
        n: ReadRoute(
            source=n,
            stage=job.reader_of(n),
            key=job.source_inputs[n],
            key_type=job.stages[job.reader_of(n)].key_type,
            parallelism=job.parallelism,
            max_parallelism=job.max_parallelism,
            records=to_arrow_schema(_own_fields(empty[n].schema)),
            chunks=chunks,
        )
        for n in names
    }


def _own_fields(schema):
    """A source's own fields of its Spark schema: what its reader parses (the runtime's columns,
    ``_``-prefixed, it adds)."""
    from pyspark.sql.types import StructType

    return StructType([f for f in schema.fields if not f.name.startswith("_")])


def stream_input(spark, job: JobDefinition, start: dict[str, PartitionPositions], routes: Routes):
    """The job's input as a stream from ``start`` (per source; one micro-batch reads at most a
    source's ``max_records_per_partition`` per partition): tagged records, or the readers'
    chunks with ``routes``."""
    frames = {
        name: job.source(name).stream(
            spark, _raw_key(job, name), start[name], *_route(routes, name)
        )
        for name in job.source_inputs
    }
    return _union(job, frames, routes)


def range_input(
    spark,
    job: JobDefinition,
    start: dict[str, PartitionPositions],
    end: dict[str, PartitionPositions],
    routes: Routes,
):
    """The records of every source from ``start`` up to ``end``, as a batch: exactly what one
    micro-batch that ran from ``start`` to ``end`` read (tagged, or chunks with ``routes``)."""
    frames = {
        name: range_frame(spark, job, name, start[name], end[name], routes)
        for name in job.source_inputs
    }
    return _union(job, frames, routes)


def no_input(spark, job: JobDefinition, routes: Routes):
    """A micro-batch's input with no records (tagged, or chunks with ``routes``)."""
    if routes is not None:
        return _no_chunks(spark)
    return tag_and_union(job, {n: empty_frame(spark, job, n) for n in job.source_inputs})


def _no_chunks(spark):
    """The readers' chunks when there are no records."""
    return spark.createDataFrame([], CHUNKS_DDL)


def _route(routes: Routes, name: str) -> tuple[ReadRoute, ...]:
    return () if routes is None else (routes[name],)


def _union(job: JobDefinition, frames: dict[str, Any], routes: Routes):
    if routes is None:
        return tag_and_union(job, frames)
    union, *rest = frames.values()
    for df in rest:
        union = union.union(df)
    return union


def range_frame(
    spark,
    job: JobDefinition,
    name: str,
    start: PartitionPositions,
    end: PartitionPositions,
    routes: Routes = None,
):
    """The records of source ``name`` from ``start`` up to ``end``, as a batch: exactly what
    one micro-batch that ran from ``start`` to ``end`` read. A partition ``start`` does not
    name (a file that appeared in that micro-batch) is read from its beginning. With
    ``routes``: its reader's chunks."""
    source = job.source(name)
    begin = {p: start.get(p, source.beginning) for p in end}
    moved = [p for p, position in end.items() if position != begin[p]]
    if not moved:
        if routes is not None:
            return _no_chunks(spark)
        return empty_frame(spark, job, name)
    begin, end = {p: begin[p] for p in moved}, {p: end[p] for p in moved}
    return source.batch(spark, _raw_key(job, name), begin, end, *_route(routes, name))


def _raw_key(job: JobDefinition, name: str) -> tuple[str, ...]:
    """The key columns a source's reader checks for nulls (a null key is a bad record, with its
    raw line and offset): the first stage's key for it, if the source's schema has all its
    columns; none otherwise (a key a transform makes is checked after the transforms)."""
    columns = key_columns(job.source_inputs[name])
    fields = schema_fields(job.source(name).schema)
    return columns if all(c in fields for c in columns) else ()


def schema_fields(ddl: str) -> list[str]:
    """The top-level field names of a Spark DDL schema string."""
    names, depth, start = [], 0, 0
    for i, ch in enumerate(ddl + ","):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            field = ddl[start:i].strip()
            if field.startswith("`"):
                names.append(field[1:].split("`")[0])
            elif field:
                names.append(field.split()[0])
            start = i + 1
    return names


def empty_frame(spark, job: JobDefinition, name: str):
    """No records of source ``name`` (a micro-batch with no input)."""
    return spark.createDataFrame([], job.source(name).ddl())


def tag_and_union(job: JobDefinition, frames: dict[str, Any]):
    """One DataFrame of every source's records, each through its transforms, tagged with the
    source's name, the index of the stage that reads it and the record's key for that stage."""
    from pyspark.sql import functions as F

    tagged = []
    for name, df in frames.items():
        key, stage = job.source_inputs[name], job.reader_of(name)
        df = _transformed(job, name, df)
        missing = [c for c in key_columns(key) if c not in df.columns]
        if missing:
            raise ConfigurationError(
                f"stage {job.stages[stage].name!r} is keyed by {key!r}, but source {name!r} "
                f"(after its transforms) has no {missing}: its columns are {df.columns}"
            )
        # a composite key routes as Spark's hash(struct(...)), which is hash(a, b, ...)
        value = F.col(key) if isinstance(key, str) else F.struct(*key)
        tagged.append(
            df.withColumn(SOURCE_COLUMN, F.lit(name))
            .withColumn(STAGE_COLUMN, F.lit(stage).cast("int"))
            .withColumn(KEY_COLUMN, value)
        )
    union = tagged[0]
    for df in tagged[1:]:
        union = union.unionByName(df, allowMissingColumns=True)
    return union


def source_columns(spark, job: JobDefinition) -> dict[str, tuple[str, ...]]:
    """The columns of each source a later stage reads, after its transforms: that stage keeps
    them of the map side's union, which carries every source's."""
    return {
        name: tuple(_transformed(job, name, empty_frame(spark, job, name)).columns)
        for name in job.source_inputs
        if job.reader_of(name) > 0
    }


def _transformed(job: JobDefinition, name: str, df):
    """Source ``name``'s well-formed records through its transforms, in order, then its bad
    records as they came (only the runtime's columns: the bad-record policy needs no others). A
    key a transform made null marks the record bad."""
    from pyspark.sql import functions as F

    transforms = [t for t in job.transforms if t.source == name]
    if not transforms:
        return df
    system = [c for c in df.columns if c.startswith("_")]
    bad = F.col(BAD_REASON).isNotNull()
    good = df.where(~bad)
    for t in transforms:
        try:
            good = t.function(good)
        except Exception as e:
            raise UserCodeError(
                f"transform {t.name!r} of source {name!r} raised {type(e).__name__}: {e}\n"
                + "".join(traceback.format_exception(e))
            ) from e
        columns = getattr(good, "columns", None)
        if columns is None:
            raise UserCodeError(
                f"transform {t.name!r} of source {name!r} returned {type(good).__name__}, "
                "not a DataFrame"
            )
        dropped = [c for c in system if c not in columns]
        if dropped:
            raise ConfigurationError(
                f"transform {t.name!r} of source {name!r} dropped the runtime's columns "
                f"{dropped}: keep the columns whose names start with '_' (select('*', ...), "
                "withColumn and where keep them)"
            )
    columns = key_columns(job.source_inputs[name])
    if all(c in good.columns for c in columns) and not _raw_key(job, name):
        # the record's own offset is not known here: the position after it stands in
        null = F.lit(False)
        for c in columns:
            null = null | F.col(c).isNull()
        key = job.source_inputs[name]
        reason = f"null key {key!r} after the transforms (offset: the position after the record)"
        good = (
            good.withColumn(BAD_REASON, F.when(null, F.lit(reason)).otherwise(F.col(BAD_REASON)))
            .withColumn(
                BAD_RAW, F.when(null, F.to_json(F.struct(*good.columns))).otherwise(F.col(BAD_RAW))
            )
            .withColumn(
                BAD_OFFSET, F.when(null, F.col(NEXT_OFFSET_COLUMN)).otherwise(F.col(BAD_OFFSET))
            )
        )
    return good.unionByName(df.where(bad).select(system), allowMissingColumns=True)
