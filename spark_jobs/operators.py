"""The built-in keyed operators, vectorised over Arrow tables with RocksDB state (state/), and
:func:`make_operator`, which picks the operator of a stage (a user's :class:`KeyedProcess` stage
runs in spark_jobs/keyed_process.py).

An operator processes one subtask's records of one micro-batch: Arrow group-bys, one multi-get of
the touched keys' state, numpy arithmetic, one write batch. The state path never makes a Python
call per record beyond building key bytes.

Every operator's ``apply(store, table, watermark, processing_time)`` gets the subtask's records
(with ``_kg``, the key group, and ``_source``), the watermark as of the end of the previous
micro-batch, and returns an :class:`OperatorResult`. The built-in operators commit their own
write batch and the subtask commits its progress next; a task that dies in between fails the
attempt (tasks are not retried), which then restores from a checkpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.job import (
    EnrichWithLatest,
    KeyedAggregate,
    KeyedProcess,
    Operator,
    WindowedAggregate,
)
from spark_jobs.keyed_process import OperatorResult, ProcessOperator
from spark_jobs.local_log import NEXT_OFFSET_COLUMN, PARTITION_COLUMN
from state.keygroups import DEFAULT_MAX_PARALLELISM
from state.state_types import key_bytes

if TYPE_CHECKING:  # rocksdict is loaded only where state lives: in the executors' tasks
    from state.rocksdb_store import RocksDBStore

KEY_GROUP_COLUMN = "_kg"
SOURCE_COLUMN = "_source"
_SEP = "\x1f"  # joins the table fields of EnrichWithLatest into one stored value


def _split(raw: bytes, size: int) -> list[bytes]:
    return [raw[i : i + size] for i in range(0, len(raw), size)]


def _check_keys(name: str, table: pa.Table, key: str) -> None:
    nulls = table.column(key).null_count
    if nulls:
        raise ValueError(f"operator {name!r}: {nulls} records have a null key {key!r}")


def _event_then_log_order(time_column: str) -> list[tuple[str, str]]:
    """Sort keys that put records in event-time order, ties in log order, so that "the latest
    record" is the same on every replay."""
    return [(c, "ascending") for c in (time_column, PARTITION_COLUMN, NEXT_OFFSET_COLUMN)]


_NULL_LEN = 0xFFFF_FFFF  # the stored length of a null ``last`` value


