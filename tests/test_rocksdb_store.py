"""The RocksDB keyed state store: vectorised value/list/map state, timer sets in time order (read
through the write buffer, which sees its own writes), transactions."""

from __future__ import annotations

import time

import numpy as np
import pytest

from state.backend import KeyGroupError, StateBackendError, TransactionError, TransactionState
from state.keygroups import KeyGroupRange, key_group_range
from state.rocksdb_options import StoreOptions
from state.rocksdb_store import RocksDBStore
from state.store_encoding import decode_list, encode_list
from state.write_buffer import BufferedTransaction


@pytest.fixture
def store(tmp_path):
    s = RocksDBStore(tmp_path / "db", KeyGroupRange(0, 63))
    yield s
    s.close()


def test_value_state_multi_get_and_write_batch(store):
    kgs = np.arange(10) % 64
    keys = [f"user-{i}".encode() for i in range(10)]
    assert store.get_many("count", kgs, keys) == [None] * 10
    txn = store.begin()
    txn.put("count", kgs, keys, [str(i).encode() for i in range(10)])
    assert store.get_many("count", kgs, keys) == [None] * 10, "uncommitted writes are invisible"
    txn.commit()
    assert txn.state is TransactionState.COMMITTED
    assert store.get_many("count", kgs, keys) == [str(i).encode() for i in range(10)]
    # The same key under another state name or key group is a different entry.
    assert store.get_many("sum", kgs, keys) == [None] * 10
    assert store.get_many("count", (kgs + 1) % 64, keys)[0] is None


def test_delete_and_abort(store):
    txn = store.begin()
    txn.put("v", [1, 2], [b"a", b"b"], [b"1", b"2"])
    txn.commit()
    txn = store.begin()
    txn.delete("v", [1], [b"a"])
    txn.abort()
    assert store.get_many("v", [1, 2], [b"a", b"b"]) == [b"1", b"2"]
    with pytest.raises(TransactionError):
        txn.commit()
    txn = store.begin()
    txn.delete("v", [1], [b"a"])
    txn.commit()
    assert store.get_many("v", [1, 2], [b"a", b"b"]) == [None, b"2"]
    with pytest.raises(TransactionError):
        txn.put("v", [1], [b"a"], [b"x"])


def test_key_group_outside_range_is_rejected(tmp_path):
    r = key_group_range(1, 2, 128)
    with RocksDBStore(tmp_path / "db", r) as s:
        with pytest.raises(KeyGroupError, match="outside this subtask's range"):
            s.get_many("v", [0], [b"k"])
        with pytest.raises(KeyGroupError):
            s.begin().put("v", [r.end + 1], [b"k"], [b"v"])
        assert s.get_many("v", [r.start, r.end], [b"k", b"k"]) == [None, None]


def test_list_items_frame_unambiguously():
    assert decode_list(encode_list([b"x", b"", b"yz"])) == [b"x", b"", b"yz"]
    assert decode_list(encode_list([])) == decode_list(None) == []


def test_map_state(store):
    txn = store.begin()
    txn.map_put("m", [7, 7, 7], [b"k", b"k", b"kk"], [b"b", b"a", b"a"], [b"2", b"1", b"3"])
    txn.commit()
    assert list(store.map_items("m", 7, b"k")) == [(b"a", b"1"), (b"b", b"2")]
    assert list(store.map_items("m", 7, b"kk")) == [(b"a", b"3")]
    assert store.map_get_many("m", [7, 7], [b"k", b"kk"], [b"b", b"b"]) == [b"2", None]
    txn = store.begin()
    txn.map_delete("m", [7], [b"k"], [b"a"])
    txn.commit()
    assert list(store.map_items("m", 7, b"k")) == [(b"b", b"2")]


