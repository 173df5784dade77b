"""How each kind of source is read: one protocol (:class:`SourceReader`), one implementation per
kind, each chosen by its source definition (``LogSource.reader()``, ``KafkaSource.reader()``).

Every reader gives each record its partition and the position after it (``_partition``,
``_next_offset``) and the bad-record columns (``_bad_reason``, ``_bad_raw``, ``_bad_offset``),
set on a record that is not a JSON object of the source's schema or has a null in a key column
(``key``: the columns the reader can check; a key a transform makes is checked later).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from cutline.job import KafkaSource, LogSource
from spark_jobs.sources.local_log import (
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

PartitionPositions = dict[str, int]  # partition -> position of the next record


def source_ddl(source: LogSource | KafkaSource) -> str:
    """The schema of a source's records as the runtime reads them."""
    return f"{source.schema}, {POSITION_DDL}, {BAD_DDL}"


class SourceReader(Protocol):
    def partitions(self, log_root: str) -> tuple[list[int], int]:
        """The source's partitions, and the position that means "from the beginning"."""

    def stream(self, spark, key: tuple[str, ...], log_root: str, start: PartitionPositions) -> Any:
        """A streaming DataFrame from ``start``; a micro-batch reads at most the source's
        ``max_records_per_partition`` per partition."""

    def batch(
        self,
        spark,
        key: tuple[str, ...],
        log_root: str,
        start: PartitionPositions,
        end: PartitionPositions,
    ) -> Any:
        """The records from ``start`` up to ``end`` of the partitions in both, as a batch."""


class LogReader:
    """The replayable local log, through its Python data source (spark_jobs/sources/local_log.py),
    which checks the key's columns itself."""

    def __init__(self, source: LogSource) -> None:
        self.source = source

    def partitions(self, log_root: str) -> tuple[list[int], int]:
        parts = topic_partitions(log_root, self.source.topic)
        if not parts:
            raise ValueError(
                f"source {self.source.name!r}: no partitions under {log_root}/{self.source.topic}"
            )
        return parts, 0

    def stream(self, spark, key: tuple[str, ...], log_root: str, start: PartitionPositions) -> Any:
        limit = str(self.source.max_records_per_partition)
        reader = self._reader(spark, spark.readStream, key, log_root, start)
        return reader.option("maxRecordsPerPartition", limit).load()

    def batch(
        self,
        spark,
        key: tuple[str, ...],
        log_root: str,
        start: PartitionPositions,
        end: PartitionPositions,
    ) -> Any:
        reader = self._reader(spark, spark.read, key, log_root, start)
        return reader.option("endingOffsets", json.dumps(end)).load()

    def _reader(
        self, spark, reader, key: tuple[str, ...], log_root: str, start: PartitionPositions
    ):
        register_data_source(spark)
        return (
            reader.format("cutline_log")
            .schema(source_ddl(self.source))
            .option("path", log_root)
            .option("topic", self.source.topic)
            .option("partitions", json.dumps(sorted(int(p) for p in start)))
            .option("startingOffsets", json.dumps(start))
            .option("keyColumn", ",".join(key))
        )


class KafkaReader:
    """A Kafka topic of JSON records through Spark's Kafka connector; positions are offsets."""

    def __init__(self, source: KafkaSource) -> None:
        self.source = source

    def partitions(self, log_root: str) -> tuple[list[int], int]:
        return list(range(self.source.partitions)), -2  # Kafka's "earliest"

    def stream(self, spark, key: tuple[str, ...], log_root: str, start: PartitionPositions) -> Any:
        limit = self.source.max_records_per_partition * self.source.partitions
        reader = self._reader(spark.readStream, start)
        reader = reader.option("maxOffsetsPerTrigger", str(limit))
        return self._records(reader.load(), key)

    def batch(
        self,
        spark,
        key: tuple[str, ...],
        log_root: str,
        start: PartitionPositions,
        end: PartitionPositions,
    ) -> Any:
        reader = self._reader(spark.read, start)
        reader = reader.option("endingOffsets", json.dumps({self.source.topic: end}))
        return self._records(reader.load(), key)

    def _reader(self, reader, start: PartitionPositions):
        reader = (
            reader.format("kafka")
            .option("kafka.bootstrap.servers", self.source.servers())
            .option("subscribe", self.source.topic)
            .option("startingOffsets", json.dumps({self.source.topic: start}))
            .option("failOnDataLoss", "true")
        )
        for key, value in self.source.options.items():  # the consumer's own properties
            reader = reader.option(key, value)
        return reader

    def _records(self, raw, key: tuple[str, ...]):
        """The JSON records with the log's position and bad-record columns: a record is bad
        when it does not parse as a JSON object of the schema or a key column is null."""
        from pyspark.sql import functions as F

        value = F.col("value").cast("string")
        parsed = raw.select(
            F.from_json(value, self.source.schema).alias("_v"),
            value.alias(BAD_RAW),
            F.col("partition").alias(PARTITION_COLUMN),
            (F.col("offset") + 1).alias(NEXT_OFFSET_COLUMN),
            F.col("offset").alias(BAD_OFFSET),
        )
        reason = F.when(F.col("_v").isNull(), F.lit("not a JSON object of the source's schema"))
        for column in key:
            reason = reason.when(F.col(f"_v.{column}").isNull(), F.lit(f"null key {column!r}"))
        reason = reason.otherwise(F.lit(None).cast("string"))
        return parsed.select(
            "_v.*",
            PARTITION_COLUMN,
            NEXT_OFFSET_COLUMN,
            reason.alias(BAD_REASON),
            F.when(reason.isNotNull(), F.col(BAD_RAW)).alias(BAD_RAW),
            F.when(reason.isNotNull(), F.col(BAD_OFFSET)).alias(BAD_OFFSET),
        )
