"""The user's keyed logic: :class:`KeyedProcessFunction` (Flink's ``KeyedProcessFunction``, Spark's
``transformWithStateInPandas``), vectorised, and the operator that runs it in a subtask.

A function gets one call per subtask and micro-batch with that subtask's records as one Arrow
table (or a pandas frame: ``use_pandas = True``) and returns the output rows. Through the
:class:`KeyedContext` it reads and writes the keyed states it declares in ``states`` (each call
covers many keys: one multi-get per state, one write batch per micro-batch), registers timers,
and reads the watermark. Per micro-batch, in this order:

1. TTL cleanup: entries whose time to live has passed are deleted (state/user_state.py).
2. ``on_timers``: the event-time timers at or before the watermark (as of the previous cut) and
   the processing-time timers at or before the micro-batch's processing time, in one call, in
   timestamp order; fired timers are deleted first. Timers a callback registers at or before the
   current time fire in the next micro-batch.
3. ``process_batch`` with the records.

Every write of the three steps, and the subtask's progress marker, commit in one RocksDB write
batch. A function that raises fails the attempt with its traceback and the stage named
(:class:`UserFunctionError`, exit 2 through spark_jobs/errors.py's marker: a restore would fail
the same way until the code is fixed).
"""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.errors import UserCodeError
from cutline.sources.base import PARTITION_COLUMN  # a later stage: upstream subtask
from state.backend import StateBackendError
from state.state_types import KeyCodec, StateAccessError, StateSpec
from state.user_state import ListState, MapState, ValueState, expire, open_view
from state.write_buffer import BufferedTransaction

if TYPE_CHECKING:
    import pandas as pd

    from state.rocksdb_store import RocksDBStore

Key = str | tuple[str, ...]  # a key column, or a composite key's columns


def is_pandas_frame(value: object) -> bool:
    """Whether ``value`` is a pandas DataFrame, without importing pandas (a process that never
    imported it holds no frame): the API's modules stay cheap to import where pandas is unused."""
    pd = sys.modules.get("pandas")
    return pd is not None and isinstance(value, pd.DataFrame)


def key_columns(key: Key) -> tuple[str, ...]:
    """The columns of a key."""
    return (key,) if isinstance(key, str) else tuple(key)


SOURCE_COLUMN = "_source"  # in a two-input stage's records: the input each record came from
EVENT_TIMERS = "__event_timers__"
PROCESSING_TIMERS = "__processing_timers__"
TIMER_SETS = {"event": EVENT_TIMERS, "processing": PROCESSING_TIMERS}  # by domain


def partition_event_times(table: pa.Table, event_time: str) -> dict[str, dict[str, int]]:
    """Per input (``_source``) and partition (``_partition``) of ``table``, the largest event
    time (nulls skipped); empty when ``table`` lacks those columns."""
    names = table.column_names
    if SOURCE_COLUMN not in names or PARTITION_COLUMN not in names or not table.num_rows:
        return {}
    grouped = table.group_by([SOURCE_COLUMN, PARTITION_COLUMN]).aggregate([(event_time, "max")])
    out: dict[str, dict[str, int]] = {}
    for src, part, high in zip(
        grouped.column(SOURCE_COLUMN).to_pylist(),
        grouped.column(PARTITION_COLUMN).to_pylist(),
        grouped.column(f"{event_time}_max").to_pylist(),
        strict=True,
    ):
        if high is not None:
            out.setdefault(str(src), {})[str(part)] = int(high)
    return out


class UserFunctionError(UserCodeError):
    """A user function raised; the message names the stage and carries the traceback. Raised in
    a Spark task, it reaches the driver as itself (spark_jobs/errors.py ``carry_to_driver``)."""


@dataclass
class OperatorResult:
    """What a stage returns for one subtask and micro-batch: its output rows, its figures, and
    ``txn``, its still open write batch, which the subtask commits with its progress marker."""

    output: pa.Table
    txn: BufferedTransaction
    late_records: int = 0
    max_event_time: int | None = None
    # per input and partition (``_source``, ``_partition``): the largest event time applied
    event_times: dict[str, dict[str, int]] = field(default_factory=dict)


