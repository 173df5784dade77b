"""A stage's state and timers as the harness's stores hold them, read without knowing the keys:
every subtask's store scanned (state/state_reader.py for states; the timer sets for timers)."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from cutline.job import KeyedProcess
from cutline.keyed_process import EVENT_TIMERS, PROCESSING_TIMERS, key_columns
from state.rocksdb_store import RocksDBStore
from state.state_reader import scan_state
from state.state_types import KeyCodec
from state.write_buffer import BufferedTransaction

_LAST_MS = 2**63 - 1  # every timer is due by then


def state_entries(
    stores: Sequence[RocksDBStore], stage: KeyedProcess, name: str, max_parallelism: int
) -> pa.Table:
    """Every entry of state ``name`` of ``stage`` over its subtasks' ``stores``, in ``cutline
    state read``'s columns (entries expired but not yet cleaned up included)."""
    spec = next(s for s in stage.function.states if s.name == name)
    names = key_columns(stage.key_column)
    codec = KeyCodec(stage.key_type, max_parallelism, names if len(names) > 1 else ())
    return pa.concat_tables([scan_state(store, spec, codec, names) for store in stores])


def registered_timers(
    stores: Sequence[RocksDBStore], stage: KeyedProcess, max_parallelism: int
) -> pa.Table:
    """The timers registered and not fired of ``stage`` over its subtasks' ``stores``: its key
    column(s), ``timestamp`` and ``domain``, in timestamp order."""
    codec = KeyCodec(stage.key_type, max_parallelism, key_columns(stage.key_column))
    parts = []
    for store in stores:
        txn = BufferedTransaction(store)  # read, never committed
        for timer_set, domain in ((EVENT_TIMERS, "event"), (PROCESSING_TIMERS, "processing")):
            due = txn.due_timers(timer_set, _LAST_MS)
            keys = codec.decode([k for _, _, k in due])
            if isinstance(stage.key_column, str):
                columns = {stage.key_column: keys}
            else:
                columns = dict(zip(stage.key_column, keys.flatten(), strict=True))
            columns["timestamp"] = pa.array([t for t, _, _ in due], pa.int64())
            columns["domain"] = pa.array([domain] * len(due), pa.string())
            parts.append(pa.table(columns))
    table = pa.concat_tables(parts)
    return table.sort_by([("timestamp", "ascending"), ("domain", "ascending")])
