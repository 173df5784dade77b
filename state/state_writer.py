"""Write one keyed state of one stage from a table: the writing half of Flink's State Processor
API, the inverse of state/state_reader.py.

The table has the columns the reader returns: the key's (one per key column), then by the
state's kind ``value``; ``list_element`` (one row per element, ``list_index`` ordering them if
given); or ``user_map_key`` and ``user_map_value``; and ``expires_at_ms`` for a state with a
TTL. ``key_group`` may be given; it must be the key's. :func:`encode_state` checks the columns
against the state's declaration and encodes every entry with the same codecs a function's
writes use (whole columns at a time). :func:`replace_states` makes them the state's whole
content in one subtask's database: the state's entries in the subtask's key groups are deleted,
the new ones in its key groups written in write batches, with a TTL cleanup timer at each
entry's expiry as a function's write registers one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state.errors import BadInputError
from state.rocksdb_store import RocksDBStore
from state.state_types import KeyCodec, StateAccessError, StateSpec, encode_values
from state.store_encoding import encode_list
from state.user_state import EXPIRY, TTL_TIMERS, ttl_timer_key
from state.write_buffer import BufferedTransaction

KEY_GROUP = "key_group"
EXPIRES = "expires_at_ms"
_KIND_COLUMNS = {
    "value": (["value"], []),
    "list": (["list_element"], ["list_index"]),
    "map": (["user_map_key", "user_map_value"], []),
}
_BATCH = 100_000  # entries per write batch


class StateWriteError(BadInputError):
    """A table cannot be written as a state: its columns, keys or values are not the state's;
    the message names them."""


@dataclass(frozen=True)
class EncodedState:
    """A state's entries as stored: key group, key bytes, map key bytes (a map's), the stored
    value (after its expiry, with a TTL) and the expiry."""

    spec: StateSpec
    groups: np.ndarray
    keys: list[bytes]
    map_keys: list[bytes] | None
    values: list[bytes]
    expiry: np.ndarray | None


def state_columns(spec: StateSpec, key_names: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The columns a table of ``spec`` must have, and those it may have."""
    required, optional = _KIND_COLUMNS[spec.kind]
    required = [*key_names, *required] + ([EXPIRES] if spec.ttl is not None else [])
    return required, [KEY_GROUP, *optional]


def check_columns(
    table: pa.Table, required: list[str], optional: list[str], what: str, where: str
) -> None:
    """``table`` has every ``required`` column and no column but those and ``optional``."""
    missing = [c for c in required if c not in table.column_names]
    unexpected = [c for c in table.column_names if c not in required and c not in optional]
    if missing or unexpected:
        raise StateWriteError(
            f"{where}: {what} has the columns {required}"
            + (f" (and may have {optional})" if optional else "")
            + (f"; missing {missing}" if missing else "")
            + (f"; unexpected {unexpected}" if unexpected else "")
        )


def table_keys(table: pa.Table, codec: KeyCodec, key_names: tuple[str, ...]) -> pa.Array:
    """``table``'s keys: its key column, or a struct of a composite key's columns."""
    if not codec.composite:
        return table.column(key_names[0])
    return pa.StructArray.from_arrays([table.column(n) for n in key_names], list(key_names))


def check_key_groups(
    table: pa.Table, groups: np.ndarray, key_names: tuple[str, ...], where: str
) -> None:
    """A ``key_group`` column, when given, is each key's own (``groups``)."""
    if KEY_GROUP not in table.column_names:
        return
    given = table.column(KEY_GROUP).to_numpy(zero_copy_only=False)
    wrong = np.flatnonzero(given != groups)
    if wrong.size:
        row = int(wrong[0])
        raise StateWriteError(
            f"{where}: key {_key_at(table, key_names, row)} is in key group {groups[row]}, "
            f"not {given[row]} (leave {KEY_GROUP} out: it follows from the key)"
        )


