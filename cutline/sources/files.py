"""A directory of immutable files, JSON lines or Parquet, on local disk or object storage (S3):
each file a partition, new files picked up while the job runs.

A file's partition number is derived from its name (the CRC-32 of the name, 31 bits), so it is
the same at every listing whatever files come and go; two names with one number fail the listing,
naming both (rename one). A position is a byte offset for JSON lines (the offset after the last
record read, as the local log's) and a row number for Parquet. Files must not change once they
are in the directory: write them elsewhere and move them in (an S3 PUT is atomic). Names starting
with ``.`` or ``_`` are skipped (temporary files, ``_SUCCESS``). Reading goes through Cutline's
durable storage (``state/storage``), so S3 is reached through boto3's standard configuration.
"""

from __future__ import annotations

import io
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from cutline.sources.base import (
    BAD_COLUMNS,
    BAD_OFFSET,
    BAD_RAW,
    BAD_REASON,
    NEXT_OFFSET_COLUMN,
    PARTITION_COLUMN,
    PositionedSource,
    register_once,
)
from cutline.validation import JobDefinitionError, check_name
from state.errors import BadInputError

FORMATS = {"json": (".json", ".jsonl"), "parquet": (".parquet",)}
DATA_SOURCE = "cutline_files"


def partition_of(name: str) -> int:
    """The partition number of the file named ``name`` (relative to the directory)."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


@dataclass(frozen=True)
class FileSource(PositionedSource):
    """Files of ``format`` (``"json"``: JSON lines; ``"parquet"``) under ``path`` (a local
    path, ``file://`` or ``s3://bucket/prefix``), ``schema`` a Spark DDL string of their
    fields; a micro-batch reads at most ``max_records_per_partition`` records of each file."""

    name: str
    path: str
    schema: str
    format: str = "json"
    max_records_per_partition: int = 10_000
    routes_at_read: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_name("source.name", self.name)
        if self.format not in FORMATS:
            raise JobDefinitionError(
                f"source {self.name!r}: format must be one of {sorted(FORMATS)}, got "
                f"{self.format!r}"
            )
        if not isinstance(self.path, str) or not self.path:
            raise JobDefinitionError(f"source {self.name!r}: path must be a directory or URL")
        if self.max_records_per_partition < 1:
            raise JobDefinitionError("source.max_records_per_partition must be >= 1")

    def current_partitions(self) -> tuple[list[int], int]:
        return sorted(list_files(self.path, self.format)), 0

    def data_source(self, spark, reader) -> Any:
        register_once(spark, DATA_SOURCE, _data_source_class)
        return reader.format(DATA_SOURCE).option("path", self.path).option("format", self.format)


def list_files(path: str, format: str) -> dict[int, str]:
    """The files of ``format`` under ``path``: partition number -> name. Two names with one
    number raise ``ValueError`` naming both."""
    from state.storage import open_storage

    files: dict[int, str] = {}
    for info in open_storage(path).list(""):
        name = info.path
        base = name.rsplit("/", 1)[-1]
        if base.startswith((".", "_")) or not base.endswith(FORMATS[format]):
            continue
        number = partition_of(name)
        if files.setdefault(number, name) != name:
            raise BadInputError(
                f"{path}: files {files[number]!r} and {name!r} have the same partition number "
                f"{number}; rename one of them"
            )
    return files


class _Ends:
    """Where each record of one file ends (read once per process: files are immutable)."""

    def __init__(self, data: bytes, format: str) -> None:
        if format == "json":
            ends = np.flatnonzero(np.frombuffer(data, np.uint8) == 10).astype(np.int64) + 1
        else:
            import pyarrow.parquet as pq

            ends = np.arange(1, pq.ParquetFile(io.BytesIO(data)).metadata.num_rows + 1)
        self.ends = ends  # the position after each record

    def end(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def after(self, start: int, records: int | None) -> int:
        """The position after at most ``records`` records from ``start``."""
        if records is None:
            return max(start, self.end())
        i = int(np.searchsorted(self.ends, start, side="right")) + records - 1
        return int(self.ends[min(i, len(self.ends) - 1)]) if len(self.ends) else start


def read_records(
    data: bytes, format: str, partition: int, start: int, end: int, schema: pa.Schema, key, where
) -> pa.Table:
    """Records ``[start, end)`` of a file with their positions and bad-record columns."""
    if format == "json":
        from cutline.sources.log_format import parse_lines

        return parse_lines(data[start:end], start, partition, schema, key, where)
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(io.BytesIO(data)).slice(start, end - start)
    missing = [f.name for f in schema if f.name not in table.column_names]
    if missing:
        raise BadInputError(f"{where}: no column {missing} (its columns: {table.column_names})")
    table = table.select(schema.names).cast(schema)
    null = np.zeros(table.num_rows, bool)
    for column in key:
        null |= np.asarray(table.column(column).is_null())
    rows, bad = table.num_rows, np.flatnonzero(null)

    def on_bad(values, column: str) -> pa.Array:  # null on every good record
        out = np.full(rows, None, dtype=object)
        out[bad] = values
        return pa.array(out, BAD_COLUMNS.field(column).type)

    # only the bad records (a null key: rare) become Python objects
    raw = [json.dumps(r, default=str) for r in table.take(bad).to_pylist()]
    columns = {
        PARTITION_COLUMN: pa.array(np.full(rows, partition, np.int32)),
        NEXT_OFFSET_COLUMN: pa.array(np.arange(start + 1, start + rows + 1, dtype=np.int64)),
        BAD_REASON: on_bad(f"null key {key!r}", BAD_REASON),
        BAD_RAW: on_bad(raw, BAD_RAW),
        BAD_OFFSET: on_bad(start + bad, BAD_OFFSET),
    }
    for name, values in columns.items():
        table = table.append_column(name, values)
    if null.any():  # a bad record's fields are null, as the JSON reader returns them
        good = pa.array(~null)
        table = pa.Table.from_arrays(
            [
                c if n.startswith("_") else pc.if_else(good, c, pa.nulls(rows, c.type))
                for n, c in zip(table.column_names, table.columns, strict=True)
            ],
            names=table.column_names,
        )
    return table


def _data_source_class():
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceReader,
        DataSourceStreamReader,
        InputPartition,
    )
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.streaming.datasource import ReadAllAvailable
    from pyspark.sql.types import StructType

    from cutline.routing import ReadRoute
    from state.storage import open_storage

    class FileRange(InputPartition):
        def __init__(self, name: str, partition: int, start: int, end: int) -> None:
            self.name, self.partition, self.start, self.end = name, partition, start, end

    class _Files:
        """What both readers share: options, the listing, and reading one file's range."""

        def __init__(self, schema, options) -> None:
            self.path, self.format = options["path"], options["format"]
            self.starting = json.loads(options.get("startingOffsets", "{}"))
            self.ending = json.loads(options.get("endingOffsets", "{}"))
            self.key = tuple(c for c in (options.get("keyColumn") or "").split(",") if c)
            # routed at the read (``route``): Spark's schema is the chunks', the route has the
            # records'
            self.route = ReadRoute.from_option(options["route"]) if "route" in options else None
            fields = [f for f in schema.fields if not f.name.startswith("_")]
            self.arrow_schema = (
                self.route.records if self.route else to_arrow_schema(StructType(fields))
            )
            self.columns = [f.name for f in schema.fields]
            self.names: dict[int, str] = {}
            self._ends: dict[str, _Ends] = {}

        def __getstate__(self) -> dict:
            return {**self.__dict__, "_ends": {}}  # the driver's cache stays on the driver

        def ends(self, name: str) -> _Ends:
            if name not in self._ends:
                self._ends[name] = _Ends(open_storage(self.path).get_bytes(name), self.format)
            return self._ends[name]

        def ranges(self, start: dict, end: dict) -> list:
            out = []
            for p, stop in end.items():
                begin = int(start.get(p, 0))
                if int(stop) > begin:
                    name = self.names.get(int(p))
                    if name is None:
                        raise FileNotFoundError(
                            f"{self.path}: the file of partition {p} is gone; a replay of "
                            f"positions {begin}..{stop} needs it"
                        )
                    out.append(FileRange(name, int(p), begin, int(stop)))
            return out

        def read(self, partition) -> Iterator[pa.RecordBatch]:
            if not isinstance(partition, FileRange):  # Spark's stand-in when a range is empty
                return
            data = open_storage(self.path).get_bytes(partition.name)
            where = f"{self.path}/{partition.name}"
            table = read_records(
                data,
                self.format,
                partition.partition,
                partition.start,
                partition.end,
                self.arrow_schema,
                self.key,
                where,
            )
            if self.route is None:
                yield from table.select(self.columns).to_batches()
            elif table.num_rows:
                yield self.route.chunk_rows(table)

    class FileStreamReader(_Files, DataSourceStreamReader):
        def __init__(self, schema, options) -> None:
            super().__init__(schema, options)
            self.max_records = int(options.get("maxRecordsPerPartition", "0")) or None

        def initialOffset(self) -> dict:
            self.names = list_files(self.path, self.format)
            return {str(p): int(self.starting.get(str(p), 0)) for p in self.names}

        def getDefaultReadLimit(self):
            return ReadAllAvailable()  # the bound is per file: latestOffset applies it

        def latestOffset(self, start: dict, limit) -> dict:
            self.names = list_files(self.path, self.format)  # new files: read from their start
            out = dict(start)
            for p, name in self.names.items():
                begin = int(start.get(str(p), 0))
                out[str(p)] = self.ends(name).after(begin, self.max_records)
            return out

        def partitions(self, start: dict, end: dict):
            return self.ranges(start, end)

        def commit(self, end: dict) -> None:
            pass  # files stay; Cutline's checkpoints decide what is replayed

    class FileRangeReader(_Files, DataSourceReader):
        """One fixed range per file, ``startingOffsets`` to ``endingOffsets``, as a batch."""

        def partitions(self):
            self.names = list_files(self.path, self.format)
            return self.ranges(self.starting, self.ending)

    class FilesDataSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return DATA_SOURCE

        def schema(self):
            raise ValueError(f"{DATA_SOURCE} needs an explicit schema (.schema(...))")

        def streamReader(self, schema):
            return FileStreamReader(schema, self.options)

        def reader(self, schema):
            return FileRangeReader(schema, self.options)

    return FilesDataSource
