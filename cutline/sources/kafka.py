"""A Kafka topic of JSON records, read with Spark's Kafka connector; positions are offsets per
partition."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutline.sources.base import (
    BAD_OFFSET,
    BAD_RAW,
    BAD_REASON,
    NEXT_OFFSET_COLUMN,
    PARTITION_COLUMN,
    PartitionPositions,
    Source,
    SparkDependencies,
)
from cutline.validation import JobDefinitionError, check_name

EARLIEST = -2  # the connector's "earliest" offset
TOKEN_PROVIDER_VERSION = "4.0.0"  # the newest Maven Central has (see token_provider_jar)


@dataclass(frozen=True)
class KafkaSource(Source):
    """Topic ``topic`` of JSON records (``schema``: a Spark DDL string of their fields) with
    ``partitions`` partitions. ``bootstrap_servers`` defaults to ``$CUTLINE_KAFKA_BOOTSTRAP``;
    ``max_records_per_partition`` bounds a micro-batch (``maxOffsetsPerTrigger`` is this times
    ``partitions``). ``options``: Kafka consumer properties, each ``kafka.<property>`` as
    Spark's connector takes them (``kafka.security.protocol``, ``kafka.sasl.mechanism``,
    ``kafka.sasl.jaas.config``, ``kafka.ssl.truststore.location``, ...); read secrets from the
    environment in the job's code, never write them into it (logs mask them either way)."""

    name: str
    topic: str
    schema: str
    partitions: int
    max_records_per_partition: int = 10_000
    bootstrap_servers: str | None = None
    options: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name("source.name", self.name)
        if not self.topic:
            raise JobDefinitionError("source.topic must not be empty")
        if self.partitions < 1:
            raise JobDefinitionError("source.partitions must be >= 1")
        if self.max_records_per_partition < 1:
            raise JobDefinitionError("source.max_records_per_partition must be >= 1")
        for key, value in self.options.items():
            if not isinstance(key, str) or not key.startswith("kafka.") or key == "kafka.":
                raise JobDefinitionError(
                    f"source {self.name!r}: option {key!r} must be a Kafka property, "
                    "'kafka.<property>' (Cutline sets the connector's own options)"
                )
            if key == "kafka.bootstrap.servers":
                raise JobDefinitionError(
                    f"source {self.name!r}: give the brokers as bootstrap_servers, not as {key!r}"
                )
            if not isinstance(value, str):
                raise JobDefinitionError(
                    f"source {self.name!r}: option {key!r} must be a string, got {value!r}"
                )

    def servers(self) -> str:
        servers = self.bootstrap_servers or os.environ.get("CUTLINE_KAFKA_BOOTSTRAP")
        if not servers:
            raise JobDefinitionError(
                f"source {self.name!r}: set bootstrap_servers or $CUTLINE_KAFKA_BOOTSTRAP"
            )
        return servers

    def spark_dependencies(self) -> SparkDependencies:
        """Spark's Kafka connector for this Spark, with its token-provider dependency excluded
        from resolution and :func:`token_provider_jar` put on the classpath instead."""
        import pyspark

        from spark_jobs.deploy.session import SCALA

        return SparkDependencies(
            packages=(f"org.apache.spark:spark-sql-kafka-0-10_{SCALA}:{pyspark.__version__}",),
            excludes=(_token_provider(),),
            jars=(str(token_provider_jar()),),
        )

    def current_partitions(self) -> tuple[list[int], int]:
        return list(range(self.partitions)), EARLIEST

    def stream(self, spark, key: tuple[str, ...], start: PartitionPositions) -> Any:
        limit = self.max_records_per_partition * self.partitions
        reader = self.connector(spark.readStream, start)
        reader = reader.option("maxOffsetsPerTrigger", str(limit))
        return self._records(reader.load(), key)

    def batch(
        self, spark, key: tuple[str, ...], start: PartitionPositions, end: PartitionPositions
    ) -> Any:
        reader = self.connector(spark.read, start)
        reader = reader.option("endingOffsets", json.dumps({self.topic: end}))
        return self._records(reader.load(), key)

    def connector(self, reader, start: PartitionPositions):
        """``reader`` (Spark's DataStreamReader or DataFrameReader) set up for the topic from
        ``start``, with the consumer's own properties."""
        reader = (
            reader.format("kafka")
            .option("kafka.bootstrap.servers", self.servers())
            .option("subscribe", self.topic)
            .option("startingOffsets", json.dumps({self.topic: start}))
            .option("failOnDataLoss", "true")
        )
        for key, value in self.options.items():
            reader = reader.option(key, value)
        return reader

    def _records(self, raw, key: tuple[str, ...]):
        """The JSON records with the position and bad-record columns: a record is bad when it
        does not parse as a JSON object of the schema or a key column is null."""
        from pyspark.sql import functions as F

        value = F.col("value").cast("string")
        parsed = raw.select(
            F.from_json(value, self.schema).alias("_v"),
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


def token_provider_jar() -> Path:
    """The Kafka connector needs spark-token-provider-kafka, which Maven Central does not publish
    for Spark 4.2 (only 4.0.0). Ivy excludes it and this 4.0.0 jar, fetched once from the same
    repository and checked against its SHA-1, is put on the classpath instead. (Only Kerberos
    delegation tokens reach the two log keys 4.0.0 names that 4.2 no longer has.)"""
    import hashlib
    import urllib.request

    from spark_jobs.deploy.session import ivy_dir, maven_repo

    group, artifact = _token_provider().split(":")
    name = f"{artifact}-{TOKEN_PROVIDER_VERSION}.jar"
    target = ivy_dir() / "extra" / name
    if target.exists():
        return target
    url = f"{maven_repo()}/{group.replace('.', '/')}/{artifact}/{TOKEN_PROVIDER_VERSION}/{name}"
    with urllib.request.urlopen(url, timeout=120) as r:
        data = r.read()
    with urllib.request.urlopen(url + ".sha1", timeout=60) as r:
        expected = r.read().decode().split()[0].strip()
    if hashlib.sha1(data).hexdigest() != expected:
        raise RuntimeError(f"{url}: SHA-1 mismatch, not using it")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)
    return target


def _token_provider() -> str:
    from spark_jobs.deploy.session import SCALA

    return f"org.apache.spark:spark-token-provider-kafka-0-10_{SCALA}"