class _Aggregates:
    """Running aggregates of one key packed into one stored value: a fixed-width record (the
    numeric aggregates; with ``last`` aggregates, the event time they are as of and each value's
    length) followed by the ``last`` values' bytes, and how to merge a batch into them."""

    def __init__(
        self, aggregates: dict[str, tuple[str, str | None]], event_time: str | None = None
    ) -> None:
        self.outputs = list(aggregates)
        self.numeric = [
            ([], "count_all", out) if fn == "count" else (col, fn, out)
            for out, (fn, col) in aggregates.items()
            if fn != "last"
        ]
        self.last = [(col, out) for out, (fn, col) in aggregates.items() if fn == "last"]
        self.event_time = event_time
        fields = [(out, "<i8" if f == "count_all" else "<f8") for _, f, out in self.numeric]
        if self.last:
            fields += [("_last_at", "<i8")] + [(f"_len_{out}", "<u4") for _, out in self.last]
        self.dtype = np.dtype(fields)

    def prepare(self, table: pa.Table) -> pa.Table:
        """The batch in the order ``last`` follows: event time, then log position."""
        if not self.last:
            return table
        for col, _ in self.last:
            if not (pa.types.is_string(t := table.schema.field(col).type) or pa.types.is_binary(t)):
                raise ValueError(f"aggregate 'last' of {col!r} needs a string or binary column")
        return table.sort_by(_event_then_log_order(self.event_time))

    def arrow_aggregations(self) -> list[tuple]:
        wanted = [(c, f) for c, f, _ in self.numeric]
        wanted += [(c, "last", pc.ScalarAggregateOptions(skip_nulls=False)) for c, _ in self.last]
        if self.last:
            wanted.append((self.event_time, "max"))
        unique: list[tuple] = []
        for agg in wanted:  # one Arrow aggregate per (column, function)
            if all(agg[:2] != u[:2] for u in unique):
                unique.append(agg)
        return unique

    def fields(self, schema: pa.Schema | None = None) -> list[pa.Field]:
        """The output fields in declaration order (``last`` takes its input's type)."""
        types = {
            out: pa.int64() if f == "count_all" else pa.float64() for _, f, out in self.numeric
        }
        for col, out in self.last:
            types[out] = schema.field(col).type if schema is not None else pa.binary()
        return [pa.field(out, types[out]) for out in self.outputs]

    def merge(
        self, old: list[bytes | None], grouped: pa.Table
    ) -> tuple[list[bytes], dict[str, pa.Array], np.ndarray]:
        """The new stored values, the new aggregates as output columns, and which keys had
        state before."""
        n, size = len(old), self.dtype.itemsize
        present = np.fromiter((v is not None for v in old), bool, n)
        stored = [v for v in old if v is not None]
        state = np.zeros(n, self.dtype)
        if stored:
            fixed = b"".join(v[:size] for v in stored) if self.last else b"".join(stored)
            state[present] = np.frombuffer(fixed, self.dtype)
        new = np.empty(n, self.dtype)
        for c, f, out in self.numeric:
            batch = grouped.column(f"{c}_{f}" if c else f).to_numpy().astype(self.dtype[out])
            prev = state[out]
            if f in ("count_all", "sum"):
                new[out] = prev + batch
            elif f == "min":
                new[out] = np.where(present, np.minimum(prev, batch), batch)
            else:
                new[out] = np.where(present, np.maximum(prev, batch), batch)
        columns = {out: pa.array(new[out]) for _, _, out in self.numeric}
        if not self.last:
            return _split(new.tobytes(), size), columns, present

        at = grouped.column(f"{self.event_time}_max").to_numpy()
        take = ~present | (at >= state["_last_at"])  # ties: the later micro-batch wins
        new["_last_at"] = np.where(take, at, state["_last_at"])
        tails = iter(v[size:] for v in stored)
        old_tail = [next(tails) if p else b"" for p in present.tolist()]
        offset = np.zeros(n, np.int64)
        values: list[list[bytes | None]] = []
        for col, out in self.last:
            lens = state[f"_len_{out}"].astype(np.int64)
            null = lens == _NULL_LEN
            lens[null] = 0
            starts, ends = offset.tolist(), (offset + lens).tolist()
            offset += lens
            was = [
                None if z else t[a:b]
                for t, a, b, z in zip(old_tail, starts, ends, null.tolist(), strict=True)
            ]
            batch = grouped.column(f"{col}_last").cast(pa.binary()).to_pylist()
            chosen = [b if t else w for b, w, t in zip(batch, was, take.tolist(), strict=True)]
            new[f"_len_{out}"] = [_NULL_LEN if v is None else len(v) for v in chosen]
            values.append(chosen)
            columns[out] = pa.array(chosen, pa.binary()).cast(grouped.column(f"{col}_last").type)
        packed = [
            f + b"".join(v for v in parts if v is not None)
            for f, *parts in zip(_split(new.tobytes(), size), *values, strict=True)
        ]
        return packed, columns, present


