"""Rewriting one job's rows of a catalog table as data files of a chosen layout, in one commit.

Delta's own rewrites (OPTIMIZE, UPDATE, replace-where) decide themselves which rows share a file,
and put everything they rewrite into one. Two writers need the layout in their own hands: GC's
registry rewrite (shared_files.py) keeps the rows it will change again apart from those it never
will, and the catalog's compaction (upkeep.py) keeps a job's checkpoint history apart from its
retained checkpoints, so that the UPDATE of each checkpoint's subsume rewrites only the latter.

:func:`replace_files` writes each group of rows to a fresh Parquet file with its statistics (row
count, null counts, and the bounds of the numeric and short string columns, which is what lets a
reader or an UPDATE with a condition on ``checkpoint_id`` or ``status`` skip a file) and commits,
in one Delta commit, the removal of the files read and the addition of the new ones. delta-rs
rebases that commit over commits that only added files, and fails it when a concurrent commit
removed a file it removes (:class:`deltalake.exceptions.CommitFailedError`): then nothing of it
stays behind.

The data files are read as Parquet directly, which is right only for tables without deletion
vectors or column mapping (reader version 1), as the catalog creates them; a table that needs
more is refused, not misread.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

from spark_jobs.catalog.tables import arrow_schema
from state.storage import DurableStorage
from state.storage.tables import open_table

PARTITION = "job_id"
_NUMERIC = ("int", "uint", "float", "double", "bool")  # arrow type names with exact min/max stats
_SHORT = 64  # the longest string whose column gets min/max statistics


def check_protocol(dt: Any, table: str) -> None:
    """Refuse a table whose data files are not plain Parquet (reader version above 1)."""
    protocol = dt.protocol()
    if protocol.min_reader_version > 1:
        raise RuntimeError(
            f"{table} needs reader version {protocol.min_reader_version} (features "
            f"{protocol.reader_features}); the catalog's rewrites read its data files as plain "
            "Parquet, which is right only for reader version 1"
        )


def job_files(dt: Any, job_id: str) -> dict[str, int]:
    """The data files (path in the log -> size) of ``job_id``'s partition in ``dt``'s version."""
    import pyarrow as pa

    adds = pa.table(dt.get_add_actions(flatten=True))
    names = adds.column("path").to_pylist()
    sizes = adds.column("size_bytes").to_pylist()
    values = adds.column(f"partition.{PARTITION}").to_pylist()
    return {n: s for n, s, v in zip(names, sizes, values, strict=True) if v == job_id}


def read_rows(storage: DurableStorage, table: str, name: str, job_id: str) -> list[dict[str, Any]]:
    """The rows of one data file of ``table``, with the partition value the log gives it (a
    file may hold the partition column too, as delta-spark's do: the log's value counts)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _file_schema(table)
    data = pq.read_table(pa.BufferReader(storage.get_bytes(unquote(name))))
    columns = [
        data.column(f.name).cast(f.type)
        if f.name in data.column_names
        else pa.nulls(data.num_rows, f.type)
        for f in schema
    ]
    rows = pa.Table.from_arrays(columns, schema=schema).to_pylist()
    return [{PARTITION: job_id, **row} for row in rows]


def replace_files(
    dt: Any,
    storage: DurableStorage,
    table: str,
    job_id: str,
    removed: dict[str, int],
    groups: Sequence[list[dict[str, Any]]],
    summary: str,
) -> None:
    """In one commit on ``dt``'s version: remove the data files ``removed`` (path -> size) of
    ``job_id``'s partition and add one new file per non-empty group of rows. Raises
    ``CommitFailedError`` when a concurrent commit removed one of those files; the new files
    are then deleted again, unless the commit landed although its answer was lost."""
    from deltalake import CommitProperties
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import AddAction, RemoveAction

    written = [_write_file(storage, table, rows) for rows in groups if rows]
    now = int(time.time() * 1000)
    partition = {PARTITION: job_id}
    actions = [RemoveAction(name, True, now, size, partition) for name, size in removed.items()]
    actions += [AddAction(n, size, partition, mtime, True, st) for n, size, mtime, st in written]
    info = {"isBlindAppend": False, "readVersion": dt.version(), "userMetadata": summary}
    try:
        dt.create_write_transaction(
            actions, mode="append", schema=dt.schema(), partition_by=[PARTITION],
            commit_properties=CommitProperties(custom_metadata=info),
        )  # fmt: skip
    except CommitFailedError:
        current = job_files(open_table(dt.table_uri), job_id)
        storage.delete_many(name for name, *_ in written if name not in current)
        raise


def _file_schema(table: str):
    """The columns a data file of ``table`` holds: the table's, less the partition column."""
    schema = arrow_schema(table)
    return schema.remove(schema.get_field_index(PARTITION))


def _write_file(
    storage: DurableStorage, table: str, rows: list[dict[str, Any]]
) -> tuple[str, int, int, str]:
    """A new data file at the table's root (the log gives its partition value) holding ``rows``
    in the order given; returns its name, size, modification time (ms) and statistics (JSON).
    Not part of the table until committed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _file_schema(table)
    data = pa.Table.from_pylist([{f.name: r.get(f.name) for f in schema} for r in rows], schema)
    name = f"part-00000-cutline-{uuid.uuid4()}.c000.snappy.parquet"
    sink = pa.BufferOutputStream()
    pq.write_table(data, sink, compression="snappy")
    storage.put_bytes(name, sink.getvalue().to_pybytes())
    info = storage.stat(name)
    return name, info.size, int(info.modified * 1000), _stats(data)


def _stats(data: Any) -> str:
    """Delta file statistics of ``data``: the row count, every column's null count, and the
    exact minimum and maximum of each numeric column and of each string column whose values
    are short (statuses, not JSON documents: longer bounds would only bloat the log)."""
    import pyarrow.compute as pc

    low, high = {}, {}
    for f in data.schema:
        column = data.column(f.name)
        if column.null_count == len(column):
            continue
        if f.type == "string":
            if pc.max(pc.utf8_length(column)).as_py() > _SHORT:
                continue
        elif not str(f.type).startswith(_NUMERIC):
            continue
        bounds = pc.min_max(column).as_py()
        low[f.name], high[f.name] = bounds["min"], bounds["max"]
    nulls = {f.name: data.column(f.name).null_count for f in data.schema}
    return json.dumps(
        {"numRecords": data.num_rows, "minValues": low, "maxValues": high, "nullCount": nulls}
    )
