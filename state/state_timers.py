"""A stage's registered timers as a table, read out of a checkpoint and written into a savepoint:
the timers half of the state processor (state/state_reader.py and state/state_writer.py do the
states).

The table has the key's column(s), ``key_group`` (read; optional when written, and then it must
be the key's), ``timestamp`` (epoch ms, int64) and ``domain`` (a timer set's name in the caller's
``sets``: ``"event"`` or ``"processing"`` for a keyed function's timers). Written, the timers are
their domains' whole content in each subtask's key groups, one per (key, timestamp, domain), as
registering them from a function stores them (state/write_buffer.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state.manifest import CheckpointManifest
from state.paths import JobLayout
from state.rocksdb_store import RocksDBStore
from state.state_reader import restored_stores
from state.state_types import KeyCodec, StateAccessError
from state.state_writer import (
    KEY_GROUP,
    StateWriteError,
    check_columns,
    check_key_groups,
    table_keys,
)
from state.storage import DurableStorage
from state.write_buffer import BufferedTransaction

TIMESTAMP, DOMAIN = "timestamp", "domain"
_EVERY = 2**63 - 1  # every timer is due by then


@dataclass(frozen=True)
class EncodedTimers:
    """Timers as stored: per row its timer set, key group, key bytes and timestamp; ``sets``:
    every timer set they replace (those of every domain, given rows or not)."""

    sets: tuple[str, ...]
    names: list[str]
    groups: np.ndarray
    keys: list[bytes]
    stamps: np.ndarray


def scan_timers(
    store: RocksDBStore, sets: Mapping[str, str], codec: KeyCodec, key_names: tuple[str, ...]
) -> pa.Table:
    """The timers registered in ``store`` (``sets``: domain -> timer set name), as a table, in
    timestamp order."""
    txn = BufferedTransaction(store)  # read, never committed
    rows = [(t, g, k, d) for d, name in sets.items() for t, g, k in txn.due_timers(name, _EVERY)]
    decoded = codec.decode([k for _, _, k, _ in rows])
    keys = decoded.flatten() if codec.composite else [decoded]
    table = pa.table(
        {
            **dict(zip(key_names, keys, strict=True)),
            KEY_GROUP: pa.array([g for _, g, _, _ in rows], pa.int32()),
            TIMESTAMP: pa.array([t for t, _, _, _ in rows], pa.int64()),
            DOMAIN: pa.array([d for _, _, _, d in rows], pa.string()),
        }
    )
    return table.sort_by([(TIMESTAMP, "ascending"), (KEY_GROUP, "ascending")])


def read_timers(
    manifest: CheckpointManifest,
    storage: DurableStorage,
    uid: str,
    sets: Mapping[str, str],
    codec: KeyCodec,
    key_names: tuple[str, ...],
    scratch: Path,
    layout: JobLayout | None = None,
) -> pa.Table:
    """The timers of stage ``uid`` in ``manifest``'s checkpoint (its files in ``storage``, under
    its job's directory or ``layout``'s: a savepoint's), every subtask restored into
    ``scratch`` and scanned."""
    parts = [
        scan_timers(store, sets, codec, key_names)
        for store in restored_stores(manifest, storage, uid, scratch, layout)
    ]
    return pa.concat_tables(parts).sort_by([(TIMESTAMP, "ascending"), (KEY_GROUP, "ascending")])


def encode_timers(
    table: pa.Table,
    sets: Mapping[str, str],
    codec: KeyCodec,
    key_names: tuple[str, ...],
    where: str,
) -> EncodedTimers:
    """``table``'s rows as stored timers; ``where`` (the stage) starts every error's message."""
    check_columns(table, [*key_names, TIMESTAMP, DOMAIN], [KEY_GROUP], "a timers table", where)
    table = table.combine_chunks()
    domains = table.column(DOMAIN).to_pylist()
    unknown = sorted({d for d in domains if d not in sets}, key=str)
    if unknown:
        raise StateWriteError(f"{where}: timer domain(s) {unknown}; the domains are {list(sets)}")
    if table.column(TIMESTAMP).null_count:
        raise StateWriteError(f"{where}: a timer without a timestamp")
    try:
        groups, kbytes = codec.encode(table_keys(table, codec, key_names))
        stamps = pc.cast(table.column(TIMESTAMP), pa.int64()).to_numpy(zero_copy_only=False)
    except (StateAccessError, pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise StateWriteError(f"{where}: {e}") from None
    check_key_groups(table, groups, key_names, where)
    return EncodedTimers(
        tuple(sets.values()), [sets[d] for d in domains], np.asarray(groups), kbytes, stamps
    )


def replace_timers(store: RocksDBStore, timers: EncodedTimers) -> int:
    """Make ``timers`` the whole content of their timer sets in ``store``'s key groups; returns
    the timers written."""
    r = store.key_group_range
    for name in timers.sets:
        store.clear_state(name)
    mine = np.flatnonzero((timers.groups >= r.start) & (timers.groups <= r.end))
    txn = BufferedTransaction(store)
    for name in timers.sets:
        rows = [i for i in mine if timers.names[i] == name]
        if rows:
            txn.set_timers(
                name,
                timers.groups[rows],
                [timers.keys[i] for i in rows],
                timers.stamps[rows].tolist(),
                registered=True,
            )
    txn.commit()
    return len(mine)