class KeyedAggregateOperator:
    """Running aggregates per key; emits the new aggregates of every touched key."""

    def __init__(self, spec: KeyedAggregate) -> None:
        self.spec = spec
        self.aggs = _Aggregates(spec.aggregates, spec.event_time)

    def apply(
        self, store: RocksDBStore, table: pa.Table, watermark: int | None, processing_time: int = 0
    ) -> OperatorResult:
        spec = self.spec
        fields = self.aggs.fields(table.schema)
        if table.num_rows == 0:
            return OperatorResult(pa.schema([table.schema.field(spec.key), *fields]).empty_table())
        _check_keys(spec.name, table, spec.key)
        grouped = (
            self.aggs.prepare(table)
            .group_by([spec.key, KEY_GROUP_COLUMN], use_threads=False)
            .aggregate(self.aggs.arrow_aggregations())
        )
        keys = grouped.column(spec.key).combine_chunks()
        groups = grouped.column(KEY_GROUP_COLUMN).to_numpy()
        kbytes = key_bytes(keys, spec.key_type)
        values, columns, _ = self.aggs.merge(store.get_many(spec.name, groups, kbytes), grouped)
        txn = store.begin()
        txn.put(spec.name, groups, kbytes, values)
        txn.commit()
        schema = pa.schema([pa.field(spec.key, keys.type), *fields])
        return OperatorResult(
            pa.Table.from_arrays([keys] + [columns[f.name] for f in fields], schema=schema)
        )


class WindowedAggregateOperator:
    """Tumbling event-time windows per key, fired by timers when the watermark passes."""

    def __init__(self, spec: WindowedAggregate) -> None:
        self.spec = spec
        self.aggs = _Aggregates(spec.aggregates)
        self.schema = pa.schema(
            [
                pa.field(spec.key, pa.string() if spec.key_type == "string" else pa.int64()),
                pa.field("window_start", pa.int64()),
                pa.field("window_end", pa.int64()),
                *self.aggs.fields(),
            ]
        )

    def _state_keys(self, kbytes: list[bytes], starts: np.ndarray) -> list[bytes]:
        # Sign bit flipped: big-endian bytes then sort like the signed values.
        flipped = starts.astype(np.int64).view(np.uint64) ^ np.uint64(1 << 63)
        starts_raw = _split(flipped.astype(">u8").tobytes(), 8)
        return [len(k).to_bytes(4, "big") + k + s for k, s in zip(kbytes, starts_raw, strict=True)]

    def _fire(self, store: RocksDBStore, watermark: int | None) -> pa.Table:
        spec = self.spec
        due = store.due_timers(watermark) if watermark is not None else []
        if not due:
            return self.schema.empty_table()
        groups = [kg for _, kg, _ in due]
        skeys = [k for _, _, k in due]
        values = store.get_many(spec.name, groups, skeys)
        packed = np.frombuffer(b"".join(v or b"" for v in values), self.aggs.dtype)
        keys, starts = [], []
        for k in skeys:
            n = int.from_bytes(k[:4], "big")
            keys.append(k[4 : 4 + n])
            starts.append(int.from_bytes(k[4 + n :], "big") - (1 << 63))
        key_col = (
            pa.array(keys, pa.binary()).cast(pa.string())
            if spec.key_type == "string"
            else pa.array([int.from_bytes(k, "big", signed=True) for k in keys], pa.int64())
        )
        starts_arr = np.asarray(starts, np.int64)
        txn = store.begin()
        txn.delete(spec.name, groups, skeys)
        txn.delete_timers(groups, skeys, [ts for ts, _, _ in due])
        txn.commit()
        columns = [key_col, pa.array(starts_arr), pa.array(starts_arr + spec.window_ms)]
        columns += [pa.array(packed[f.name]) for f in self.aggs.fields()]
        return pa.Table.from_arrays(columns, schema=self.schema)

    def apply(
        self, store: RocksDBStore, table: pa.Table, watermark: int | None, processing_time: int = 0
    ) -> OperatorResult:
        spec = self.spec
        fired = self._fire(store, watermark)  # windows complete as of the previous cut
        if table.num_rows == 0:
            return OperatorResult(fired)
        _check_keys(spec.name, table, spec.key)
        ts = table.column(spec.event_time).to_numpy(zero_copy_only=False).astype(np.int64)
        starts = ts - np.mod(ts, spec.window_ms)
        on_time = (
            np.ones(len(ts), bool)
            if watermark is None
            else (starts + spec.window_ms - 1) > watermark
        )
        late = int((~on_time).sum())
        table = table.append_column("_window", pa.array(starts)).filter(pa.array(on_time))
        result = OperatorResult(fired, late, int(ts.max()))
        if table.num_rows == 0:
            return result
        grouped = table.group_by(
            [spec.key, KEY_GROUP_COLUMN, "_window"], use_threads=False
        ).aggregate(self.aggs.arrow_aggregations())
        groups = grouped.column(KEY_GROUP_COLUMN).to_numpy()
        wstarts = grouped.column("_window").to_numpy()
        skeys = self._state_keys(key_bytes(grouped.column(spec.key), spec.key_type), wstarts)
        values, _, present = self.aggs.merge(store.get_many(spec.name, groups, skeys), grouped)
        txn = store.begin()
        txn.put(spec.name, groups, skeys, values)
        fresh = ~present
        if fresh.any():
            txn.register_timers(
                groups[fresh],
                [k for k, f in zip(skeys, fresh, strict=True) if f],
                (wstarts[fresh] + spec.window_ms - 1).tolist(),
            )
        txn.commit()
        return result


