"""A stage's state and timers as the harness's stores hold them, read without knowing the keys:
every subtask's store scanned (state/state_reader.py for states; the timer sets for timers)."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from cutline.job import KeyedProcess
from cutline.keyed_process import TIMER_SETS, key_columns
from state.rocksdb_store import RocksDBStore
from state.state_reader import scan_state
from state.state_timers import DOMAIN, TIMESTAMP, scan_timers
from state.state_types import KeyCodec
from state.state_writer import KEY_GROUP


def state_entries(
    stores: Sequence[RocksDBStore], stage: KeyedProcess, name: str, max_parallelism: int
) -> pa.Table:
    """Every entry of state ``name`` of ``stage`` over its subtasks' ``stores``, in ``cutline
    state read``'s columns (entries expired but not yet cleaned up included)."""
    spec = next(s for s in stage.function.states if s.name == name)
    codec, names = _codec(stage, max_parallelism)
    return pa.concat_tables([scan_state(store, spec, codec, names) for store in stores])


def registered_timers(
    stores: Sequence[RocksDBStore], stage: KeyedProcess, max_parallelism: int
) -> pa.Table:
    """The timers registered and not fired of ``stage`` over its subtasks' ``stores``: its key
    column(s), ``timestamp`` and ``domain``, in timestamp order."""
    codec, names = _codec(stage, max_parallelism)
    parts = [scan_timers(store, TIMER_SETS, codec, names) for store in stores]
    table = pa.concat_tables(parts).drop_columns([KEY_GROUP])
    return table.sort_by([(TIMESTAMP, "ascending"), (DOMAIN, "ascending")])


def _codec(stage: KeyedProcess, max_parallelism: int) -> tuple[KeyCodec, tuple[str, ...]]:
    names = key_columns(stage.key_column)
    return KeyCodec(stage.key_type, max_parallelism, names if len(names) > 1 else ()), names
