"""The replayable local log, the embedded default source: ``<root>/<topic>/partition-<p>.jsonl``
(JSON lines, positions in bytes: cutline/sources/log_format.py) or ``partition-<p>/`` (Arrow
segments, positions in records: cutline/sources/log_segments.py), whichever the topic holds.

Spark reads a topic through ``cutline_log``, a PySpark Python data source, vectorised: each
partition's range is parsed with Arrow (or, in the columnar format, mapped and sliced), the key's
columns checked by the reader itself. As a stream it reads from recorded positions, at most
``maxRecordsPerPartition`` records per partition and micro-batch; a recorded position past a
partition's end is an error (the log was truncated or replaced: Spark's ``failOnDataLoss``), never
a wait. As a batch it reads a fixed range of offsets (``startingOffsets`` to ``endingOffsets``),
which is how a restore replays committed epochs exactly."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa

from cutline.sources.base import PositionedSource, register_once
from cutline.sources.log_format import (
    complete_size,
    offset_after_records,
    partition_path,
    read_range,
    topic_format,
    topic_partitions,
)
from cutline.sources.log_segments import end_offset, read_segments, segment_dir
from cutline.validation import JobDefinitionError, check_name
from state.errors import BadInputError

if TYPE_CHECKING:
    from cutline.job import JobDefinition


@dataclass(frozen=True)
class LogSource(PositionedSource):
    """Topic ``topic`` of the local log. ``schema`` is a Spark DDL string of the JSON fields;
    ``max_records_per_partition`` bounds a micro-batch, which makes micro-batch boundaries
    deterministic for a given input. ``root``: the log's directory (default: the runtime's log
    root, ``--log-root`` / ``CUTLINE_LOG_ROOT``, which the runtime fills in with
    :meth:`rooted`)."""

    name: str
    topic: str
    schema: str
    max_records_per_partition: int = 10_000
    root: str | None = None
    routes_at_read: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_name("source.name", self.name)
        check_name("source.topic", self.topic)
        if self.max_records_per_partition < 1:
            raise JobDefinitionError("source.max_records_per_partition must be >= 1")

    def rooted(self, default_root: str) -> LogSource:
        """This source, reading under ``default_root`` unless it names its own root."""
        return self if self.root else dataclasses.replace(self, root=default_root)

    def _root(self) -> str:
        if not self.root:
            raise JobDefinitionError(
                f"source {self.name!r}: no log root (the runtime sets the default one)"
            )
        return self.root

    def current_partitions(self) -> tuple[list[int], int]:
        parts = topic_partitions(self._root(), self.topic)
        if not parts:
            raise BadInputError(
                f"source {self.name!r}: no partitions under {self._root()}/{self.topic}"
            )
        return parts, 0

    def data_source(self, spark, reader) -> Any:
        register_data_source(spark)
        return reader.format("cutline_log").option("path", self._root()).option("topic", self.topic)


def with_log_root(job: JobDefinition, root: str) -> JobDefinition:
    """``job`` with each local log among its sources reading under ``root`` unless it names its
    own (the runtime's log root: ``--log-root``, ``CUTLINE_LOG_ROOT``, ``<home>/log``)."""
    sources = tuple(s.rooted(root) if isinstance(s, LogSource) else s for s in job.sources)
    return dataclasses.replace(job, sources=sources)


def register_data_source(spark) -> None:
    """Registers ``cutline_log`` with a Spark session, once per session."""
    register_once(spark, "cutline_log", _data_source_class)


def _data_source_class():
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceReader,
        DataSourceStreamReader,
        InputPartition,
    )
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
    from pyspark.sql.types import StructType

    from cutline.routing import ReadRoute

    class LogRange(InputPartition):
        def __init__(self, partition: int, start: int, end: int) -> None:
            self.partition, self.start, self.end = partition, start, end

    class _Ranges:
        """What both readers share: options, and reading one partition's byte range."""

        def __init__(self, schema, options) -> None:
            self.root = options["path"]
            self.topic = options["topic"]
            self.starting = json.loads(options.get("startingOffsets", "{}"))
            # the partitions read: those named, else those ``startingOffsets`` gives
            named = json.loads(options.get("partitions") or "null")
            self.partitions_ = sorted(int(p) for p in (self.starting if named is None else named))
            self.ending = json.loads(options.get("endingOffsets", "{}"))
            # the key's columns, comma-separated (a composite key has several)
            self.key = tuple(c for c in (options.get("keyColumn") or "").split(",") if c)
            # routed at the read (``route``): Spark's schema is the chunks', the route has the
            # records'
            self.route = ReadRoute.from_option(options["route"]) if "route" in options else None
            fields = [f for f in schema.fields if not f.name.startswith("_")]
            self.arrow_schema = (
                self.route.records if self.route else to_arrow_schema(StructType(fields))
            )
            self.columns = [f.name for f in schema.fields]  # what Spark expects, in its order
            self.columnar = topic_format(self.root, self.topic) == "arrow"

        def ranges(self, start: dict, end: dict) -> list:
            return [
                LogRange(p, int(start.get(str(p), 0)), int(end[str(p)]))
                for p in self.partitions_
                if int(end.get(str(p), 0)) > int(start.get(str(p), 0))
            ]

        def path(self, partition: int):
            """A partition's file (JSON lines) or directory (Arrow segments)."""
            where = segment_dir if self.columnar else partition_path
            return where(self.root, self.topic, partition)

        def end(self, partition: int, start: int, max_records: int | None) -> int:
            """The position after at most ``max_records`` records of a partition from ``start``."""
            path = self.path(partition)
            if self.columnar:  # positions are record offsets
                last = end_offset(path)
                after = last if max_records is None else min(last, start + max_records)
            else:
                last = complete_size(path)
                after = offset_after_records(path, start, max_records, last)
            if start > last:
                raise BadInputError(
                    f"topic {self.topic!r} under {self.root}: partition {partition} ends at "
                    f"{last}, before the position {start} the job has read to (the log was "
                    "truncated or replaced, or this is another log)"
                )
            return after

        def read(self, partition) -> Iterator[pa.RecordBatch]:
            if not isinstance(partition, LogRange):  # Spark's stand-in when a range is empty
                return
            read = read_segments if self.columnar else read_range
            table = read(
                self.path(partition.partition),
                partition.partition,
                partition.start,
                partition.end,
                self.arrow_schema,
                self.key,
            )
            if self.route is None:
                yield from table.select(self.columns).to_batches()
            elif table.num_rows:
                yield self.route.chunk_rows(table)

    class LocalLogStreamReader(_Ranges, DataSourceStreamReader):
        def __init__(self, schema, options) -> None:
            super().__init__(schema, options)
            self.max_records = int(options.get("maxRecordsPerPartition", "0")) or None

        def initialOffset(self) -> dict:
            return {str(p): int(self.starting.get(str(p), 0)) for p in self.partitions_}

        def getDefaultReadLimit(self):
            if self.max_records is None:
                return ReadAllAvailable()
            return ReadMaxRows(self.max_records * len(self.partitions_))

        def latestOffset(self, start: dict, limit) -> dict:
            per_partition = None
            if isinstance(limit, ReadMaxRows):
                per_partition = max(1, limit.max_rows // len(self.partitions_))
            return {
                str(p): self.end(p, int(start.get(str(p), 0)), per_partition)
                for p in self.partitions_
            }

        def partitions(self, start: dict, end: dict):
            return self.ranges(start, end)

        def commit(self, end: dict) -> None:
            pass  # the log is retained; Cutline's checkpoints decide what is replayed

    class LocalLogRangeReader(_Ranges, DataSourceReader):
        """One fixed range, ``startingOffsets`` to ``endingOffsets``, as a batch."""

        def partitions(self):
            return self.ranges(self.starting, self.ending)

    class LocalLogDataSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "cutline_log"

        def schema(self):
            raise ValueError("cutline_log needs an explicit schema (.schema(...))")

        def streamReader(self, schema):
            return LocalLogStreamReader(schema, self.options)

        def reader(self, schema):
            return LocalLogRangeReader(schema, self.options)

    return LocalLogDataSource
