"""A job's inputs as Spark DataFrames: streaming from recorded positions, or one exact range.

Both kinds of source (the local log and Kafka) give every record its partition and the position
after it (``_partition``, ``_next_offset``: the runtime takes the position at each cut from them)
and the bad-record columns (``_bad_reason``, ``_bad_raw``, ``_bad_offset``: set on a record that is
not a JSON object of the source's schema or has a null key; see spark_jobs/bad_records.py).
"""

from __future__ import annotations

import json
from typing import Any

from spark_jobs.job import JobDefinition, KafkaSource, Source
from spark_jobs.local_log import (
    BAD_DDL,
    BAD_OFFSET,
    BAD_RAW,
    BAD_REASON,
    NEXT_OFFSET_COLUMN,
    PARTITION_COLUMN,
    POSITION_DDL,
    register_data_source,
    topic_partitions,
)
from spark_jobs.operators import SOURCE_COLUMN
from spark_jobs.subtask import KEY_COLUMN

Positions = dict[str, int]  # partition -> position of the next record


def source_ddl(source: Source) -> str:
    """The schema of a source's records as the runtime reads them."""
    return f"{source.schema}, {POSITION_DDL}, {BAD_DDL}"


def partitions_of(source: Source, log_root: str) -> tuple[list[int], int]:
    """A source's partitions and the position that means "from the beginning"."""
    if isinstance(source, KafkaSource):
        return list(range(source.partitions)), -2  # Kafka's "earliest"
    parts = topic_partitions(log_root, source.topic)
    if not parts:
        raise ValueError(f"source {source.name!r}: no partitions under {log_root}/{source.topic}")
    return parts, 0


def stream_frame(spark, job: JobDefinition, name: str, log_root: str, start: Positions):
    """Source ``name`` as a stream from ``start`` (one micro-batch reads at most the source's
    ``max_records_per_partition`` per partition)."""
    source = job.source(name)
    limit = source.max_records_per_partition
    if isinstance(source, KafkaSource):
        reader = _kafka(spark.readStream, source, start)
        reader = reader.option("maxOffsetsPerTrigger", str(limit * source.partitions))
        return _kafka_records(reader.load(), source, job.operator.inputs[name])
    reader = _log(spark, spark.readStream, job, name, log_root, start)
    return reader.option("maxRecordsPerPartition", str(limit)).load()


def range_frame(
    spark, job: JobDefinition, name: str, log_root: str, start: Positions, end: Positions
):
    """The records of source ``name`` from ``start`` up to ``end``, as a batch: exactly what
    one micro-batch that ran from ``start`` to ``end`` read."""
    moved = [p for p, position in end.items() if position != start.get(p, position)]
    if not moved:
        return empty_frame(spark, job, name)
    start, end = {p: start[p] for p in moved}, {p: end[p] for p in moved}
    source = job.source(name)
    if isinstance(source, KafkaSource):
        reader = _kafka(spark.read, source, start)
        reader = reader.option("endingOffsets", json.dumps({source.topic: end}))
        return _kafka_records(reader.load(), source, job.operator.inputs[name])
    reader = _log(spark, spark.read, job, name, log_root, start)
    return reader.option("endingOffsets", json.dumps(end)).load()


def _kafka(reader, source: KafkaSource, start: Positions):
    return (
        reader.format("kafka")
        .option("kafka.bootstrap.servers", source.servers())
        .option("subscribe", source.topic)
        .option("startingOffsets", json.dumps({source.topic: start}))
        .option("failOnDataLoss", "true")
    )


def _log(spark, reader, job: JobDefinition, name: str, log_root: str, start: Positions):
    source = job.source(name)
    register_data_source(spark)
    return (
        reader.format("cutline_log")
        .schema(source_ddl(source))
        .option("path", log_root)
        .option("topic", source.topic)
        .option("partitions", json.dumps(sorted(int(p) for p in start)))
        .option("startingOffsets", json.dumps(start))
        .option("keyColumn", job.operator.inputs[name])
    )


def empty_frame(spark, job: JobDefinition, name: str):
    """No records of source ``name`` (a micro-batch with no input)."""
    return spark.createDataFrame([], source_ddl(job.source(name)))


def _kafka_records(raw, source: KafkaSource, key: str):
    """JSON records of a Kafka topic with the log source's position and bad-record columns; a
    record is bad when it does not parse as a JSON object or its key is null."""
    from pyspark.sql import functions as F

    value = F.col("value").cast("string")
    parsed = raw.select(
        F.from_json(value, source.schema).alias("_v"),
        value.alias(BAD_RAW),
        F.col("partition").alias(PARTITION_COLUMN),
        (F.col("offset") + 1).alias(NEXT_OFFSET_COLUMN),
        F.col("offset").alias(BAD_OFFSET),
    )
    reason = (
        F.when(F.col("_v").isNull(), F.lit("not a JSON object of the source's schema"))
        .when(F.col(f"_v.{key}").isNull(), F.lit(f"null key {key!r}"))
        .otherwise(F.lit(None).cast("string"))
    )
    return parsed.select(
        "_v.*",
        PARTITION_COLUMN,
        NEXT_OFFSET_COLUMN,
        reason.alias(BAD_REASON),
        F.when(reason.isNotNull(), F.col(BAD_RAW)).alias(BAD_RAW),
        F.when(reason.isNotNull(), F.col(BAD_OFFSET)).alias(BAD_OFFSET),
    )


def tag_and_union(job: JobDefinition, frames: dict[str, Any]):
    """One DataFrame of all operator inputs, each record tagged with its source and key."""
    from pyspark.sql import functions as F

    tagged = [
        df.withColumn(SOURCE_COLUMN, F.lit(name)).withColumn(
            KEY_COLUMN, F.col(job.operator.inputs[name])
        )
        for name, df in frames.items()
    ]
    union = tagged[0]
    for df in tagged[1:]:
        union = union.unionByName(df, allowMissingColumns=True)
    return union
