"""How records reach a keyed stage's subtasks, as Arrow: each record's key, its key group
(Spark SQL's ``hash``, state/keygroups.py) and the subtask that owns it; records cut into one
Arrow IPC chunk per subtask; a subtask's chunks read back in log order (by input, partition or
upstream subtask, and position), whatever order they arrived in, so a replay sees them in the
same order. The executor routes every micro-batch through these (spark_jobs/executor/), and the
test harness (cutline/testing/harness.py) runs a job through the same routing without Spark.

A re-keyed record carries the upstream subtask as ``_partition`` and its row number as
``_next_offset``; the runtime's own columns start with ``_`` and are dropped before re-keying.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from cutline.keyed_process import SOURCE_COLUMN, Key, key_columns
from cutline.sources.base import NEXT_OFFSET_COLUMN, PARTITION_COLUMN
from cutline.validation import JobDefinitionError
from state.keygroups import KeyType, key_groups, subtask_for_key_group

if TYPE_CHECKING:
    from cutline.job import JobDefinition

SUBTASK_COLUMN = "_subtask"
STAGE_COLUMN = "_stage"  # at the map side: the index of the stage that reads the record's source
KEY_GROUP_COLUMN = "_kg"
KEY_COLUMN = "_key"
# the map side's output: one Arrow IPC chunk per reading stage and subtask
CHUNKS_DDL = "subtask int, stage int, chunk binary"


def is_runtime_column(column: str) -> bool:
    """A column of the runtime's own (routing, positions), not of the job's records."""
    return column.startswith("_")


def rekey(
    output: pa.Table, job: JobDefinition, stage: int, upstream: int, producer: int | None = None
) -> list[tuple]:
    """Stage ``producer``'s (default: the stage before ``stage``) output rows of subtask
    ``upstream``, cut into one Arrow IPC chunk per subtask of ``stage`` by that stage's key.
    Output without the key's columns is a :class:`~cutline.validation.JobDefinitionError` (the
    job's stages do not fit together)."""
    output = output.select([c for c in output.column_names if not is_runtime_column(c)])
    if output.num_rows == 0:
        return []
    producer = stage - 1 if producer is None else producer
    spec, before = job.stages[stage], job.stages[producer].name
    key = spec.inputs[before]
    missing = [c for c in key_columns(key) if c not in output.column_names]
    if missing:
        raise JobDefinitionError(
            f"stage {spec.name!r} is keyed by {key!r}, but the output of stage {before!r} has "
            f"no {missing}: its columns are {output.column_names}"
        )
    p, m = job.parallelism, job.max_parallelism
    keys = key_array(output, key)
    groups = key_groups(keys, spec.key_type, m)
    n = output.num_rows
    table = (
        output.append_column(KEY_COLUMN, keys)
        .append_column(SOURCE_COLUMN, pa.repeat(pa.scalar(before, pa.string()), n))
        .append_column(PARTITION_COLUMN, pa.array(np.full(n, upstream, np.int32)))
        .append_column(NEXT_OFFSET_COLUMN, pa.array(np.arange(1, n + 1, dtype=np.int64)))
        .append_column(KEY_GROUP_COLUMN, pa.array(groups.astype(np.int32)))
        .append_column(SUBTASK_COLUMN, pa.array(subtask_for_key_group(groups, p, m)))
    )
    return cut_by_subtask(table)


def key_array(table: pa.Table, key: Key) -> pa.Array:
    """``table``'s keys: its key column, or a struct array of a composite key's columns."""
    if isinstance(key, str):
        return table.column(key).combine_chunks()
    return pa.StructArray.from_arrays([table.column(c).combine_chunks() for c in key], list(key))


def cut_by_subtask(table: pa.Table) -> list[tuple[int, bytes]]:
    """``table`` (with ``_subtask``) as one Arrow IPC stream per subtask it has records for."""
    return [(subtask, chunk) for (subtask,), chunk in cut_by(table, [SUBTASK_COLUMN])]


def cut_by(table: pa.Table, columns: list[str]) -> list[tuple[tuple[int, ...], bytes]]:
    """``table`` as one Arrow IPC stream per distinct value of ``columns`` (integers)."""
    table = table.sort_by([(c, "ascending") for c in columns]).combine_chunks()
    values = [table.column(c).to_numpy() for c in columns]
    change = np.zeros(max(table.num_rows - 1, 0), bool)
    for v in values:
        change |= v[1:] != v[:-1]
    starts = [0, *(np.flatnonzero(change) + 1).tolist()]
    ends = [*starts[1:], table.num_rows]
    out = []
    for start, end in zip(starts, ends, strict=True):
        if end == start:
            continue
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table.slice(start, end - start))
        out.append((tuple(int(v[start]) for v in values), sink.getvalue().to_pybytes()))
    return out


