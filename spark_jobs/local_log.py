"""The replayable local log: the embedded default source.

A topic is a directory of per-partition append-only JSON-lines files,
``<root>/<topic>/partition-<p>.jsonl``. A position is a byte offset per partition (the offset of
the next record), so a source can be rewound to any recorded position. Writers append whole lines
with one write each; readers only consider data up to the last newline.

:class:`LocalLogDataSource` reads a topic through PySpark's Python Data Source streaming API,
vectorised: each partition's byte range is parsed by Arrow's JSON reader into record batches.
Every record carries ``_partition`` and ``_next_offset`` (the position after it), from which the
runtime takes the position at each cut.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

PARTITION_COLUMN = "_partition"
NEXT_OFFSET_COLUMN = "_next_offset"
_SCAN_CHUNK = 1 << 20


class MalformedRecordError(ValueError):
    """A record of the log could not be parsed; names the file and the byte range."""


def partition_path(root: str | Path, topic: str, partition: int) -> Path:
    return Path(root) / topic / f"partition-{int(partition)}.jsonl"


def topic_partitions(root: str | Path, topic: str) -> list[int]:
    """Partition numbers of a topic, from the files present, ascending."""
    directory = Path(root) / topic
    if not directory.is_dir():
        return []
    out = []
    for p in directory.glob("partition-*.jsonl"):
        suffix = p.stem.split("-", 1)[1]
        if suffix.isdigit():
            out.append(int(suffix))
    return sorted(out)


def complete_size(path: Path) -> int:
    """Bytes of ``path`` up to and including its last newline (a torn last line is ignored)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "rb") as f:
        pos = size
        while pos > 0:
            step = min(_SCAN_CHUNK, pos)
            f.seek(pos - step)
            chunk = f.read(step)
            idx = chunk.rfind(b"\n")
            if idx >= 0:
                return pos - step + idx + 1
            pos -= step
    return 0


def offset_after_records(path: Path, start: int, max_records: int | None, limit: int) -> int:
    """The offset after at most ``max_records`` whole lines from ``start`` (not past ``limit``)."""
    if max_records is None or start >= limit:
        return max(start, limit)
    pos, remaining = start, max_records
    with open(path, "rb") as f:
        f.seek(start)
        while pos < limit and remaining > 0:
            chunk = f.read(min(_SCAN_CHUNK, limit - pos))
            newlines = np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10)
            if len(newlines) >= remaining:
                return pos + int(newlines[remaining - 1]) + 1
            remaining -= len(newlines)
            pos += len(chunk)
    return min(pos, limit)


def append_records(root: str | Path, topic: str, partition: int, lines: Sequence[bytes]) -> int:
    """Append JSON lines to one partition with one write; returns the new end offset."""
    path = partition_path(root, topic, partition)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = b"".join(line if line.endswith(b"\n") else line + b"\n" for line in lines)
    with open(path, "ab") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
        return f.tell()


def read_range(path: Path, partition: int, start: int, end: int, schema: pa.Schema) -> pa.Table:
    """Parse the records in bytes ``[start, end)`` of ``path`` with Arrow's JSON reader."""
    import pyarrow.json as pajson

    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    newlines = np.flatnonzero(np.frombuffer(data, np.uint8) == 10)
    try:
        table = pajson.read_json(
            io.BytesIO(data),
            read_options=pajson.ReadOptions(block_size=max(len(data), 1 << 16)),
            parse_options=pajson.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore"
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise MalformedRecordError(
            f"malformed record in {path} between byte offsets {start} and {end}: {e}"
        ) from e
    if table.num_rows != len(newlines):
        raise MalformedRecordError(
            f"{path} bytes {start}..{end}: {len(newlines)} lines but {table.num_rows} records "
            "(blank or split lines)"
        )
    return table.append_column(
        PARTITION_COLUMN, pa.array(np.full(table.num_rows, partition, np.int32))
    ).append_column(NEXT_OFFSET_COLUMN, pa.array(start + newlines.astype(np.int64) + 1))


def register_data_source(spark) -> None:
    """Register ``cutline_log`` with a Spark session (idempotent)."""
    spark.dataSource.register(_data_source_class())


def _data_source_class():
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    class LogRange(InputPartition):
        def __init__(self, partition: int, start: int, end: int) -> None:
            self.partition, self.start, self.end = partition, start, end

    class LocalLogStreamReader(DataSourceStreamReader):
        def __init__(self, schema, options) -> None:
            self.root = options["path"]
            self.topic = options["topic"]
            self.partitions_ = [int(p) for p in json.loads(options["partitions"])]
            self.starting = json.loads(options.get("startingOffsets", "{}"))
            self.max_records = int(options.get("maxRecordsPerPartition", "0")) or None
            fields = [f for f in schema.fields if not f.name.startswith("_")]
            from pyspark.sql.types import StructType

            self.arrow_schema = to_arrow_schema(StructType(fields))

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
            out = {}
            for p in self.partitions_:
                path = partition_path(self.root, self.topic, p)
                begin = int(start.get(str(p), 0))
                out[str(p)] = offset_after_records(path, begin, per_partition, complete_size(path))
            return out

        def partitions(self, start: dict, end: dict):
            return [
                LogRange(p, int(start.get(str(p), 0)), int(end[str(p)]))
                for p in self.partitions_
                if int(end[str(p)]) > int(start.get(str(p), 0))
            ]

        def read(self, partition) -> Iterator[pa.RecordBatch]:
            path = partition_path(self.root, self.topic, partition.partition)
            table = read_range(
                path, partition.partition, partition.start, partition.end, self.arrow_schema
            )
            yield from table.to_batches()

        def commit(self, end: dict) -> None:
            pass  # the log is retained; Cutline's checkpoints decide what is replayed

    class LocalLogDataSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "cutline_log"

        def schema(self):
            raise ValueError("cutline_log needs an explicit schema (.schema(...))")

        def streamReader(self, schema):
            return LocalLogStreamReader(schema, self.options)

    return LocalLogDataSource
