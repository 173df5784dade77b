"""A source: a definition in the job that also reads itself (:class:`Source`), the one thing
the runtime asks of an input.

A source has partitions, and a position per partition: the position of the next record to
read. The runtime records each partition's position at every checkpoint and rewinds to it on a
restore, so reading from a position must give the same records every time. A reader returns
every record with its partition and the position after it (:data:`PARTITION_COLUMN`,
:data:`NEXT_OFFSET_COLUMN`), and never raises on a record it cannot parse: it returns it with
the bad-record columns set (:data:`BAD_REASON`, :data:`BAD_RAW`, :data:`BAD_OFFSET`) and the
job's policy decides (fail naming it, or dead-letter it). A new kind of source is a subclass of
:class:`Source`; the runtime needs no change.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa

from cutline.sources.dependencies import NO_DEPENDENCIES, SparkDependencies

if TYPE_CHECKING:
    from cutline.routing import ReadRoute

PARTITION_COLUMN = "_partition"
NEXT_OFFSET_COLUMN = "_next_offset"
BAD_REASON = "_bad_reason"  # why a record is bad; null for a good one
BAD_RAW = "_bad_raw"  # a bad record as it was read
BAD_OFFSET = "_bad_offset"  # where a bad record starts in its partition
BAD_COLUMNS = pa.schema(
    [(BAD_REASON, pa.string()), (BAD_RAW, pa.string()), (BAD_OFFSET, pa.int64())]
)
POSITION_DDL = f"{PARTITION_COLUMN} int, {NEXT_OFFSET_COLUMN} long"
BAD_DDL = f"{BAD_REASON} string, {BAD_RAW} string, {BAD_OFFSET} long"

PartitionPositions = dict[str, int]  # partition -> position of the next record


class Source(ABC):
    """A source in a job definition: ``name`` (unique in the job), ``schema`` (a Spark DDL
    string of its records' fields) and ``max_records_per_partition`` (a micro-batch's bound)."""

    name: str
    schema: str
    max_records_per_partition: int
    #: the position a partition is read from when no cut names it: from its beginning
    beginning: ClassVar[int] = 0

    @abstractmethod
    def current_partitions(self) -> tuple[list[int], int]:
        """The source's partitions now, and the position that means "from the beginning"."""

    @abstractmethod
    def stream(self, spark, key: tuple[str, ...], start: PartitionPositions) -> Any:
        """A streaming DataFrame from ``start`` (partitions not in it: from the beginning); a
        micro-batch reads at most ``max_records_per_partition`` per partition. ``key``: the
        columns whose null makes a record bad, where the reader can check them."""

    @abstractmethod
    def batch(
        self, spark, key: tuple[str, ...], start: PartitionPositions, end: PartitionPositions
    ) -> Any:
        """The records from ``start`` up to ``end`` of the partitions in both, as a batch:
        exactly what a micro-batch that read from ``start`` to ``end`` read."""

    def prepare(self, spark) -> None:
        """Whatever reading needs in the session ``spark`` before a reader is built, done ahead
        (the runtime calls it beside its restore); idempotent."""
        return None  # nothing, unless a kind says so

    def spark_dependencies(self) -> SparkDependencies:
        """What reading it needs on Spark's classpath (nothing, unless a kind says so)."""
        return NO_DEPENDENCIES

    def ddl(self) -> str:
        """The schema of its records as the runtime reads them."""
        return f"{self.schema}, {POSITION_DDL}, {BAD_DDL}"


_REGISTERED = "_cutline_data_sources"  # a session's attribute: the data sources it has


def register_once(spark, name: str, data_source: Callable[[], type]) -> None:
    """Registers the Python data source ``name`` (the class ``data_source()`` returns) with a
    Spark session, once per session: every read of a kind asks for it, and a standby's warm-up
    query has it registered before its takeover's query."""
    registered = getattr(spark, _REGISTERED, None)
    if registered is None:
        registered = set()
        setattr(spark, _REGISTERED, registered)
    if name not in registered:
        spark.dataSource.register(data_source())
        registered.add(name)


class PositionedSource(Source):
    """A source read through a PySpark Python data source of Cutline's, which takes the
    positions as options: ``startingOffsets``, ``endingOffsets`` (a batch),
    ``maxRecordsPerPartition`` (a stream) and ``keyColumn``. A kind says which data source and
    with which options of its own (:meth:`data_source`).

    A kind whose reader honours the ``route`` option (:attr:`routes_at_read`) does the map side
    itself: given a :class:`~cutline.routing.ReadRoute`, it returns its records already routed
    and cut into the subtasks' chunks (``CHUNKS_DDL``), so that no record passes through Spark's
    rows between the read and the subtask shuffle."""

    #: whether the kind's reader honours the ``route`` option
    routes_at_read: ClassVar[bool] = False

    @abstractmethod
    def data_source(self, spark, reader) -> Any:
        """``reader`` (``spark.read`` or ``spark.readStream``) with the data source's format
        (registered with ``spark``) and this source's own options."""

    def prepare(self, spark) -> None:
        """Registers the kind's data source with ``spark``: the first registration in a JVM
        makes Spark look up Python data sources in a Python process of its own (about a
        second)."""
        self.data_source(spark, spark.read)

    def stream(
        self,
        spark,
        key: tuple[str, ...],
        start: PartitionPositions,
        route: ReadRoute | None = None,
    ) -> Any:
        reader = self._positioned(spark, spark.readStream, key, start, route)
        return reader.option("maxRecordsPerPartition", str(self.max_records_per_partition)).load()

    def batch(
        self,
        spark,
        key: tuple[str, ...],
        start: PartitionPositions,
        end: PartitionPositions,
        route: ReadRoute | None = None,
    ) -> Any:
        reader = self._positioned(spark, spark.read, key, start, route)
        return reader.option("endingOffsets", json.dumps(end)).load()

    def _positioned(
        self,
        spark,
        reader,
        key: tuple[str, ...],
        start: PartitionPositions,
        route: ReadRoute | None,
    ):
        from cutline.routing import CHUNKS_DDL

        reader = self.data_source(spark, reader).schema(self.ddl() if route is None else CHUNKS_DDL)
        if route is not None:
            reader = reader.option("route", route.to_option())
        return reader.option("startingOffsets", json.dumps(start)).option(
            "keyColumn", ",".join(key)
        )