def chunk_rows(table: pa.Table) -> pa.RecordBatch:
    """The map side's cut of one source partition's records (``table``, with the routing
    columns): one row per reading stage and subtask (``CHUNKS_DDL``), its records one Arrow IPC
    stream, in the order they were read."""
    if STAGE_COLUMN not in table.column_names:
        table = table.append_column(STAGE_COLUMN, pa.array(np.zeros(table.num_rows, np.int32)))
    groups = cut_by(table, [STAGE_COLUMN, SUBTASK_COLUMN])
    return pa.RecordBatch.from_arrays(
        [
            pa.array([subtask for (_, subtask), _ in groups], pa.int32()),
            pa.array([stage for (stage, _), _ in groups], pa.int32()),
            pa.array([chunk for _, chunk in groups], pa.binary()),
        ],
        ["subtask", "stage", "chunk"],
    )


@dataclass(frozen=True)
class ReadRoute:
    """The map side done by a source's own reader: its records tagged with the source, the
    reading stage, the key, key group and subtask exactly as Spark SQL's map side tags them
    (``pmod(hash(key), max_parallelism)``), laid out as ``chunks`` (the map side's schema, every
    source's columns) and cut by :func:`chunk_rows`. ``records``: the schema the reader parses
    the source's own fields with. Travels to the reader as one string option."""

    source: str
    stage: int
    key: Key
    key_type: KeyType
    parallelism: int
    max_parallelism: int
    records: pa.Schema
    chunks: pa.Schema

    def to_option(self) -> str:
        def schema(s: pa.Schema) -> str:
            return base64.b64encode(s.serialize().to_pybytes()).decode()

        return json.dumps({
            "source": self.source, "stage": self.stage, "key": self.key,
            "key_type": self.key_type, "parallelism": self.parallelism,
            "max_parallelism": self.max_parallelism,
            "records": schema(self.records), "chunks": schema(self.chunks),
        })  # fmt: skip

    @classmethod
    def from_option(cls, option: str) -> ReadRoute:
        o = json.loads(option)

        def schema(text: str) -> pa.Schema:
            return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))

        def key(value):  # JSON has no tuples: a composite key's columns come back as a list
            return value if isinstance(value, str) else tuple(value)

        return cls(
            o["source"], o["stage"], key(o["key"]), key(o["key_type"]), o["parallelism"],
            o["max_parallelism"], schema(o["records"]), schema(o["chunks"]),
        )  # fmt: skip

    def chunk_rows(self, table: pa.Table) -> pa.RecordBatch:
        """``table`` (records as the reader read them, with positions and bad-record columns)
        routed and cut: what the map side would make of them."""
        n = table.num_rows
        keys = key_array(table, self.key)
        groups = key_groups(keys, self.key_type, self.max_parallelism)
        routing = {
            SOURCE_COLUMN: pa.repeat(pa.scalar(self.source, pa.string()), n),
            STAGE_COLUMN: pa.array(np.full(n, self.stage, np.int32)),
            KEY_COLUMN: keys,
            KEY_GROUP_COLUMN: pa.array(groups.astype(np.int32)),
            SUBTASK_COLUMN: pa.array(
                subtask_for_key_group(groups, self.parallelism, self.max_parallelism)
            ),
        }
        columns = []
        for field in self.chunks:  # another source's columns are null, as in the union
            if field.name in routing:
                column = routing[field.name]
            elif field.name in table.column_names:
                column = table.column(field.name)
            else:
                column = pa.nulls(n, field.type)
            columns.append(column.cast(field.type))
        return chunk_rows(pa.Table.from_arrays(columns, schema=self.chunks))


def read_chunks(chunks: Iterable[bytes], schema: pa.Schema | None) -> pa.Table:
    """A subtask's records from its Arrow IPC chunks, in log order (by source, partition and
    position), whatever order the shuffle delivered the chunks in: a replay sees them in the
    same order. ``schema`` gives the empty table of a subtask that got none."""
    tables = [pa.ipc.open_stream(bytes(c)).read_all() for c in chunks]
    if not tables:
        if schema is None:
            raise ValueError("no chunks and no schema: the empty table has no columns")
        return schema.empty_table()
    return sort_in_log_order(pa.concat_tables(tables, promote_options="permissive"))


def sort_in_log_order(table: pa.Table) -> pa.Table:
    """``table`` by input, partition (or upstream subtask) and position, as far as it has
    those columns."""
    order = [(c, "ascending") for c in (SOURCE_COLUMN, PARTITION_COLUMN, NEXT_OFFSET_COLUMN)]
    order = [o for o in order if o[0] in table.column_names]
    return table.sort_by(order) if order else table
