"""A micro-batch's writes to a :class:`~state.rocksdb_store.RocksDBStore`, with read-your-writes.

User functions read state they wrote earlier in the same micro-batch (a timer callback clears a
key, the record callback then reads it). :class:`BufferedTransaction` keeps the batch's writes in
memory, answers reads from them first and from the database second, and applies them all in one
RocksDB write batch at :meth:`~BufferedTransaction.commit`, together with whatever else the
subtask puts into it (its progress marker): a micro-batch is applied to the working state
entirely or not at all.

Reads stay vectorised: the keys the buffer does not hold are read with one multi-get.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from state.backend import KeyGroups, Keys, Transaction, TransactionError, TransactionState
from state.store_encoding import TS_OFFSET as _TS_OFFSET
from state.store_encoding import U64 as _U64

if TYPE_CHECKING:  # the store itself is imported where one is opened (no rocksdict here)
    from state.rocksdb_store import RocksDBStore

_DELETED = None


class BufferedTransaction(Transaction):
    """Writes of one micro-batch, readable before they are committed."""

    def __init__(self, store: RocksDBStore) -> None:
        self.store = store
        self.state = TransactionState.OPEN
        self._writes: dict[bytes, bytes | None] = {}  # full key -> value (None: deleted)
        # map state: (name, key group, key) prefix -> the map keys written under it
        self._map_writes: dict[bytes, set[bytes]] = {}
        # timers: name -> {(timestamp, key group, key): registered (True) or deleted (False)}
        self._timers: dict[str, dict[tuple[int, int, bytes], bool]] = {}

    def _check_open(self) -> None:
        if self.state is not TransactionState.OPEN:
            raise TransactionError(f"transaction is {self.state.value}, not open")

    # -- reads -------------------------------------------------------------------------------

    def _read(self, full: list[bytes]) -> list[bytes | None]:
        if not self._writes:  # nothing written yet in this micro-batch: all from the database
            return self.store.sorted_multi_get(full)
        out: list[bytes | None] = [None] * len(full)
        missing = []
        for i, k in enumerate(full):
            if k in self._writes:
                out[i] = self._writes[k]
            else:
                missing.append(i)
        if missing:
            values = self.store.sorted_multi_get([full[i] for i in missing])
            for i, value in zip(missing, values, strict=True):
                out[i] = value
        return out

    def get_many(self, name: str, key_groups: KeyGroups, keys: Keys) -> list[bytes | None]:
        return self._read(self.store._keys(name, key_groups, keys)) if len(keys) else []

    def map_get_many(
        self, name: str, key_groups: KeyGroups, keys: Keys, map_keys: Keys
    ) -> list[bytes | None]:
        if not len(keys):
            return []
        return self._read(self.store._map_keys(name, key_groups, keys, map_keys))

    def map_items(self, name: str, key_group: int, key: bytes) -> list[tuple[bytes, bytes]]:
        """Every (map key, value) of one key's map, in map-key byte order."""
        prefix = self.store._map_keys(name, [key_group], [key], [b""])[0]
        items = {k[len(prefix) :]: v for k, v in self.store._scan(prefix)}
        for full in self._map_writes.get(prefix, ()):
            value = self._writes[full]
            if value is _DELETED:
                items.pop(full[len(prefix) :], None)
            else:
                items[full[len(prefix) :]] = value
        return sorted(items.items())

    def due_timers(self, name: str, limit: int) -> list[tuple[int, int, bytes]]:
        """Timers of ``name`` with timestamp <= ``limit`` as (timestamp, key group, key), in
        timestamp order (ties by key group, then key)."""
        due: set[tuple[int, int, bytes]] = set()
        top = _U64.pack(limit + _TS_OFFSET)
        for kg in self.store.key_group_range:
            prefix = self.store._prefix_table(name)[kg]
            for k, _ in self.store._scan(prefix):
                ts = k[len(prefix) : len(prefix) + 8]
                if ts > top:
                    break
                due.add((_U64.unpack(ts)[0] - _TS_OFFSET, kg, k[len(prefix) + 8 :]))
        for timer, registered in self._timers.get(name, {}).items():
            if not registered:
                due.discard(timer)
            elif timer[0] <= limit:
                due.add(timer)
        return sorted(due)

    # -- writes ------------------------------------------------------------------------------

    def put(self, name: str, key_groups: KeyGroups, keys: Keys, values: Sequence[bytes]) -> None:
        self._check_open()
        self._writes.update(zip(self.store._keys(name, key_groups, keys), values, strict=True))

    def delete(self, name: str, key_groups: KeyGroups, keys: Keys) -> None:
        self._check_open()
        for k in self.store._keys(name, key_groups, keys):
            self._writes[k] = _DELETED

    def _map_write(self, name: str, key_groups, keys, map_keys, values) -> None:
        self._check_open()
        full = self.store._map_keys(name, key_groups, keys, map_keys)
        for f, mk, v in zip(full, map_keys, values, strict=True):
            self._writes[f] = v
            self._map_writes.setdefault(f[: len(f) - len(mk)], set()).add(f)

    def map_put(
        self, name: str, key_groups: KeyGroups, keys: Keys, map_keys: Keys, values: Sequence[bytes]
    ) -> None:
        self._map_write(name, key_groups, keys, map_keys, values)

    def map_delete(self, name: str, key_groups: KeyGroups, keys: Keys, map_keys: Keys) -> None:
        self._map_write(name, key_groups, keys, map_keys, [_DELETED] * len(keys))

    def set_timers(
        self,
        name: str,
        key_groups: KeyGroups,
        keys: Keys,
        timestamps: Sequence[int],
        *,
        registered: bool,
    ) -> None:
        """Register (or delete) one timer per (key group, key, timestamp) in timer set ``name``."""
        self._check_open()
        groups = self.store._check_groups(key_groups)
        stamps = [int(t) for t in timestamps]
        ts_keys = [_U64.pack(t + _TS_OFFSET) + k for t, k in zip(stamps, keys, strict=True)]
        full = self.store._keys(name, groups, ts_keys)
        marks = self._timers.setdefault(name, {})
        for f, g, k, t in zip(full, groups, keys, stamps, strict=True):
            self._writes[f] = b"" if registered else _DELETED
            marks[(t, g, bytes(k))] = registered

    def commit(self) -> None:
        """Apply every write in one RocksDB write batch, in key order: RocksDB inserts a batch
        of 100,000 random keys into its memtable about ten times faster sorted (each insert
        starts where the one before ended), far more than the sort costs."""
        self._check_open()
        import rocksdict as rd  # loaded already: this transaction's store is open

        batch = rd.WriteBatch(raw_mode=True)
        writes = self._writes
        keys = sorted(writes)
        if _DELETED in writes.values():
            for k in keys:
                v = writes[k]
                if v is _DELETED:
                    batch.delete(k)
                else:
                    batch.put(k, v)
        else:  # puts alone: one C-level pass, no Python loop per key
            deque(map(batch.put, keys, map(writes.__getitem__, keys)), maxlen=0)
        self.store.commit_batch(self, batch)

    def abort(self) -> None:
        self._check_open()
        self.state = TransactionState.ABORTED
