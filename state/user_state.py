"""Keyed state for user functions: ``ValueState``, ``ListState`` and ``MapState``, vectorised.

A stage declares its states by spec (state/state_types.py: a name, an Arrow type, an optional
TTL). In a micro-batch the user's function gets a view of each, which reads and writes the state
of many keys per call: a read is one multi-get over the keys the micro-batch's buffer does not
hold, a write goes into the micro-batch's :class:`~state.write_buffer.BufferedTransaction` (one
RocksDB write batch).

TTL: a state with a TTL stores each entry's expiry before its value. An expired entry is
invisible to reads at once, and is deleted physically by a cleanup timer (timer set
``__ttl__``) that every write registers at the expiry: state of keys that go idle is removed
without anyone reading it. A list's TTL covers the whole list, refreshed by every write to it;
a map's TTL covers each entry.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state.state_types import (
    TTL_CLOCKS,
    KeyCodec,
    MapStateSpec,
    StateAccessError,
    StateSpec,
    binary_values,
    decode_values,
    encode_list_items,
    encode_values,
)
from state.store_encoding import decode_list, encode_list
from state.write_buffer import BufferedTransaction

TTL_TIMERS = "__ttl__"
EXPIRY = struct.Struct(">q")  # a TTL state's entries start with their expiry (ms)
_U32 = struct.Struct(">I")


def ttl_timer_key(name: str, key: bytes, map_key: bytes = b"") -> bytes:
    encoded = name.encode()
    return bytes([len(encoded)]) + encoded + _U32.pack(len(key)) + key + map_key


def parsettl_timer_key(raw: bytes) -> tuple[str, bytes, bytes]:
    """(state name, key, map key) of a TTL cleanup timer."""
    n = raw[0]
    name = raw[1 : 1 + n].decode()
    (klen,) = _U32.unpack_from(raw, 1 + n)
    start = 5 + n
    return name, raw[start : start + klen], raw[start + klen :]


# -- views ------------------------------------------------------------------------------------


class _StateView:
    """What every view shares: the buffer, the key codec, and the TTL clock."""

    def __init__(
        self, spec: StateSpec, txn: BufferedTransaction, keys: KeyCodec, clocks: dict[str, int]
    ) -> None:
        self.spec, self.txn, self.keys = spec, txn, keys
        self._now = clocks.get(spec.ttl.clock) if spec.ttl else None

    def _stamp(self, raw: list[bytes]) -> list[bytes]:
        if self.spec.ttl is None:
            return raw
        if self._now is None:
            raise StateAccessError(
                f"state {self.spec.name!r}: its TTL clock {self.spec.ttl.clock!r} has no time yet"
            )
        expiry = EXPIRY.pack(self._now + self.spec.ttl.ms)
        return [expiry + v for v in raw]

    def _unstamp(self, raw: list[bytes | None]) -> list[bytes | None]:
        if self.spec.ttl is None:
            return raw
        now = self._now
        return [None if v is None or EXPIRY.unpack_from(v)[0] <= now else v[8:] for v in raw]

    def _cleanup_at_expiry(self, groups: np.ndarray, kbytes: list[bytes], map_keys=None) -> None:
        if self.spec.ttl is None:
            return
        mks = map_keys if map_keys is not None else [b""] * len(kbytes)
        timers = [ttl_timer_key(self.spec.name, k, m) for k, m in zip(kbytes, mks, strict=True)]
        at = [self._now + self.spec.ttl.ms] * len(timers)
        self.txn.set_timers(TTL_TIMERS, groups, timers, at, registered=True)


def _aligned(what: str, a: pa.Array, b: pa.Array) -> None:
    if len(a) != len(b):
        raise StateAccessError(f"{what}: {len(a)} keys but {len(b)} values")


class ValueState(_StateView):
    """``get(keys)`` -> one value per key (null where absent or expired); ``update(keys,
    values)``; ``clear(keys)``. Within a call a repeated key takes its last value."""

    def get(self, keys: pa.Array) -> pa.Array:
        groups, kb = self.keys.encode(keys)
        return decode_values(
            self._unstamp(self.txn.get_many(self.spec.name, groups, kb)), self.spec.type
        )

    def update(self, keys: pa.Array, values: pa.Array) -> None:
        _aligned(f"state {self.spec.name!r}", keys, values)
        groups, kb = self.keys.encode(keys)
        raw = encode_values(values, self.spec.type, f"state {self.spec.name!r}")
        self.txn.put(self.spec.name, groups, kb, self._stamp(raw))
        self._cleanup_at_expiry(groups, kb)

    def clear(self, keys: pa.Array) -> None:
        groups, kb = self.keys.encode(keys)
        self.txn.delete(self.spec.name, groups, kb)


class ListState(_StateView):
    """``get(keys)`` -> a list per key (empty where absent); ``add(keys, values)`` appends each
    value to its key's list (a key may repeat: its values are appended in order);
    ``update(keys, lists)`` replaces; ``clear(keys)``."""

    def _read(self, groups, kb) -> list[bytes | None]:
        return self._unstamp(self.txn.get_many(self.spec.name, groups, kb))

    def get(self, keys: pa.Array) -> pa.ListArray:
        groups, kb = self.keys.encode(keys)
        blobs = self._read(groups, kb)
        items = [decode_list(b) for b in blobs]
        offsets = np.zeros(len(items) + 1, np.int32)
        np.cumsum([len(i) for i in items], out=offsets[1:])
        flat = decode_values([v for i in items for v in i], self.spec.type)
        return pa.ListArray.from_arrays(pa.array(offsets), flat)

    def add(self, keys: pa.Array, values: pa.Array) -> None:
        _aligned(f"state {self.spec.name!r}", keys, values)
        if not len(keys):
            return
        framed = encode_list_items(values, self.spec.type, f"state {self.spec.name!r}")
        all_groups, all_kb = self.keys.encode(keys)
        grouped = (  # by the stored key bytes: any key, composite ones too
            pa.table({"k": pa.array(all_kb, pa.binary()), "g": all_groups, "v": framed})
            .group_by("k", use_threads=False)  # keeps arrival order within a key
            .aggregate([("g", "min"), ("v", "list")])
        )
        groups, kb = grouped.column("g_min").to_numpy(), binary_values(grouped.column("k"))
        old = pa.array(self._read(groups, kb), pa.binary())
        appended = pc.binary_join(grouped.column("v_list"), b"")  # each key's, in arrival order
        merged = pc.binary_join_element_wise(
            old, appended, b"", null_handling="replace", null_replacement=b""
        )
        self.txn.put(self.spec.name, groups, kb, self._stamp(binary_values(merged)))
        self._cleanup_at_expiry(groups, kb)

    def update(self, keys: pa.Array, lists: pa.ListArray) -> None:
        _aligned(f"state {self.spec.name!r}", keys, lists)
        groups, kb = self.keys.encode(keys)
        flat = encode_values(lists.flatten(), self.spec.type, f"state {self.spec.name!r}")
        offsets = lists.offsets.to_numpy() - lists.offsets[0].as_py()
        blobs = [
            encode_list(flat[a:b])
            for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)
        ]
        self.txn.put(self.spec.name, groups, kb, self._stamp(blobs))
        self._cleanup_at_expiry(groups, kb)

    def clear(self, keys: pa.Array) -> None:
        groups, kb = self.keys.encode(keys)
        self.txn.delete(self.spec.name, groups, kb)


class MapState(_StateView):
    """Per key a map: ``get(keys, map_keys)`` -> values (null where absent);
    ``put(keys, map_keys, values)``; ``remove(keys, map_keys)``; ``items(keys)`` -> a table
    (``index`` into ``keys``, ``map_key``, ``value``); ``clear(keys)`` removes whole maps."""

    spec: MapStateSpec

    def _encode(self, keys, map_keys):
        _aligned(f"state {self.spec.name!r} map keys", keys, map_keys)
        groups, kb = self.keys.encode(keys)
        mk = encode_values(map_keys, self.spec.key_type, f"state {self.spec.name!r} map key")
        return groups, kb, mk

    def get(self, keys: pa.Array, map_keys: pa.Array) -> pa.Array:
        groups, kb, mk = self._encode(keys, map_keys)
        raw = self.txn.map_get_many(self.spec.name, groups, kb, mk)
        return decode_values(self._unstamp(raw), self.spec.type)

    def put(self, keys: pa.Array, map_keys: pa.Array, values: pa.Array) -> None:
        _aligned(f"state {self.spec.name!r}", keys, values)
        groups, kb, mk = self._encode(keys, map_keys)
        raw = encode_values(values, self.spec.type, f"state {self.spec.name!r}")
        self.txn.map_put(self.spec.name, groups, kb, mk, self._stamp(raw))
        self._cleanup_at_expiry(groups, kb, mk)

    def remove(self, keys: pa.Array, map_keys: pa.Array) -> None:
        groups, kb, mk = self._encode(keys, map_keys)
        self.txn.map_delete(self.spec.name, groups, kb, mk)

    def items(self, keys: pa.Array) -> pa.Table:
        groups, kb = self.keys.encode(keys)
        index, mks, values = [], [], []
        for i, (g, k) in enumerate(zip(groups.tolist(), kb, strict=True)):
            entries = self.txn.map_items(self.spec.name, g, k)
            live = self._unstamp([v for _, v in entries])
            for (m, _), v in zip(entries, live, strict=True):
                if v is not None:
                    index.append(i)
                    mks.append(m)
                    values.append(v)
        return pa.table(
            {
                "index": pa.array(index, pa.int64()),
                "map_key": decode_values(mks, self.spec.key_type),
                "value": decode_values(values, self.spec.type),
            }
        )

    def clear(self, keys: pa.Array) -> None:
        entries = self.items(keys)  # live ones; expired ones go with their cleanup timers
        if entries.num_rows:
            owners = pc.take(keys, entries.column("index"))
            self.remove(owners, entries.column("map_key"))


VIEWS = {"value": ValueState, "list": ListState, "map": MapState}


def open_view(
    spec: StateSpec, txn: BufferedTransaction, keys: KeyCodec, clocks: dict[str, int]
) -> ValueState | ListState | MapState:
    """The view of ``spec`` over one micro-batch's buffer."""
    return VIEWS[spec.kind](spec, txn, keys, clocks)