class KeyedProcessFunction:
    """Subclass it: declare ``states``, implement :meth:`process_batch` (and :meth:`on_timers`
    if you register timers). Instances are shipped to the executors by pickling, so keep their
    attributes to configuration."""

    states: tuple[StateSpec, ...] = ()
    output_schema: pa.Schema | None = None  # the output is cast to it when given
    use_pandas: bool = False  # records and timers as pandas frames instead of Arrow tables

    def __eq__(self, other: object) -> bool:
        """Functions of one class with equal configuration are equal (so are their stages)."""
        return type(self) is type(other) and vars(self) == vars(other)

    __hash__ = None  # configuration is compared, not hashed

    def process_batch(self, records: Any, ctx: KeyedContext) -> Any:
        """This subtask's records of one micro-batch; returns the output rows (or None)."""
        raise NotImplementedError

    def on_timers(self, timers: Any, ctx: KeyedContext) -> Any:
        """Due timers (columns: the key column(s), ``timestamp``, ``domain`` = "event" or
        "processing"), in timestamp order; returns output rows (or None)."""
        return None


class KeyedContext:
    """What a function sees in one micro-batch: its states, timers, the watermark and time."""

    def __init__(
        self,
        stage: str,
        key_column: Key,
        specs: dict[str, StateSpec],
        txn: BufferedTransaction,
        keys: KeyCodec,
        watermark: int | None,
        processing_time: int,
    ) -> None:
        self.stage = stage
        self.key_column = key_column
        self.watermark = watermark  # as of the previous cut; None before the first event time
        self.processing_time = processing_time  # this micro-batch's, in ms since the epoch
        self._specs, self._txn, self._keys = specs, txn, keys
        self.clocks = {"processing": processing_time}
        if watermark is not None:
            self.clocks["event"] = watermark
        self._views: dict[str, ValueState | ListState | MapState] = {}
        self.late_records = 0

    def record_late(self, count: int) -> None:
        """Count ``count`` records the function dropped as late (behind the watermark); the
        figure is summed into each checkpoint's counters."""
        self.late_records += int(count)

    def key_of(self, table: pa.Table | pd.DataFrame) -> pa.Array:
        """The stage's key of every row of ``table`` (records, timers, or a group-by of them; an
        Arrow table or a pandas frame): its key column, or for a composite key the struct array
        of its key columns, which is what the state views and the timer calls take."""
        columns = key_columns(self.key_column)
        if is_pandas_frame(table):
            table = pa.Table.from_pandas(table[list(columns)], preserve_index=False)
        if isinstance(self.key_column, str):
            return table.column(self.key_column).combine_chunks()
        arrays = [table.column(c).combine_chunks() for c in columns]
        return pa.StructArray.from_arrays(arrays, list(columns))

    def state(self, name: str) -> ValueState | ListState | MapState:
        """The view of declared state ``name``."""
        view = self._views.get(name)
        if view is None:
            if name not in self._specs:
                raise StateAccessError(
                    f"stage {self.stage!r} has no state {name!r}; declared: {sorted(self._specs)}"
                )
            view = self._views[name] = open_view(
                self._specs[name], self._txn, self._keys, self.clocks
            )
        return view

    def _timers(self, name: str, keys: pa.Array, timestamps, registered: bool) -> None:
        groups, kb = self._keys.encode(keys)
        stamps = np.asarray(timestamps, np.int64)
        if len(stamps) != len(kb):
            raise StateAccessError(f"{len(kb)} keys but {len(stamps)} timer timestamps")
        self._txn.set_timers(name, groups, kb, stamps.tolist(), registered=registered)

    def register_event_timers(self, keys: pa.Array, timestamps) -> None:
        """One timer per (key, timestamp); it fires once the watermark reaches the timestamp."""
        self._timers(EVENT_TIMERS, keys, timestamps, True)

    def delete_event_timers(self, keys: pa.Array, timestamps) -> None:
        self._timers(EVENT_TIMERS, keys, timestamps, False)

    def register_processing_timers(self, keys: pa.Array, timestamps) -> None:
        """One timer per (key, timestamp); it fires in the first micro-batch at or after it."""
        self._timers(PROCESSING_TIMERS, keys, timestamps, True)

    def delete_processing_timers(self, keys: pa.Array, timestamps) -> None:
        self._timers(PROCESSING_TIMERS, keys, timestamps, False)