def test_timers_fire_in_time_order_across_key_groups(store):
    txn = BufferedTransaction(store)
    txn.set_timers("t", [5, 1, 9, 1], [b"a", b"b", b"c", b"d"], [30, -5, 10, 30], registered=True)
    assert txn.due_timers("t", 9) == [(-5, 1, b"b")], "a transaction sees its own timers"
    txn.commit()
    txn = BufferedTransaction(store)
    assert txn.due_timers("t", 30) == [(-5, 1, b"b"), (10, 9, b"c"), (30, 1, b"d"), (30, 5, b"a")]
    assert txn.due_timers("other", 30) == [], "timer sets are apart"
    txn.set_timers("t", [1, 9], [b"b", b"c"], [-5, 10], registered=False)
    assert txn.due_timers("t", 2**40) == [(30, 1, b"d"), (30, 5, b"a")]
    txn.commit()
    assert BufferedTransaction(store).due_timers("t", 2**40) == [(30, 1, b"d"), (30, 5, b"a")]


def test_items_iterates_one_key_group(store):
    txn = store.begin()
    txn.put("v", [2, 2, 3], [b"x", b"y", b"x"], [b"1", b"2", b"3"])
    txn.commit()
    assert list(store.items("v", 2)) == [(b"x", b"1"), (b"y", b"2")]


