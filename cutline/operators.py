"""The library operators: :func:`KeyedAggregate`, :func:`WindowedAggregate` and
:func:`EnrichWithLatest`, each a :class:`KeyedProcess` stage running a
:class:`KeyedProcessFunction` written on the public API (the ``cutline`` package) alone, as a user's
function would be. The runtime knows no operator but the function it calls.

They stay vectorised: Arrow group-bys, one multi-get per state per micro-batch, numpy arithmetic
on packed aggregates, and writes into the micro-batch's one write batch.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.job import JobDefinitionError, KeyedProcess
from cutline.keyed_process import SOURCE_COLUMN, KeyedContext, KeyedProcessFunction
from state.state_types import MapStateSpec, ValueStateSpec

AGGREGATES = ("count", "sum", "min", "max", "last")
_OUTPUT = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,62}")
_SEP = "\x1f"  # joins the table fields of EnrichWithLatest into one stored value
_NULL_LEN = 0xFFFF_FFFF  # the stored length of a null ``last`` value
_NO_TIME = -(2**63)  # a table record without an event time: older than any with one


def _check_aggregates(
    where: str, aggregates: dict[str, tuple[str, str | None]], event_time: str | None = None
) -> None:
    """``event_time`` orders ``last``; ``None`` means the operator does not support ``last``."""
    if not aggregates:
        raise JobDefinitionError(f"{where}: aggregates must name at least one aggregate")
    for out, (fn, col) in aggregates.items():
        if not isinstance(out, str) or not _OUTPUT.fullmatch(out):
            raise JobDefinitionError(
                f"{where}: aggregates output column {out!r} must start with a letter and hold "
                "only letters, digits and '_' (columns starting with '_' are the runtime's)"
            )
        if fn not in AGGREGATES:
            raise JobDefinitionError(
                f"{where}: aggregates[{out!r}] function must be one of {AGGREGATES}, got {fn!r}"
            )
        if fn != "count" and not col:
            raise JobDefinitionError(f"{where}: aggregates[{out!r}] needs an input column")
        if fn == "last" and not event_time:
            raise JobDefinitionError(
                f"{where}: aggregates[{out!r}]: 'last' is supported by KeyedAggregate with an "
                "event_time column to order by"
            )


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
        form = ",".join(f"{out}={fn}({col or ''})" for out, (fn, col) in aggregates.items())
        self.encoding = f"aggregates<{form}>/v1"  # the packed layout, in the state's fingerprint

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Aggregates) and (self.encoding, self.event_time) == (
            other.encoding,
            other.event_time,
        )

    __hash__ = None  # configuration is compared, not hashed

    def prepare(self, table: pa.Table) -> pa.Table:
        """The batch in the order ``last`` follows: event time, ties in arrival order (the
        records arrive in log order, and the sort is stable)."""
        if not self.last:
            return table
        for col, _ in self.last:
            if not (pa.types.is_string(t := table.schema.field(col).type) or pa.types.is_binary(t)):
                raise JobDefinitionError(
                    f"aggregate 'last' of {col!r} needs a string or binary column"
                )
        return table.sort_by([(self.event_time, "ascending")])

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

    def unpack(self, stored: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """The fixed-width records of stored values (a binary array, null where a key has
        none: zeros), and which keys have one."""
        stored = _binary(stored)
        present = np.asarray(stored.is_valid())
        state = np.zeros(len(stored), self.dtype)
        if present.any():  # each value's first bytes, laid end to end (nulls take none)
            heads = pc.binary_slice(stored, 0, self.dtype.itemsize)
            starts, data = _starts(heads)
            first, size = int(starts[0]), int(present.sum()) * self.dtype.itemsize
            state[present] = data[first : first + size].view(self.dtype)
        return state, present

    def merge(
        self, old: pa.Array, grouped: pa.Table
    ) -> tuple[pa.Array, dict[str, pa.Array], np.ndarray]:
        """The new stored values (a binary array), the new aggregates as output columns, and
        which keys had state before. ``old``: the stored values, null where a key has none."""
        n, size = len(old), self.dtype.itemsize
        state, present = self.unpack(old)
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
            return _fixed(new), columns, present

        at = grouped.column(f"{self.event_time}_max").to_numpy()
        take = ~present | (at >= state["_last_at"])  # ties: the later micro-batch wins
        new["_last_at"] = np.where(take, at, state["_last_at"])
        starts, data = _starts(_binary(old))
        position = starts + size  # the ``last`` values follow the fixed record, in order
        kept = present & ~take  # keys whose stored values stay: only theirs are read
        chosen_values = []
        for col, out in self.last:
            lens = state[f"_len_{out}"].astype(np.int64)
            lens[~present | (lens == _NULL_LEN)] = 0
            read = kept & (state[f"_len_{out}"] != _NULL_LEN)
            was = _slices(data, position, np.where(read, lens, 0), ~read)
            position = position + lens
            batch = _binary(grouped.column(f"{col}_last"))
            chosen = pc.if_else(pa.array(take), batch, was)
            chosen_lens = pc.fill_null(pc.binary_length(chosen), 0).to_numpy()
            new[f"_len_{out}"] = np.where(np.asarray(chosen.is_null()), _NULL_LEN, chosen_lens)
            chosen_values.append(chosen)
            columns[out] = chosen.cast(grouped.column(f"{col}_last").type)
        packed = pc.binary_join_element_wise(
            _fixed(new), *chosen_values, b"", null_handling="replace", null_replacement=b""
        )
        return packed, columns, present


def _binary(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``values`` as one binary array."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    return values if values.type == pa.binary() else values.cast(pa.binary())


def _starts(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Where each value of a binary array starts in its data, and the data as bytes."""
    _, offsets, data = values.buffers()
    if offsets is None:  # an empty array may have no buffers
        return np.zeros(len(values), np.int64), np.zeros(0, np.uint8)
    offsets = np.frombuffer(offsets, np.int32)
    starts = offsets[values.offset : values.offset + len(values)].astype(np.int64)
    return starts, np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)