class EnrichOperator:
    """Stream records joined with the latest table record of their key."""

    def __init__(self, spec: EnrichWithLatest) -> None:
        self.spec = spec

    def apply(
        self, store: RocksDBStore, table: pa.Table, watermark: int | None, processing_time: int = 0
    ) -> OperatorResult:
        spec = self.spec
        if table.num_rows == 0:
            return OperatorResult(pa.table({}))
        _check_keys(spec.name, table, spec.key)
        source = table.column(SOURCE_COLUMN)
        updates = table.filter(pc.equal(source, spec.table))
        stream = table.filter(pc.equal(source, spec.stream))
        if updates.num_rows:
            self._apply_updates(store, updates)
        if stream.num_rows == 0:
            return OperatorResult(stream.slice(0, 0))
        stored = store.get_many(
            spec.name,
            stream.column(KEY_GROUP_COLUMN).to_numpy(),
            key_bytes(stream.column(spec.key), spec.key_type),
        )
        parts = pc.split_pattern(pa.array(stored, pa.binary()).cast(pa.string()), _SEP)
        # The union of both inputs carries the table's columns (null on stream records).
        types = {f: stream.schema.field(f).type for f in spec.fields if f in stream.column_names}
        out = stream.drop_columns(list(types))
        for i, name in enumerate(spec.fields):
            value = pc.list_element(parts, i)
            out = out.append_column(name, value.cast(types[name]) if name in types else value)
        return OperatorResult(out)

    def _apply_updates(self, store: RocksDBStore, updates: pa.Table) -> None:
        spec = self.spec
        # The latest record per key: by event time, then by log position (deterministic).
        order = pc.sort_indices(
            updates, [(spec.key, "ascending"), *_event_then_log_order(spec.table_time)]
        )
        updates = updates.take(order)
        rows = pa.array(np.arange(updates.num_rows))
        last = (
            updates.append_column("_row", rows)
            .group_by(spec.key, use_threads=False)
            .aggregate([("_row", "max")])
        )
        latest = updates.take(last.column("_row_max"))
        values = pc.binary_join_element_wise(
            *[pc.fill_null(pc.cast(latest.column(f), pa.string()), "") for f in spec.fields], _SEP
        )
        txn = store.begin()
        txn.put(
            spec.name,
            latest.column(KEY_GROUP_COLUMN).to_numpy(),
            key_bytes(latest.column(spec.key), spec.key_type),
            [v.encode() for v in values.to_pylist()],
        )
        txn.commit()


def make_operator(spec: Operator, max_parallelism: int = DEFAULT_MAX_PARALLELISM):
    """The operator that runs ``spec`` in a subtask: ``apply(store, table, watermark,
    processing_time) -> OperatorResult``."""
    if isinstance(spec, KeyedProcess):
        return ProcessOperator(spec, max_parallelism)
    if isinstance(spec, KeyedAggregate):
        return KeyedAggregateOperator(spec)
    if isinstance(spec, WindowedAggregate):
        return WindowedAggregateOperator(spec)
    return EnrichOperator(spec)