def expire(
    specs: dict[str, StateSpec], txn: BufferedTransaction, keys: KeyCodec, clocks: dict[str, int]
) -> int:
    """Fire the due TTL cleanup timers: delete every entry whose expiry has passed (an entry
    written again since keeps its newer expiry). Returns the entries deleted."""
    limit = max((clocks[c] for c in TTL_CLOCKS if c in clocks), default=None)
    if limit is None:
        return 0
    fired: list[tuple[int, int, bytes]] = []
    by_state: dict[str, list[tuple[int, bytes, bytes]]] = {}
    for ts, kg, raw in txn.due_timers(TTL_TIMERS, limit):
        name, key, map_key = parsettl_timer_key(raw)
        spec = specs.get(name)
        if spec is not None and spec.ttl is not None and ts > clocks.get(spec.ttl.clock, ts - 1):
            continue  # a timer of the other clock, not due yet
        fired.append((ts, kg, raw))
        if spec is not None and spec.ttl is not None:
            by_state.setdefault(name, []).append((kg, key, map_key))
    deleted = 0
    for name, entries in by_state.items():  # one multi-get per state
        spec = specs[name]
        groups, kb, mk = (list(c) for c in zip(*entries, strict=True))
        if spec.kind == "map":
            stored = txn.map_get_many(name, groups, kb, mk)
        else:
            stored = txn.get_many(name, groups, kb)
        now = clocks[spec.ttl.clock]
        # gone already, or written again since with a later expiry: kept
        gone = [
            i for i, v in enumerate(stored) if v is not None and EXPIRY.unpack_from(v)[0] <= now
        ]
        pick = [groups[i] for i in gone], [kb[i] for i in gone]
        if spec.kind == "map":
            txn.map_delete(name, *pick, [mk[i] for i in gone])
        else:
            txn.delete(name, *pick)
        deleted += len(gone)
    if fired:
        txn.set_timers(
            TTL_TIMERS,
            [kg for _, kg, _ in fired],
            [r for _, _, r in fired],
            [ts for ts, _, _ in fired],
            registered=False,
        )
    return deleted