def _slices(data: np.ndarray, starts: np.ndarray, lens: np.ndarray, null: np.ndarray) -> pa.Array:
    """A binary array of ``data[starts[i] : starts[i] + lens[i]]`` (null where ``null``)."""
    offsets = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    picked = data[np.arange(offsets[-1]) - np.repeat(offsets[:-1] - starts, lens)]
    array = pa.BinaryArray.from_buffers(
        pa.binary(),
        len(lens),
        [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(picked)],
    )
    return pc.if_else(pa.array(null), pa.scalar(None, pa.binary()), array)


def _fixed(records: np.ndarray) -> pa.Array:
    """Packed fixed-width records, one binary value each."""
    width = records.dtype.itemsize
    fixed = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(width), len(records), [None, pa.py_buffer(records.tobytes())]
    )
    return fixed.cast(pa.binary())


def _columns(key: str | tuple[str, ...]) -> list[str]:
    """A key's columns (a composite key has several)."""
    return [key] if isinstance(key, str) else list(key)


class RunningAggregates(KeyedProcessFunction):
    """Running aggregates per key, one packed binary value each; emits the new aggregates of
    every key a micro-batch touched."""

    def __init__(
        self,
        key: str | tuple[str, ...],
        aggregates: dict[str, tuple[str, str | None]],
        event_time: str | None,
    ) -> None:
        self.key = key
        self.aggs = _Aggregates(aggregates, event_time)
        self.states = (ValueStateSpec("aggregates", pa.binary(), encoding=self.aggs.encoding),)

    def process_batch(self, records: pa.Table, ctx: KeyedContext) -> pa.Table:
        grouped = (
            self.aggs.prepare(records)
            .group_by(_columns(self.key), use_threads=False)
            .aggregate(self.aggs.arrow_aggregations())
        )
        keys = ctx.key_of(grouped)
        state = ctx.state("aggregates")
        values, columns, _ = self.aggs.merge(state.get(keys), grouped)
        state.update(keys, values)
        out = {c: grouped.column(c) for c in _columns(self.key)}
        out.update({f.name: columns[f.name] for f in self.aggs.fields(records.schema)})
        return pa.table(out)


