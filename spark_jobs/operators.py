"""Keyed operators, vectorised over Arrow tables with RocksDB state (state/).

An operator processes one subtask's records of one micro-batch: one Arrow group-by, one multi-get
of the touched keys' state, numpy arithmetic, one write batch. Never a Python call per record on
the state path beyond building the key bytes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.job import KeyedAggregate
from state.rocksdb_store import RocksDBStore, RocksDBTransaction

KEY_GROUP_COLUMN = "_kg"


def key_bytes(column: pa.Array, key_type: str) -> list[bytes]:
    """Keys as the bytes stored in RocksDB: UTF-8 for strings, big-endian for integers."""
    if key_type in ("string", "binary"):
        return column.cast(pa.binary()).to_pylist()
    width = 4 if key_type == "int" else 8
    raw = column.to_numpy(zero_copy_only=False).astype(f">i{width}").tobytes()
    return [raw[i : i + width] for i in range(0, len(raw), width)]


class KeyedAggregateOperator:
    """Running count/sum/min/max per key; emits the new aggregates of every touched key."""

    def __init__(self, spec: KeyedAggregate) -> None:
        self.spec = spec
        self.outputs = list(spec.aggregates)
        self.dtype = np.dtype(
            [(out, "<i8" if fn == "count" else "<f8") for out, (fn, _) in spec.aggregates.items()]
        )

    def output_schema(self, key_type: pa.DataType) -> pa.Schema:
        fields = [pa.field(self.spec.key, key_type)]
        for out in self.outputs:
            kind = self.dtype[out]
            fields.append(pa.field(out, pa.int64() if kind == np.int64 else pa.float64()))
        return pa.schema(fields)

    def apply(self, store: RocksDBStore, txn: RocksDBTransaction, table: pa.Table) -> pa.Table:
        spec = self.spec
        if table.num_rows == 0:
            return self.output_schema(table.schema.field(spec.key).type).empty_table()
        if table.column(spec.key).null_count:
            raise ValueError(
                f"operator {spec.name!r}: {table.column(spec.key).null_count} "
                f"records have a null key {spec.key!r}"
            )
        # (input column, Arrow aggregate, output column); Arrow names results "<col>_<fn>".
        aggs = [
            ([], "count_all", out) if fn == "count" else (col, fn, out)
            for out, (fn, col) in spec.aggregates.items()
        ]
        grouped = table.group_by([spec.key, KEY_GROUP_COLUMN], use_threads=False).aggregate(
            [(c, f) for c, f, _ in aggs]
        )
        keys = grouped.column(spec.key).combine_chunks()
        groups = grouped.column(KEY_GROUP_COLUMN).to_numpy()
        kbytes = key_bytes(keys, spec.key_type)
        old = store.get_many(spec.name, groups, kbytes)
        present = np.fromiter((v is not None for v in old), bool, len(old))
        state = np.zeros(len(old), self.dtype)
        if present.any():
            state[present] = np.frombuffer(b"".join(v for v in old if v is not None), self.dtype)
        new = np.empty(len(old), self.dtype)
        for c, f, out in aggs:
            batch = grouped.column(f"{c}_{f}" if c else f).to_numpy().astype(self.dtype[out])
            prev = state[out]
            if f in ("count_all", "sum"):
                new[out] = prev + batch
            elif f == "min":
                new[out] = np.where(present, np.minimum(prev, batch), batch)
            else:
                new[out] = np.where(present, np.maximum(prev, batch), batch)
        raw = new.tobytes()
        size = self.dtype.itemsize
        txn.put(spec.name, groups, kbytes, [raw[i : i + size] for i in range(0, len(raw), size)])
        columns = [keys] + [pa.array(new[out]) for out in self.outputs]
        return pa.Table.from_arrays(columns, schema=self.output_schema(keys.type))


def drop_markers(table: pa.Table, marker_column: str) -> pa.Table:
    """Remove the one-per-subtask marker rows that make every subtask run each micro-batch."""
    if marker_column not in table.column_names:
        return table
    return table.filter(pc.invert(pc.fill_null(table.column(marker_column), False)))
