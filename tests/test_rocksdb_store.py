"""The RocksDB keyed state store: vectorised value/list/map state, timers, transactions."""

from __future__ import annotations

import numpy as np
import pytest

from state.backend import KeyGroupError, TransactionError, TransactionState
from state.keygroups import KeyGroupRange, key_group_range
from state.rocksdb_store import RocksDBStore, StoreOptions, decode_list, encode_list


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


def test_list_state_appends(store):
    txn = store.begin()
    txn.append_lists("buf", [3, 4], [b"k1", b"k2"], [[b"a", b"bb"], [b""]])
    txn.commit()
    txn = store.begin()
    txn.append_lists("buf", [3], [b"k1"], [[b"ccc"]])
    txn.commit()
    assert store.get_lists("buf", [3, 4, 5], [b"k1", b"k2", b"k3"]) == [
        [b"a", b"bb", b"ccc"],
        [b""],
        [],
    ]
    assert decode_list(encode_list([b"x", b"", b"yz"])) == [b"x", b"", b"yz"]


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
    txn = store.begin()
    txn.register_timers([5, 1, 9, 1], [b"a", b"b", b"c", b"d"], [30, -5, 10, 30])
    txn.commit()
    assert store.due_timers(9) == [(-5, 1, b"b")]
    assert store.due_timers(30) == [(-5, 1, b"b"), (10, 9, b"c"), (30, 1, b"d"), (30, 5, b"a")]
    txn = store.begin()
    txn.delete_timers([1, 9], [b"b", b"c"], [-5, 10])
    txn.commit()
    assert store.due_timers(2**40) == [(30, 1, b"d"), (30, 5, b"a")]


def test_items_iterates_one_key_group(store):
    txn = store.begin()
    txn.put("v", [2, 2, 3], [b"x", b"y", b"x"], [b"1", b"2", b"3"])
    txn.commit()
    assert list(store.items("v", 2)) == [(b"x", b"1"), (b"y", b"2")]


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