class TumblingWindows(KeyedProcessFunction):
    """Tumbling event-time windows per key: a map from window start to its packed aggregates,
    and an event-time timer at each window's last millisecond that emits and drops it. Records
    of a window the watermark has passed are late: dropped and counted."""

    def __init__(
        self,
        key: str | tuple[str, ...],
        event_time: str,
        window_ms: int,
        aggregates: dict[str, tuple[str, str | None]],
    ) -> None:
        self.key, self.event_time, self.window_ms = key, event_time, window_ms
        self.aggs = _Aggregates(aggregates)
        encoding = f"{self.aggs.encoding},{window_ms}ms"
        self.states = (
            MapStateSpec("windows", pa.binary(), key_type=pa.int64(), encoding=encoding),
        )

    def on_timers(self, timers: pa.Table, ctx: KeyedContext) -> pa.Table:
        keys = ctx.key_of(timers)
        starts = pc.subtract(timers.column("timestamp"), self.window_ms - 1)
        windows = ctx.state("windows")
        packed, _ = self.aggs.unpack(windows.get(keys, starts))
        windows.remove(keys, starts)
        columns = {c: timers.column(c) for c in _columns(self.key)}
        columns.update(window_start=starts, window_end=pc.add(starts, self.window_ms))
        columns.update({f.name: pa.array(packed[f.name]) for f in self.aggs.fields()})
        return pa.table(columns)

    def process_batch(self, records: pa.Table, ctx: KeyedContext) -> None:
        ts = records.column(self.event_time).to_numpy(zero_copy_only=False).astype(np.int64)
        starts = ts - np.mod(ts, self.window_ms)
        last_ms = starts + self.window_ms - 1
        on_time = np.ones(len(ts), bool) if ctx.watermark is None else last_ms > ctx.watermark
        ctx.record_late(int((~on_time).sum()))
        records = records.append_column("_window", pa.array(starts)).filter(pa.array(on_time))
        if records.num_rows == 0:
            return None
        grouped = records.group_by([*_columns(self.key), "_window"], use_threads=False).aggregate(
            self.aggs.arrow_aggregations()
        )
        keys, wstarts = ctx.key_of(grouped), grouped.column("_window")
        windows = ctx.state("windows")
        values, _, present = self.aggs.merge(windows.get(keys, wstarts), grouped)
        windows.put(keys, wstarts, values)
        fresh = pa.array(~present)
        new_starts = wstarts.filter(fresh).to_numpy()
        ctx.register_event_timers(keys.filter(fresh), new_starts + self.window_ms - 1)
        return None


class LatestOf(KeyedProcessFunction):
    """Two inputs: every ``stream`` record with ``fields`` of the latest ``table`` record of its
    key by event time ``table_time`` (ties: the later micro-batch, then the later log position;
    a record without an event time never replaces one with). Within a micro-batch the table side
    is applied first. The stored value is the event time it is as of, then the fields."""

    def __init__(
        self,
        stream: str,
        table: str,
        key: str | tuple[str, ...],
        fields: tuple[str, ...],
        table_time: str,
    ) -> None:
        self.stream, self.table, self.key = stream, table, key
        self.fields, self.table_time = fields, table_time
        encoding = f"latest<{table_time};{','.join(fields)}>/v2"
        self.states = (ValueStateSpec("latest", pa.string(), encoding=encoding),)

    def process_batch(self, records: pa.Table, ctx: KeyedContext) -> pa.Table:
        source = records.column(SOURCE_COLUMN)
        updates = records.filter(pc.equal(source, self.table))
        stream = records.filter(pc.equal(source, self.stream)).drop_columns([SOURCE_COLUMN])
        latest = ctx.state("latest")
        if updates.num_rows:
            self._update(updates, ctx)
        if stream.num_rows == 0:
            return stream
        parts = pc.split_pattern(latest.get(ctx.key_of(stream)), _SEP)
        # the union of both inputs carries the table's columns (null on stream records)
        types = {f: stream.schema.field(f).type for f in self.fields if f in stream.column_names}
        out = stream.drop_columns(list(types))
        for i, name in enumerate(self.fields, start=1):
            value = pc.list_element(parts, i)
            out = out.append_column(name, value.cast(types[name]) if name in types else value)
        return out

    def _update(self, updates: pa.Table, ctx: KeyedContext) -> None:
        """Store, per key, the batch's latest record unless the stored one is later."""
        at = pc.fill_null(pc.cast(updates.column(self.table_time), pa.int64()), _NO_TIME)
        order = pc.sort_indices(at)  # stable: equal event times keep their arrival order
        ranked = updates.take(order)
        columns = _columns(self.key)
        last = (
            ranked.select(columns)
            .append_column("_pos", pa.array(np.arange(ranked.num_rows)))
            .group_by(columns, use_threads=False)
            .aggregate([("_pos", "max")])
            .column("_pos_max")
        )
        picked, at = ranked.take(last), at.take(order).take(last)
        keys, latest = ctx.key_of(picked), ctx.state("latest")
        held = pc.list_element(pc.split_pattern(latest.get(keys), _SEP, max_splits=1), 0)
        newer = pc.fill_null(pc.greater_equal(at, pc.cast(held, pa.int64())), True)
        values = [pc.cast(at, pa.string())]
        values += [pc.fill_null(pc.cast(picked.column(f), pa.string()), "") for f in self.fields]
        joined = pc.binary_join_element_wise(*values, _SEP)
        latest.update(keys.filter(newer), joined.filter(newer))


