"""A Kafka topic of JSON or Avro records, read with Spark's Kafka connector; positions are
offsets per partition."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from cutline.sources.base import (
    BAD_OFFSET,
    BAD_RAW,
    BAD_REASON,
    NEXT_OFFSET_COLUMN,
    PARTITION_COLUMN,
    PartitionPositions,
    Source,
)
from cutline.sources.dependencies import SCALA, SparkDependencies, ivy_dir, maven_repo
from cutline.validation import JobDefinitionError, check_name

EARLIEST = -2  # the connector's "earliest" offset
VALUE_FORMATS = ("json", "avro")
TOKEN_PROVIDER_VERSION = "4.0.0"  # the newest Maven Central has (see token_provider_jar)


@dataclass(frozen=True)
class KafkaSource(Source):
    """Topic ``topic`` with ``partitions`` partitions, its records' values JSON objects or, with
    ``value_format="avro"``, Avro binary of the writer's schema ``avro_schema`` (Avro's JSON
    form of a record; plain Avro, no schema-registry header). ``schema``: a Spark DDL string of
    the fields the job reads; with Avro each must be in the record, of the type Spark's Avro
    reader gives it (checked when the stream is built). A value that does not decode is a bad
    record (with Avro, its raw bytes are reported in base64). ``bootstrap_servers`` defaults to
    ``$CUTLINE_KAFKA_BOOTSTRAP``; ``max_records_per_partition`` bounds a micro-batch
    (``maxOffsetsPerTrigger`` is this times ``partitions``). ``options``: Kafka consumer
    properties, each ``kafka.<property>`` as Spark's connector takes them
    (``kafka.security.protocol``, ``kafka.sasl.mechanism``, ``kafka.sasl.jaas.config``,
    ``kafka.ssl.truststore.location``, ...); read secrets from the environment in the job's
    code, never write them into it (logs mask them either way)."""

    name: str
    topic: str
    schema: str
    partitions: int
    beginning: ClassVar[int] = EARLIEST
    max_records_per_partition: int = 10_000
    bootstrap_servers: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    value_format: str = "json"
    avro_schema: str | None = None

    def __post_init__(self) -> None:
        check_name("source.name", self.name)
        if not self.topic:
            raise JobDefinitionError("source.topic must not be empty")
        if self.value_format not in VALUE_FORMATS:
            raise JobDefinitionError(
                f"source {self.name!r}: value_format must be one of {VALUE_FORMATS}, got "
                f"{self.value_format!r}"
            )
        if (self.value_format == "avro") != (self.avro_schema is not None):
            raise JobDefinitionError(
                f"source {self.name!r}: avro_schema goes with value_format='avro', and only there"
            )
        if self.avro_schema is not None:
            _check_avro_record(self.name, self.avro_schema)
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

        kafka = f"org.apache.spark:spark-sql-kafka-0-10_{SCALA}:{pyspark.__version__}"
        avro = f"org.apache.spark:spark-avro_{SCALA}:{pyspark.__version__}"
        return SparkDependencies(
            packages=(kafka, avro) if self.value_format == "avro" else (kafka,),
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
        """The decoded records with the position and bad-record columns: a record is bad when
        its value does not decode (JSON: not an object of the schema; Avro: not a record of
        ``avro_schema``) or a key column is null."""
        from pyspark.sql import functions as F

        if self.value_format == "avro":
            from pyspark.sql.avro.functions import from_avro

            decoded = from_avro(F.col("value"), self.avro_schema, {"mode": "PERMISSIVE"})
            raw_text, what = F.base64("value"), "not Avro of the source's avro_schema"
        else:
            raw_text = F.col("value").cast("string")
            decoded, what = F.from_json(raw_text, self.schema), "not a JSON object of the schema"
        parsed = raw.select(
            decoded.alias("_v"),
            raw_text.alias(BAD_RAW),
            F.col("partition").alias(PARTITION_COLUMN),
            (F.col("offset") + 1).alias(NEXT_OFFSET_COLUMN),
            F.col("offset").alias(BAD_OFFSET),
        )
        fields, undecoded = self._fields(parsed)
        reason = F.when(undecoded, F.lit(what))
        for column in key:
            reason = reason.when(F.col(f"_v.{column}").isNull(), F.lit(f"null key {column!r}"))
        reason = reason.otherwise(F.lit(None).cast("string"))
        return parsed.select(
            *fields,
            PARTITION_COLUMN,
            NEXT_OFFSET_COLUMN,
            reason.alias(BAD_REASON),
            F.when(reason.isNotNull(), F.col(BAD_RAW)).alias(BAD_RAW),
            F.when(reason.isNotNull(), F.col(BAD_OFFSET)).alias(BAD_OFFSET),
        )

    def _fields(self, parsed) -> tuple[list, Any]:
        """The columns of ``schema`` out of the decoded struct ``_v``, and when a value did not
        decode. Spark's Avro reader answers an undecodable value with a record of nulls, not a
        null; a field of the schema missing from ``avro_schema``, or of another type, is a
        definition error naming it."""
        from functools import reduce

        from pyspark.sql import functions as F
        from pyspark.sql.types import _parse_datatype_string

        if self.value_format == "json":
            return ["_v.*"], F.col("_v").isNull()
        decoded = {f.name: f.dataType for f in parsed.schema["_v"].dataType.fields}
        wanted = _parse_datatype_string(self.schema).fields
        for f in wanted:
            if f.name not in decoded:
                raise JobDefinitionError(
                    f"source {self.name!r}: field {f.name!r} of schema is not in avro_schema "
                    f"(its fields: {', '.join(decoded)})"
                )
            got, want = decoded[f.name].simpleString(), f.dataType.simpleString()
            if got != want:
                raise JobDefinitionError(
                    f"source {self.name!r}: field {f.name!r} is {got} in avro_schema, {want} "
                    "in schema"
                )
        all_null = reduce(lambda a, b: a & b, [F.col(f"_v.{n}").isNull() for n in decoded])
        return [F.col(f"_v.{f.name}").alias(f.name) for f in wanted], all_null


def _check_avro_record(source: str, avro_schema: str) -> None:
    """``avro_schema`` must be Avro's JSON form of a record with fields."""
    try:
        parsed = json.loads(avro_schema)
    except ValueError as e:
        raise JobDefinitionError(f"source {source!r}: avro_schema is not JSON: {e}") from None
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        raise JobDefinitionError(f"source {source!r}: avro_schema must be an Avro record")
    if not isinstance(parsed.get("fields"), list) or not parsed["fields"]:
        raise JobDefinitionError(f"source {source!r}: avro_schema's record has no fields")


def token_provider_jar() -> Path:
    """The Kafka connector needs spark-token-provider-kafka, which Maven Central does not publish
    for Spark 4.2 (only 4.0.0). Ivy excludes it and this 4.0.0 jar, fetched once from the same
    repository and checked against its SHA-1, is put on the classpath instead. (Only Kerberos
    delegation tokens reach the two log keys 4.0.0 names that 4.2 no longer has.)"""
    import hashlib
    import urllib.request

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
    return f"org.apache.spark:spark-token-provider-kafka-0-10_{SCALA}"