def encode_state(
    table: pa.Table, spec: StateSpec, codec: KeyCodec, key_names: tuple[str, ...], where: str
) -> EncodedState:
    """``table``'s rows as ``spec``'s stored entries; ``where`` (stage and state) starts every
    error's message."""
    required, optional = state_columns(spec, key_names)
    check_columns(table, required, optional, f"a {spec.kind} state's table", where)
    table = table.combine_chunks()
    try:
        groups, kbytes = codec.encode(table_keys(table, codec, key_names))
        if spec.kind == "list":
            table, groups, kbytes = _in_list_order(table, groups, kbytes)
        column = "list_element" if spec.kind == "list" else _KIND_COLUMNS[spec.kind][0][-1]
        values = encode_values(table.column(column), spec.type, where)
        map_keys = (
            encode_values(table.column("user_map_key"), spec.key_type, where)
            if spec.kind == "map"
            else None
        )
    except (StateAccessError, pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise StateWriteError(f"{where}: {e}") from None
    check_key_groups(table, groups, key_names, where)
    expiry = None
    if spec.ttl is not None:
        expiry = table.column(EXPIRES).to_numpy(zero_copy_only=False).astype(np.int64)
    if spec.kind == "list":
        return _lists(spec, groups, kbytes, values, expiry)
    _refuse_repeats(table, key_names, kbytes, map_keys, where)
    if expiry is not None:
        values = _stamped(expiry, values)
    return EncodedState(spec, groups, kbytes, map_keys, values, expiry)


def _in_list_order(table, groups, kbytes):
    """Rows ordered by key, then by ``list_index`` (or as given), so each key's elements are
    consecutive and in order."""
    order = pc.sort_indices(
        pa.table(
            {
                "k": pa.array(kbytes, pa.binary()),
                "i": table.column("list_index")
                if "list_index" in table.column_names
                else pa.array(np.arange(table.num_rows)),
            }
        ),
        sort_keys=[("k", "ascending"), ("i", "ascending")],
    )
    take = order.to_numpy()
    return table.take(order), groups[take], [kbytes[i] for i in take]


def _lists(spec, groups, kbytes, elements, expiry) -> EncodedState:
    """One stored list per key from its consecutive elements."""
    starts = [i for i in range(len(kbytes)) if i == 0 or kbytes[i] != kbytes[i - 1]]
    bounds = [*starts, len(kbytes)]
    values = [encode_list(elements[a:b]) for a, b in itertools.pairwise(bounds)]
    kept = np.array(starts, dtype=np.int64)
    stamps = None
    if expiry is not None:  # a list's expiry is its latest element's
        stamps = np.array([expiry[a:b].max() for a, b in itertools.pairwise(bounds)], np.int64)
        values = _stamped(stamps, values)
    return EncodedState(spec, groups[kept], [kbytes[i] for i in starts], None, values, stamps)


def _stamped(expiry: np.ndarray, values: list[bytes]) -> list[bytes]:
    """Values after their expiry, as a TTL state stores them (state/user_state.py)."""
    return [EXPIRY.pack(int(e)) + v for e, v in zip(expiry, values, strict=True)]


def _refuse_repeats(table, key_names, kbytes, map_keys, where) -> None:
    """One entry per key (per key and map key, for a map): a repeat is an error naming it."""
    entries = pa.array(kbytes, pa.binary())
    if map_keys is not None:
        entries = pc.binary_join_element_wise(entries, pa.array(map_keys, pa.binary()), b"\0")
    counts = pc.value_counts(entries)
    repeated = counts.filter(pc.greater(counts.field("counts"), 1))
    if len(repeated):
        rows = np.flatnonzero(pc.equal(entries, repeated.field("values")[0]).to_numpy(False))
        what = "key" if map_keys is None else "key and map key"
        raise StateWriteError(
            f"{where}: {what} {_key_at(table, key_names, int(rows[1]))} appears "
            f"{len(rows)} times (rows {rows[:3].tolist()}): a state holds one entry per {what}"
        )


def _key_at(table: pa.Table, key_names: tuple[str, ...], row: int) -> str:
    values = [table.column(n)[row].as_py() for n in key_names]
    return repr(values[0] if len(values) == 1 else tuple(values))


def replace_states(store: RocksDBStore, states: list[EncodedState]) -> int:
    """Make each of ``states`` the whole content of its state in ``store``'s key groups; returns
    the entries written."""
    r = store.key_group_range
    written = 0
    for s in states:
        store.clear_state(s.spec.name)
        mine = np.flatnonzero((s.groups >= r.start) & (s.groups <= r.end))
        for at in range(0, len(mine), _BATCH):
            rows = mine[at : at + _BATCH]
            groups = s.groups[rows]
            keys = [s.keys[i] for i in rows]
            values = [s.values[i] for i in rows]
            txn = BufferedTransaction(store)
            if s.map_keys is None:
                txn.put(s.spec.name, groups, keys, values)
            else:
                txn.map_put(s.spec.name, groups, keys, [s.map_keys[i] for i in rows], values)
            if s.expiry is not None:
                mks = [s.map_keys[i] for i in rows] if s.map_keys is not None else [b""] * len(rows)
                timers = [ttl_timer_key(s.spec.name, k, m) for k, m in zip(keys, mks, strict=True)]
                txn.set_timers(TTL_TIMERS, groups, timers, s.expiry[rows], registered=True)
            txn.commit()
            written += len(rows)
    return written