def KeyedAggregate(
    name: str,
    source: str,
    key: str | tuple[str, ...],
    key_type: str | tuple[str, ...],
    aggregates: dict[str, tuple[str, str | None]],
    event_time: str | None = None,
    uid: str = "",
) -> KeyedProcess:
    """Per key (a column, or a tuple of columns with ``key_type`` the tuple of their types),
    running aggregates of value columns: ``aggregates`` maps an output column to
    ``(function, input column)``, function one of count, sum, min, max, last (``count`` takes no
    column). ``last`` keeps the value of the key's latest record by ``event_time`` (ties: the
    later micro-batch, then the later log position), so replays give the same answer. Emits the
    updated aggregates of every key a micro-batch touched."""
    _check_aggregates(f"stage {name!r}", aggregates, event_time)
    function = RunningAggregates(key, aggregates, event_time)
    return KeyedProcess(name, {source: key}, key_type, function, uid=uid)


def WindowedAggregate(
    name: str,
    source: str,
    key: str | tuple[str, ...],
    key_type: str | tuple[str, ...],
    event_time: str,
    window_ms: int,
    out_of_orderness_ms: int,
    aggregates: dict[str, tuple[str, str | None]],
    uid: str = "",
    idle_timeout_ms: int | None = 60_000,
) -> KeyedProcess:
    """Tumbling event-time windows of ``window_ms`` per key. The watermark is per input
    partition, trailing each one's largest event time by ``out_of_orderness_ms``, idle
    partitions left out after ``idle_timeout_ms`` (see :class:`KeyedProcess`); a window is
    emitted once the watermark passes its end, and its state and timer are then dropped.
    Records for an already emitted window are late: they are dropped and counted."""
    _check_aggregates(f"stage {name!r}", aggregates)
    if window_ms < 1:
        raise JobDefinitionError(f"stage {name!r}: window_ms must be >= 1")
    function = TumblingWindows(key, event_time, window_ms, aggregates)
    return KeyedProcess(
        name,
        {source: key},
        key_type,
        function,
        event_time=event_time,
        out_of_orderness_ms=out_of_orderness_ms,
        uid=uid,
        idle_timeout_ms=idle_timeout_ms,
    )


def EnrichWithLatest(
    name: str,
    stream: str,
    table: str,
    key: str | tuple[str, ...],
    key_type: str | tuple[str, ...],
    fields: tuple[str, ...],
    table_time: str,
    uid: str = "",
) -> KeyedProcess:
    """Two inputs cut at the same barrier: every record of ``stream`` is emitted with
    ``fields`` of the latest record of ``table`` for the same key by event time ``table_time``
    (ties: the later micro-batch, then the later log position), whatever order the table's
    records arrive in. Within a micro-batch, the table side is applied before the stream side."""
    if stream == table:
        raise JobDefinitionError(f"stage {name!r}: stream and table must differ")
    if not fields:
        raise JobDefinitionError(f"stage {name!r}: fields must name at least one field")
    function = LatestOf(stream, table, key, tuple(fields), table_time)
    return KeyedProcess(name, {stream: key, table: key}, key_type, function, uid=uid)