class ProcessOperator:
    """Runs a stage's function for one subtask and micro-batch: every stage, the library's
    (cutline/operators.py) and the user's, runs through here."""

    def __init__(self, spec, max_parallelism: int) -> None:
        self.spec = spec
        self.function: KeyedProcessFunction = spec.function
        self.specs = {s.name: s for s in self.function.states}
        self.keys = KeyCodec(spec.key_type, max_parallelism, key_columns(spec.key_column))
        self.expiring = any(s.ttl for s in self.function.states)  # TTL cleanup to run

    def apply(
        self,
        store: RocksDBStore,
        table: pa.Table,
        watermark: int | None,
        processing_time: int,
    ) -> OperatorResult:
        spec = self.spec
        key_column = spec.key_column
        txn = BufferedTransaction(store)
        ctx = KeyedContext(
            spec.name, key_column, self.specs, txn, self.keys, watermark, processing_time
        )
        records = self._records(table)
        max_event_time = None
        if spec.event_time and records.num_rows:
            low, high = pc.min_max(records.column(spec.event_time)).values()
            max_event_time = int(high.as_py())
            if watermark is None:  # the first micro-batch: event-time TTL stamps from its data
                ctx.clocks["event"] = int(low.as_py()) - spec.out_of_orderness_ms
        if self.expiring:
            expire(self.specs, txn, self.keys, ctx.clocks)
        outputs = []
        timers = self._due_timers(txn, ctx)
        if timers.num_rows:
            outputs.append(self._call("on_timers", timers, ctx))
        if records.num_rows:
            outputs.append(self._call("process_batch", records, ctx))
        output = [o for o in outputs if o is not None and o.num_rows]
        result = pa.concat_tables(output, promote_options="permissive") if output else pa.table({})
        timed = max_event_time is not None
        event_times = partition_event_times(table, spec.event_time) if timed else {}
        return OperatorResult(result, txn, ctx.late_records, max_event_time, event_times)

    def _records(self, table: pa.Table) -> pa.Table:
        """The user's columns: every input's own columns, the source name kept as ``_source``
        for two-input stages, the runtime's routing columns dropped."""
        keep = [c for c in table.column_names if not c.startswith("_")]
        if len(self.spec.inputs) > 1 and SOURCE_COLUMN in table.column_names:
            keep.append(SOURCE_COLUMN)
        return table.select(keep)

    def _due_timers(self, txn: BufferedTransaction, ctx: KeyedContext) -> pa.Table:
        fired = []
        limits = [
            (EVENT_TIMERS, "event", ctx.watermark),
            (PROCESSING_TIMERS, "processing", ctx.processing_time),
        ]
        for name, domain, limit in limits:
            if limit is None:
                continue
            due = txn.due_timers(name, limit)
            if due:
                stamps = [t for t, _, _ in due]
                txn.set_timers(
                    name, [g for _, g, _ in due], [k for _, _, k in due], stamps, registered=False
                )
                keys = self._key_columns(self.keys.decode([k for _, _, k in due]))
                keys["timestamp"] = pa.array(stamps, pa.int64())
                keys["domain"] = pa.array([domain] * len(due), pa.string())
                fired.append(pa.table(keys))
        if not fired:
            return pa.table(
                {**self._key_columns(self.keys.decode([])), "timestamp": pa.array([], pa.int64())}
            )
        return pa.concat_tables(fired).sort_by([("timestamp", "ascending")])

    def _key_columns(self, keys: pa.Array) -> dict[str, pa.Array]:
        """Keys as the stage's key column(s)."""
        if isinstance(self.spec.key_column, str):
            return {self.spec.key_column: keys}
        return dict(zip(self.spec.key_column, keys.flatten(), strict=True))

    def _call(self, method: str, table: pa.Table, ctx: KeyedContext) -> pa.Table | None:
        fn = self.function
        arg = table.to_pandas() if fn.use_pandas else table
        try:
            out = getattr(fn, method)(arg, ctx)
        except (StateBackendError, MemoryError):
            raise  # the runtime's failure under the user's call, never the user's
        except Exception as e:
            raise UserFunctionError(
                f"stage {self.spec.name!r} (uid {self.spec.uid!r}, "
                f"{type(fn).__qualname__}.{method}) raised {type(e).__name__}: {e}\n"
                + "".join(traceback.format_exception(e))
            ) from e
        return self._as_table(out, method)

    def _as_table(self, out: Any, method: str) -> pa.Table | None:
        if out is None:
            return None
        if is_pandas_frame(out):
            out = pa.Table.from_pandas(out, preserve_index=False)
        if not isinstance(out, pa.Table):
            raise UserFunctionError(
                f"stage {self.spec.name!r}: {method} returned "
                f"{type(out).__name__}; return a pyarrow Table, a pandas DataFrame or None"
            )
        schema = self.function.output_schema
        if schema is not None:
            try:
                out = out.select(schema.names).cast(schema)
            except (KeyError, pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
                raise UserFunctionError(
                    f"stage {self.spec.name!r}: {method}'s output does not match output_schema: {e}"
                ) from e
        return out
