"""How a working RocksDB database is tuned (:class:`StoreOptions`) and opened
(:func:`open_rdict`), with the process's shared block cache (:func:`block_cache`). The store that
uses them is state/rocksdb_store.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import rocksdict as rd

from state.errors import BadInputError


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
    level 0 keeps cost lookups a bloom filter probe each, and a block read for each false
    positive: at 10 bits a key, a third of a 1 GiB state's block reads (31,000 of 100,000 random
    keys past 33 level-0 files); at 20 bits, almost none. A requested compaction
    (:meth:`RocksDBStore.compact`) bounds the chain a restore reads.

    Small memtables flush in the background while a micro-batch runs, so the flush left for the
    synchronous part of a snapshot is at most one small memtable, whatever the state size.

    Blocks are stored uncompressed and read through memory maps, without a block cache: a
    lookup reads its block in place in the page cache, where a compressed block is read,
    decompressed and cached first. A multi-get of 100,000 random keys of a 1 GiB state took
    0.29 to 0.43 s so, against 1.27 to 1.46 s in zstd blocks with a block cache
    (bench/results/README.md). The store's files are read into the page cache at every open
    (:attr:`prefetch_mib`): read in order, they arrive far faster than lookups would fault
    them in, a block at random from disk costing several times one from memory. What reaches
    durable storage is compressed whole with zstd on its way (``CheckpointConfig.
    snapshot_compression``, state/file_codec.py), which shrinks text (hex, base64, numbers as
    digits) further than zstd does block by block. Given a ``compression``, blocks are
    compressed and read through the process's block cache (:func:`block_cache`), shared by
    every store it opens: a Python worker runs the tasks of several subtasks in turn, each
    opening its store anew, and the blocks one task read stay cached for the next.
    """

    write_buffer_mib: int = 2
    max_write_buffers: int = 6
    target_file_size_mib: int = 32
    l0_compaction_trigger: int = 24
    l0_max_files: int = 96
    l0_bytes_ratio: float = 2.0
    bloom_bits_per_key: float = 20.0
    block_cache_mib: int = 64
    compression: str = "none"
    bottommost_compression: str = "none"
    # a store whose SST files total at most this many MiB has them read into the page cache at
    # every open (state/page_cache.py); 0: never
    prefetch_mib: int = 4096
    # RocksDB's info LOGs kept per store: every task's open starts a new one, so this is how many
    # micro-batches back its flush and compaction events can still be read
    info_logs: int = 16

    def __post_init__(self) -> None:
        if not 0 < self.l0_compaction_trigger <= self.l0_max_files:
            raise BadInputError(
                f"l0_compaction_trigger must be in 1..l0_max_files ({self.l0_max_files}), "
                f"got {self.l0_compaction_trigger}"
            )
        if self.info_logs < 1:
            raise BadInputError(f"info_logs must be >= 1, got {self.info_logs}")
        if self.prefetch_mib < 0:
            raise BadInputError(f"prefetch_mib must be >= 0, got {self.prefetch_mib}")
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
        opts.set_keep_log_file_num(self.info_logs)
        opts.set_compression_type(getattr(rd.DBCompressionType, self.compression)())
        opts.set_bottommost_compression_type(
            getattr(rd.DBCompressionType, self.bottommost_compression)()
        )
        table = rd.BlockBasedOptions()
        table.set_bloom_filter(self.bloom_bits_per_key, False)
        if self.compression == self.bottommost_compression == "none":
            opts.set_allow_mmap_reads(True)
            table.disable_cache()
        else:
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
