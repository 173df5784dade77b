"""RocksDB implementation of :class:`state.backend.KeyedStateBackend` (rocksdict, raw mode).

Key layout (big-endian, so RocksDB's byte order groups everything by key group first)::

    value / list state   kg:u16 | len(name):u8 | name | key
    map state            kg:u16 | len(name):u8 | name | len(key):u32 | key | map_key
    timer set ``name``   kg:u16 | len(name):u8 | name | (ts + 2**63):u64 | key

so timers scan in timestamp order within a key group. A list is one value, its items each after
their length (:func:`encode_list`). The stage-facing views over these (state/user_state.py) and
the write buffer that reads its own writes (state/write_buffer.py) build on this store.

Reads are multi-gets and writes are write batches, one call per micro-batch, never one per record.
The write-ahead log is off (as in Flink): durability comes from checkpoints, and the working
database is rebuilt from a checkpoint after any failure.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import rocksdict as rd

from state.backend import (
    KeyedStateBackend,
    KeyGroupError,
    KeyGroups,
    Keys,
    StateBackendError,
    Transaction,
    TransactionError,
    TransactionState,
    disk_full,
)
from state.errors import BadInputError
from state.keygroups import KeyGroupRange
from state.store_encoding import U32 as _U32


@dataclass(frozen=True)
class StoreOptions:
    """RocksDB tuning. Defaults keep most SST files stable between checkpoints.

    With keys updated uniformly, every compaction of level 0 into the level below rewrites
    nearly all of that level: the whole state, uploaded again with the next checkpoint. So level
    0 is compacted by bytes, not by file count alone (:func:`level0_trigger`, decided at every
    open): not before ``l0_compaction_trigger`` files, then once level 0 holds
    ``l0_bytes_ratio`` times the bytes below it, and always at ``l0_max_files`` files. Each byte
    a checkpoint changes is then written about ``1 + 1 / l0_bytes_ratio`` times, whatever the
    micro-batches' size: every task's close flushes its memtable (the WAL is off), so a
    light input's short micro-batches make many small level-0 files, which a count alone
    turned into a rewrite of the whole state every ``l0_compaction_trigger`` tasks. The files
    level 0 keeps cost lookups a bloom filter probe each. A requested compaction
    (:meth:`RocksDBStore.compact`) bounds the chain a restore reads.

    Small memtables flush in the background while a micro-batch runs, so the flush left for the
    synchronous part of a snapshot is at most one small memtable, whatever the state size.

    Level 0 (memtable flushes: a checkpoint's increment) is compressed with LZ4, which is cheap
    enough for the flush in a snapshot's synchronous part; what compaction writes to the bottom
    level (the rewritten state, the largest uploads and most of the storage) with zstd, whose
    entropy coding also shrinks values LZ4 cannot (hex, base64, numbers as text).

    The block cache is the process's (:func:`block_cache`), shared by every store it opens: a
    Python worker runs the tasks of several subtasks in turn, each opening its store anew, and
    the blocks one task read stay cached for the next instead of being read and decompressed
    again.
    """

    write_buffer_mib: int = 2
    max_write_buffers: int = 6
    target_file_size_mib: int = 32
    l0_compaction_trigger: int = 24
    l0_max_files: int = 96
    l0_bytes_ratio: float = 2.0
    bloom_bits_per_key: float = 10.0
    block_cache_mib: int = 64
    compression: str = "lz4"
    bottommost_compression: str = "zstd"

    def __post_init__(self) -> None:
        if not 0 < self.l0_compaction_trigger <= self.l0_max_files:
            raise BadInputError(
                f"l0_compaction_trigger must be in 1..l0_max_files ({self.l0_max_files}), "
                f"got {self.l0_compaction_trigger}"
            )
        if self.l0_bytes_ratio < 0:
            raise BadInputError(f"l0_bytes_ratio must be >= 0, got {self.l0_bytes_ratio}")

    @property
    def l0_slowdown_trigger(self) -> int:
        """The level-0 file count at which RocksDB slows writes down."""
        return self.l0_max_files * 2

    def level0_trigger(self, files: list[dict]) -> int:
        """The level-0 compaction trigger for a store whose SST files are ``files``
        (rocksdict's ``live_files``): at or below level 0's file count, a compaction is due."""
        level0 = [f["size"] for f in files if f["level"] == 0]
        below = sum(f["size"] for f in files if f["level"] > 0)
        if len(level0) >= self.l0_max_files or (
            len(level0) >= self.l0_compaction_trigger and sum(level0) >= self.l0_bytes_ratio * below
        ):
            return max(1, min(len(level0), self.l0_max_files))
        return self.l0_max_files

    def to_rocksdb(self) -> rd.Options:
        opts = rd.Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_write_buffer_size(self.write_buffer_mib << 20)
        opts.set_max_write_buffer_number(self.max_write_buffers)
        opts.set_target_file_size_base(self.target_file_size_mib << 20)
        # no compaction is scheduled at the open: the store decides (level0_trigger)
        opts.set_level_zero_file_num_compaction_trigger(self.l0_max_files)
        opts.set_level_zero_slowdown_writes_trigger(self.l0_slowdown_trigger)
        opts.set_level_zero_stop_writes_trigger(self.l0_slowdown_trigger * 2)
        opts.set_max_background_jobs(2)
        opts.set_keep_log_file_num(2)  # every task opens the store: one info LOG per open
        opts.set_compression_type(getattr(rd.DBCompressionType, self.compression)())
        opts.set_bottommost_compression_type(
            getattr(rd.DBCompressionType, self.bottommost_compression)()
        )
        table = rd.BlockBasedOptions()
        table.set_bloom_filter(self.bloom_bits_per_key, False)
        table.set_block_cache(block_cache(self.block_cache_mib))
        opts.set_block_based_table_factory(table)
        return opts


_CACHES: dict[int, rd.Cache] = {}  # this process's block caches, by capacity in MiB


def block_cache(mib: int) -> rd.Cache:
    """This process's LRU block cache of ``mib`` MiB, created on first use (never before a
    fork: the worker daemon imports this module and forks its workers). RocksDB keys cached
    blocks by file, so stores and reopened stores share one safely."""
    cache = _CACHES.get(mib)
    if cache is None:
        cache = _CACHES[mib] = rd.Cache(mib << 20)
    return cache


def open_rdict(path: str | Path, options: rd.Options) -> rd.Rdict:
    """The database at ``path`` opened with ``options``, its column family's too. Given options
    alone, rocksdict opens an existing database's column family with the options its OPTIONS
    file recorded (and a block cache of its own, 8 MiB): a store restored from a checkpoint, or
    written by an older version, would keep the options it was made with."""
    return rd.Rdict(str(path), options, column_families={"default": options})


def _name_prefix(key_group: int, name: str) -> bytes:
    encoded = name.encode()
    if not 0 < len(encoded) < 256:
        raise BadInputError(f"state name must be 1..255 bytes, got {name!r}")
    return key_group.to_bytes(2, "big") + bytes([len(encoded)]) + encoded


class RocksDBStore(KeyedStateBackend):
    """One subtask's working keyed state in a RocksDB directory on local disk.

    Open it for the duration of one task and close it in ``finally`` (or use it as a context
    manager): RocksDB allows one opener per directory, and Spark moves tasks between Python
    worker processes. ``compactions=False``: an open that writes little and closes at once (a
    restore's progress marker) starts no compaction, which its close would only cancel; the
    next open decides.
    """

    def __init__(
        self,
        path: str | Path,
        key_group_range: KeyGroupRange,
        options: StoreOptions | None = None,
        *,
        compactions: bool = True,
    ) -> None:
        self.path = Path(path)
        self.key_group_range = key_group_range
        self.options = options or StoreOptions()
        self._db: rd.Rdict | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            opts = self.options.to_rocksdb()
            opts.set_disable_auto_compactions(not compactions)
            self._db = open_rdict(self.path, opts)
            trigger = self.options.level0_trigger(self._db.live_files())
            if compactions and trigger != self.options.l0_max_files:
                self._db.set_options({"level0_file_num_compaction_trigger": str(trigger)})
        except Exception as e:
            if self._db is not None:
                self._db.close()
                self._db = None
            raise self._failed("open", e) from e
        self._write_opts = rd.WriteOptions()
        self._write_opts.disable_wal = True
        self._prefixes: dict[str, list[bytes]] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def db(self) -> rd.Rdict:
        if self._db is None:
            raise TransactionError(f"state store {self.path} is closed")
        return self._db

    def close(self) -> None:
        """Flush the memtable and release the database lock; idempotent."""
        if self._db is not None:
            try:
                self._db.flush(True)
            except Exception as e:
                raise self._failed("flush", e) from e
            finally:
                self._db.close()
                self._db = None

    def __enter__(self) -> RocksDBStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def destroy(path: str | Path) -> None:
        """Delete a working database directory (used before restoring into it)."""
        shutil.rmtree(path, ignore_errors=True)

    # -- key encoding ------------------------------------------------------------------------

    def _prefix_table(self, name: str) -> list[bytes]:
        table = self._prefixes.get(name)
        if table is None:
            table = [_name_prefix(kg, name) for kg in range(self.key_group_range.end + 1)]
            self._prefixes[name] = table
        return table

    def _check_groups(self, key_groups: KeyGroups) -> list[int]:
        groups = np.asarray(key_groups, dtype=np.int64)
        r = self.key_group_range
        if groups.size and (groups.min() < r.start or groups.max() > r.end):
            bad = groups[(groups < r.start) | (groups > r.end)][0]
            raise KeyGroupError(f"key group {bad} is outside this subtask's range {r.to_list()}")
        return groups.tolist()

    def _keys(self, name: str, key_groups: KeyGroups, keys: Keys) -> list[bytes]:
        if len(key_groups) != len(keys):
            raise ValueError(f"{len(key_groups)} key groups for {len(keys)} keys")
        table = self._prefix_table(name)
        return [table[g] + k for g, k in zip(self._check_groups(key_groups), keys, strict=True)]

    def _map_keys(
        self, name: str, key_groups: KeyGroups, keys: Keys, map_keys: Keys
    ) -> list[bytes]:
        table = self._prefix_table(name)
        groups = self._check_groups(key_groups)
        return [
            table[g] + _U32.pack(len(k)) + k + mk
            for g, k, mk in zip(groups, keys, map_keys, strict=True)
        ]

    # -- reads -------------------------------------------------------------------------------

    def get_many(self, name: str, key_groups: KeyGroups, keys: Keys) -> list[bytes | None]:
        """One multi-get, in key order (neighbouring keys share blocks: 100,000 random keys
        of a 150 MB store took 15% less time sorted), answered in the caller's order."""
        if not keys:
            return []
        full = self._keys(name, key_groups, keys)
        order = sorted(range(len(full)), key=full.__getitem__)
        values = self.multi_get([full[i] for i in order])
        out: list[bytes | None] = [None] * len(full)
        for i, value in zip(order, values, strict=True):
            out[i] = value
        return out

    def map_get_many(
        self, name: str, key_groups: KeyGroups, keys: Keys, map_keys: Keys
    ) -> list[bytes | None]:
        if not keys:
            return []
        return self.multi_get(self._map_keys(name, key_groups, keys, map_keys))

    def map_items(self, name: str, key_group: int, key: bytes) -> Iterator[tuple[bytes, bytes]]:
        """All (map key, value) pairs of one key's map state, in map-key byte order."""
        prefix = self._map_keys(name, [key_group], [key], [b""])[0]
        for k, v in self._scan(prefix):
            yield k[len(prefix) :], v

    def items(self, name: str, key_group: int) -> Iterator[tuple[bytes, bytes]]:
        """All (key, value) pairs of value or list state ``name`` in one key group."""
        prefix = self._prefix_table(name)[self._check_groups([key_group])[0]]
        for k, v in self._scan(prefix):
            yield k[len(prefix) :], v

    def multi_get(self, full_keys: list[bytes]) -> list[bytes | None]:
        """The values of ``full_keys`` (encoded) in one multi-get."""
        try:
            return self.db.get(full_keys)
        except Exception as e:
            raise self._failed("read", e) from e

    def _scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        try:
            it = self.db.iter()
            it.seek(prefix)
            while it.valid():
                key = it.key()
                if not key.startswith(prefix):
                    break
                yield key, it.value()
                it.next()
        except Exception as e:
            raise self._failed("scan", e) from e

    def _failed(self, what: str, error: BaseException) -> StateBackendError:
        """RocksDB's ``error`` as the runtime's failure, naming the store and the host; a full
        disk says so first (RocksDB's own words for it are in the chained error)."""
        import socket

        where = (
            f"RocksDB {what} failed in {self.path} on {socket.gethostname()} "
            f"(key groups {self.key_group_range.start}..{self.key_group_range.end})"
        )
        if disk_full(error):
            return StateBackendError(f"disk full (no space left on device): {where}")
        return StateBackendError(f"{where}: {error}")

    # -- writes ------------------------------------------------------------------------------

    def begin(self) -> RocksDBTransaction:
        return RocksDBTransaction(self)

    def commit_batch(self, txn: Transaction, batch: rd.WriteBatch) -> None:
        """Apply ``batch`` atomically (without the WAL) and mark ``txn`` committed, or aborted
        if the write fails."""
        try:
            if not batch.is_empty():
                self.db.write(batch, self._write_opts)
        except Exception as e:
            txn.state = TransactionState.ABORTED
            raise self._failed("write", e) from e
        txn.state = TransactionState.COMMITTED

    def clear_state(self, name: str) -> None:
        """Delete every entry of state ``name`` in this store's key groups, by range."""
        for start in self._prefix_table(name)[self.key_group_range.start :]:
            self.db.delete_range(start, start[:-1] + bytes([start[-1] + 1]), self._write_opts)

    def compact(self) -> None:
        """Compact the whole database into few files (bounds the files a restore must read)."""
        self.db.compact_range(None, None)

    def finish_compactions(self, poll_s: float = 0.005) -> float:
        """Wait until no background compaction runs; returns the seconds waited.

        Closing the database cancels a running compaction and discards its work. RocksDB starts
        a level-0 compaction when a task opens the store; a task shorter than that compaction
        would cancel it at every close, so it would never complete and level 0 would grow until
        writes stall. A task calls this once its own work is done, before :meth:`close`.
        """
        started = time.perf_counter()
        while self.db.property_int_value("rocksdb.num-running-compactions"):
            time.sleep(poll_s)
        return time.perf_counter() - started

    # -- snapshots ---------------------------------------------------------------------------

    def snapshot_to(self, directory: Path) -> None:
        """Flush the memtable and create a RocksDB checkpoint (hard links) in ``directory``.

        ``directory`` must not exist; its parent must be on the same filesystem as the database.
        """
        directory = Path(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        self.db.flush(True)
        rd.Checkpoint(self.db).create_checkpoint(str(directory))


class RocksDBTransaction(Transaction):
    """A write batch; ``commit`` applies it atomically, ``abort`` drops it."""

    def __init__(self, store: RocksDBStore) -> None:
        self._store = store
        self._batch = rd.WriteBatch(raw_mode=True)
        self.state = TransactionState.OPEN

    def _check_open(self) -> rd.WriteBatch:
        if self.state is not TransactionState.OPEN:
            raise TransactionError(f"transaction is {self.state.value}, not open")
        return self._batch

    def put(self, name: str, key_groups: KeyGroups, keys: Keys, values: Sequence[bytes]) -> None:
        batch = self._check_open()
        for k, v in zip(self._store._keys(name, key_groups, keys), values, strict=True):
            batch.put(k, v)

    def delete(self, name: str, key_groups: KeyGroups, keys: Keys) -> None:
        batch = self._check_open()
        for k in self._store._keys(name, key_groups, keys):
            batch.delete(k)

    def map_put(
        self,
        name: str,
        key_groups: KeyGroups,
        keys: Keys,
        map_keys: Keys,
        values: Sequence[bytes],
    ) -> None:
        batch = self._check_open()
        encoded = self._store._map_keys(name, key_groups, keys, map_keys)
        for k, v in zip(encoded, values, strict=True):
            batch.put(k, v)

    def map_delete(self, name: str, key_groups: KeyGroups, keys: Keys, map_keys: Keys) -> None:
        batch = self._check_open()
        for k in self._store._map_keys(name, key_groups, keys, map_keys):
            batch.delete(k)

    def commit(self) -> None:
        self._store.commit_batch(self, self._check_open())

    def abort(self) -> None:
        self._check_open()
        self.state = TransactionState.ABORTED