def test_a_scan_over_a_corrupt_block_raises_instead_of_ending_early(tmp_path):
    """RocksDB stops an iterator at a block whose checksum does not match: a scan (timers, map
    state, a rescale copying keys, a state read) must say so, not return fewer entries."""
    path, r = tmp_path / "db", KeyGroupRange(0, 0)
    keys = [f"k{i:06d}".encode() for i in range(20_000)]
    with RocksDBStore(path, r) as s:
        txn = s.begin()
        txn.put("v", [0] * len(keys), keys, _random_values(np.random.default_rng(0), len(keys)))
        txn.commit()
    (sst,) = path.glob("*.sst")
    with open(sst, "r+b") as f:
        f.seek(sst.stat().st_size // 3)
        f.write(b"\0" * 64)
    corrupt = pytest.raises(StateBackendError, match=r"scan failed .*Corruption")
    with RocksDBStore(path, r, StoreOptions(block_cache_mib=1)) as s, corrupt:  # none cached
        sum(1 for _ in s.items("v", 0))
    with RocksDBStore(path, r, StoreOptions(block_cache_mib=2)) as s:  # the scan closed its db
        assert s.get_many("v", [0], keys[:1]) != [None]


def test_state_survives_close_and_snapshot_is_openable(tmp_path):
    path = tmp_path / "db"
    r = KeyGroupRange(0, 127)
    keys = [f"k{i}".encode() for i in range(5000)]
    kgs = np.arange(5000) % 128
    with RocksDBStore(path, r, StoreOptions(write_buffer_mib=1)) as s:
        txn = s.begin()
        txn.put("v", kgs, keys, keys)
        txn.commit()
        s.snapshot_to(tmp_path / "chk-1")
        txn = s.begin()
        txn.delete("v", kgs, keys)
        txn.commit()
        assert s.get_many("v", kgs[:3], keys[:3]) == [None] * 3
        with pytest.raises(Exception, match="exist"):
            s.snapshot_to(tmp_path / "chk-1")
    with RocksDBStore(tmp_path / "chk-1", r) as snap:
        assert snap.get_many("v", kgs, keys) == keys


def _random_values(rng: np.random.Generator, n: int, size: int = 100) -> list[bytes]:
    raw = rng.bytes(size * n)
    return [raw[i : i + size] for i in range(0, size * n, size)]


def test_a_compaction_a_task_starts_completes_after_it_and_before_the_next_open(tmp_path):
    """RocksDB starts a level-0 compaction when a task opens the store, and closing cancels it:
    with tasks shorter than the compaction, none would ever finish and level 0 would grow by a
    file per task. A task's close_after_compactions() leaves it running on a thread of its own
    and the next open waits for it: level 0 stays at its trigger (a count alone here)."""
    path, r = tmp_path / "db", KeyGroupRange(0, 127)
    options = StoreOptions(l0_compaction_trigger=4, l0_bytes_ratio=0)
    rng = np.random.default_rng(7)
    n = 200_000  # about 20 MB at the bottom level, which every compaction rewrites (~0.1 s)
    keys = [b"k%07d" % i for i in range(n)]
    with RocksDBStore(path, r, options) as s:
        txn = s.begin()
        txn.put("v", np.arange(n) % 128, keys, _random_values(rng, n))
        txn.commit()
        s.compact()
    released_later = 0
    for task in range(10):  # each writes 1 MB over the whole key range: one level-0 file
        s = RocksDBStore(path, r, options)  # waits for the last task's release
        try:
            level0 = s.db.property_int_value("rocksdb.num-files-at-level0")
            assert level0 <= options.l0_compaction_trigger, f"task {task}: {level0} files in L0"
            some = rng.integers(0, n, 10_000)
            txn = s.begin()
            values = _random_values(rng, len(some))
            txn.put("v", some % 128, [keys[i] for i in some], values)
            txn.commit()
            released_later += s.close_after_compactions() is not None
        finally:
            s.close()
    last = dict(
        zip(some.tolist(), values, strict=True)
    )  # the last task's writes, the last of each key
    with RocksDBStore(path, r, options, compactions=False) as s:
        assert s.get_many("v", np.array(list(last)) % 128, [keys[i] for i in last]) == list(
            last.values()
        )
    assert released_later, "no compaction ran past a task: the test no longer exercises one"


def _files(level0: list[int], below: list[int]) -> list[dict]:
    return [{"level": 0, "size": b} for b in level0] + [{"level": 6, "size": b} for b in below]


def test_level0_is_compacted_by_bytes_between_its_file_bounds():
    options = StoreOptions(l0_compaction_trigger=4, l0_max_files=12, l0_bytes_ratio=1.0)
    never = options.l0_max_files
    assert options.level0_trigger(_files([], [])) == never
    assert options.level0_trigger(_files([10] * 3, [])) == never, "fewer files than the minimum"
    assert options.level0_trigger(_files([10] * 4, [])) == 4, "nothing below: by count"
    assert options.level0_trigger(_files([9] * 11, [100])) == never, "99 bytes of 100 below"
    assert options.level0_trigger(_files([10] * 5, [40])) == 5, "50 bytes of 40 below: due"
    assert options.level0_trigger(_files([1] * 12, [1000])) == 12, "the most files: due"
    assert options.level0_trigger(_files([1] * 20, [1000])) == 12
    counted = StoreOptions(l0_compaction_trigger=4, l0_bytes_ratio=0)
    assert counted.level0_trigger(_files([1] * 4, [1000])) == 4
    with pytest.raises(ValueError, match="l0_compaction_trigger"):
        StoreOptions(l0_compaction_trigger=30, l0_max_files=12)


def test_small_increments_do_not_rewrite_the_whole_state(tmp_path):
    """A light input's short micro-batches each leave a small level-0 file; compacted by count,
    every few of them rewrote the whole state below. Paced by bytes, what is written per byte
    changed stays small: here a tenth of the count's."""
    r = KeyGroupRange(0, 127)
    rng = np.random.default_rng(5)
    n = 100_000  # about 10 MB below level 0
    keys = [b"k%07d" % i for i in range(n)]

    def written(options: StoreOptions, path) -> tuple[int, int]:
        """Bytes of every SST file the tasks made, and the level-0 files at the end."""
        with RocksDBStore(path, r, options) as s:
            txn = s.begin()
            txn.put("v", np.arange(n) % 128, keys, _random_values(rng, n))
            txn.commit()
            s.compact()
            before = {f["name"] for f in s.db.live_files()}
        seen: dict[str, int] = {}
        for task in range(25):  # 2,000 keys each: a level-0 file of about 200 KB
            with RocksDBStore(path, r, options) as s:
                files = s.db.live_files()  # what the earlier tasks left
                seen.update((f["name"], f["size"]) for f in files if f["name"] not in before)
                if task == 24:
                    return sum(seen.values()), sum(f["level"] == 0 for f in files)
                some = rng.integers(0, n, 2_000)
                txn = s.begin()
                txn.put("v", some % 128, [keys[i] for i in some], _random_values(rng, 2_000))
                txn.commit()
                s.close_after_compactions()
        raise AssertionError("unreachable")

    counted, _ = written(StoreOptions(l0_compaction_trigger=4, l0_bytes_ratio=0), tmp_path / "a")
    paced, level0 = written(StoreOptions(l0_compaction_trigger=4), tmp_path / "b")
    assert level0 > 4, "the small files stayed in level 0"
    assert paced < 0.25 * counted, (paced, counted)


def test_a_reopened_store_runs_with_this_codes_options(tmp_path):
    """An existing database's OPTIONS file records the options it was made with; a store opens
    it with its own (here: the process's block cache, and the level-0 trigger it decides),
    not with those, and not with a block cache of its own per open."""
    path, r = tmp_path / "db", KeyGroupRange(0, 7)
    with RocksDBStore(path, r, StoreOptions(block_cache_mib=16, l0_max_files=40)):
        pass
    lz4 = StoreOptions(compression="lz4", bottommost_compression="lz4", block_cache_mib=32)
    with RocksDBStore(path, r, lz4) as s:  # compressed blocks are read through a block cache
        assert s.db.property_int_value("rocksdb.block-cache-capacity") == 32 << 20
        options = sorted(path.glob("OPTIONS-*"))[-1].read_text()  # the newest
        assert "level0_file_num_compaction_trigger=96" in options


def test_blocks_are_read_in_place_and_compressed_ones_still_read(tmp_path):
    """By default blocks are stored uncompressed and read through memory maps, without a block
    cache; a store whose files hold compressed blocks (written with a compression set, or by an
    older version: a restored checkpoint's) reads the same under the defaults, and what it
    rewrites is stored uncompressed."""
    path, r = tmp_path / "db", KeyGroupRange(0, 127)
    n = 20_000
    kgs, keys = np.arange(n) % 128, [b"k%07d" % i for i in range(n)]
    rng = np.random.default_rng(5)
    values = [v.hex().encode() for v in _random_values(rng, n, 50)]

    def sst_bytes() -> int:
        return sum(f.stat().st_size for f in path.glob("*.sst"))

    zstd = StoreOptions(compression="zstd", bottommost_compression="zstd")
    with RocksDBStore(path, r, zstd) as s:
        txn = s.begin()
        txn.put("v", kgs, keys, values)
        txn.commit()
    compressed = sst_bytes()
    with RocksDBStore(path, r) as s:
        options = sorted(path.glob("OPTIONS-*"))[-1].read_text()  # the newest
        assert "allow_mmap_reads=true" in options and "no_block_cache=true" in options
        assert s.get_many("v", kgs, keys) == values
        changed = [v.hex().encode() for v in _random_values(rng, n // 2, 50)]
        txn = s.begin()
        txn.put("v", kgs[::2], keys[::2], changed)
        txn.commit()
        s.compact()
        assert s.get_many("v", kgs[::2], keys[::2]) == changed
        assert s.get_many("v", kgs[1::2], keys[1::2]) == values[1::2]
    assert sst_bytes() > 1.5 * compressed, (sst_bytes(), compressed)  # hex: zstd halves it


def test_an_open_without_compactions_starts_none_and_the_next_open_decides(tmp_path):
    """A restore opens the store only to write its progress marker: a compaction due then would
    be cancelled by the close at once. It starts none; the next task's open starts it."""
    path, r = tmp_path / "db", KeyGroupRange(0, 7)
    options = StoreOptions(l0_compaction_trigger=2, l0_max_files=4, l0_bytes_ratio=0)
    for i in range(6):  # six level-0 files, over the bound
        with RocksDBStore(path, r, options, compactions=False) as s:
            txn = s.begin()
            txn.put("v", [i % 8], [b"k%d" % i], [b"x" * 100])
            txn.commit()
    with RocksDBStore(path, r, options, compactions=False) as s:
        assert s.db.property_int_value("rocksdb.num-running-compactions") == 0
        assert s.db.property_int_value("rocksdb.num-files-at-level0") == 6
    with RocksDBStore(path, r, options) as s:  # RocksDB schedules it at the open
        deadline = time.monotonic() + 30
        while (
            s.db.property_int_value("rocksdb.num-files-at-level0") and time.monotonic() < deadline
        ):
            time.sleep(0.01)
        assert s.db.property_int_value("rocksdb.num-files-at-level0") == 0
        assert s.get_many("v", [5], [b"k5"]) == [b"x" * 100]
