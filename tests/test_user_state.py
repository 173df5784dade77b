"""ValueState, ListState, MapState, timers and TTL against a plain in-memory model (hypothesis).

A generated program is a list of micro-batches, each a list of operations on a few keys; every
micro-batch runs in one BufferedTransaction on a real RocksDB store and commits, and after every
operation each state's reads must equal the model's. In the middle of the program the store is
snapshotted (a RocksDB checkpoint, as a subtask's synchronous snapshot takes it), the original is
dropped, and the program goes on against the restored copy.
"""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cutline.keyed_process import EVENT_TIMERS
from state.keygroups import KeyGroupRange, key_groups
from state.rocksdb_store import RocksDBStore
from state.state_types import (
    KeyCodec,
    ListStateSpec,
    MapStateSpec,
    StateAccessError,
    Ttl,
    ValueStateSpec,
)
from state.user_state import expire, open_view
from state.write_buffer import BufferedTransaction

ALL = KeyGroupRange(0, 127)
KEYS = ["a", "b", "c", "\u00e9t\u00e9", ""]
TTL_MS = 50
SPECS = {
    "v": ValueStateSpec("v", pa.int64()),
    "s": ValueStateSpec("s", pa.string(), ttl=Ttl(TTL_MS, clock="processing")),
    "l": ListStateSpec("l", pa.float64()),
    "m": MapStateSpec("m", pa.int64(), key_type=pa.string(), ttl=Ttl(TTL_MS, "processing")),
}
CODEC = KeyCodec("string", 128)

keys = st.lists(st.sampled_from(KEYS), min_size=1, max_size=4)
ints = st.integers(-(2**62), 2**62)
op = st.one_of(
    st.tuples(st.just("value_update"), keys, st.lists(ints, min_size=4, max_size=4)),
    st.tuples(st.just("value_clear"), keys),
    st.tuples(st.just("text_update"), keys, st.lists(st.text(max_size=5), min_size=4, max_size=4)),
    st.tuples(
        st.just("list_add"), keys, st.lists(st.floats(allow_nan=False), min_size=4, max_size=4)
    ),
    st.tuples(st.just("list_clear"), keys),
    st.tuples(
        st.just("map_put"),
        keys,
        st.lists(st.sampled_from("xyz"), min_size=4, max_size=4),
        st.lists(ints, min_size=4, max_size=4),
    ),
    st.tuples(
        st.just("map_remove"), keys, st.lists(st.sampled_from("xyz"), min_size=4, max_size=4)
    ),
    st.tuples(st.just("map_clear"), keys),
    st.tuples(st.just("timer_set"), keys, st.lists(st.integers(0, 300), min_size=4, max_size=4)),
    st.tuples(st.just("timer_delete"), keys, st.lists(st.integers(0, 300), min_size=4, max_size=4)),
)
batches = st.lists(
    st.tuples(st.sampled_from([0, 10, 25, 40]), st.lists(op, max_size=6)), min_size=2, max_size=10
)


class Model:
    """The same states as dicts, with expiry times for the TTL ones."""

    def __init__(self) -> None:
        self.v: dict[str, int] = {}
        self.s: dict[str, tuple[str, int]] = {}  # value, expiry
        self.l: dict[str, list[float]] = {}
        self.m: dict[tuple[str, str], tuple[int, int]] = {}
        self.timers: set[tuple[int, str]] = set()

    def live_s(self, k, now):
        v = self.s.get(k)
        return v[0] if v and v[1] > now else None

    def live_m(self, now):
        return {km: v for km, (v, e) in self.m.items() if e > now}

    def apply(self, op, now):
        kind, ks, *rest = op
        if kind == "value_update":
            for k, x in zip(ks, rest[0], strict=False):
                self.v[k] = x
        elif kind == "value_clear":
            for k in ks:
                self.v.pop(k, None)
        elif kind == "text_update":
            for k, x in zip(ks, rest[0], strict=False):
                self.s[k] = (x, now + TTL_MS)
        elif kind == "list_add":
            for k, x in zip(ks, rest[0], strict=False):
                self.l.setdefault(k, []).append(x)
        elif kind == "list_clear":
            for k in ks:
                self.l.pop(k, None)
        elif kind == "map_put":
            for k, mk, x in zip(ks, rest[0], rest[1], strict=False):
                self.m[(k, mk)] = (x, now + TTL_MS)
        elif kind == "map_remove":
            for k, mk in zip(ks, rest[0], strict=False):
                self.m.pop((k, mk), None)
        elif kind == "map_clear":
            live = self.live_m(now)
            for k in ks:
                for km in [km for km in live if km[0] == k]:
                    self.m.pop(km, None)
        elif kind == "timer_set":
            self.timers |= {(t, k) for k, t in zip(ks, rest[0], strict=False)}
        elif kind == "timer_delete":
            self.timers -= {(t, k) for k, t in zip(ks, rest[0], strict=False)}


def run(op, txn, now):
    kind, ks, *rest = op
    n = min(len(ks), *(len(r) for r in rest)) if rest else len(ks)
    keys_arr = pa.array(ks[:n], pa.string())
    view = {name: open_view(spec, txn, CODEC, {"processing": now}) for name, spec in SPECS.items()}
    if kind == "value_update":
        view["v"].update(keys_arr, pa.array(rest[0][:n], pa.int64()))
    elif kind == "value_clear":
        view["v"].clear(keys_arr)
    elif kind == "text_update":
        view["s"].update(keys_arr, pa.array(rest[0][:n], pa.string()))
    elif kind == "list_add":
        view["l"].add(keys_arr, pa.array(rest[0][:n], pa.float64()))
    elif kind == "list_clear":
        view["l"].clear(keys_arr)
    elif kind == "map_put":
        view["m"].put(keys_arr, pa.array(rest[0][:n]), pa.array(rest[1][:n], pa.int64()))
    elif kind == "map_remove":
        view["m"].remove(keys_arr, pa.array(rest[0][:n]))
    elif kind == "map_clear":
        view["m"].clear(keys_arr)
    else:
        groups, kb = CODEC.encode(keys_arr)
        stamps = rest[0][:n]
        txn.set_timers(EVENT_TIMERS, groups, kb, stamps, registered=kind == "timer_set")
    return view


def check(txn, model, now):
    everyone = pa.array(KEYS, pa.string())
    view = {name: open_view(spec, txn, CODEC, {"processing": now}) for name, spec in SPECS.items()}
    assert view["v"].get(everyone).to_pylist() == [model.v.get(k) for k in KEYS]
    assert view["s"].get(everyone).to_pylist() == [model.live_s(k, now) for k in KEYS]
    assert view["l"].get(everyone).to_pylist() == [model.l.get(k, []) for k in KEYS]
    live = model.live_m(now)
    items = view["m"].items(everyone).to_pylist()
    got = {(KEYS[r["index"]], r["map_key"]): r["value"] for r in items}
    assert got == {km: v for km, v in live.items()}
    probe_k = pa.array([k for k in KEYS for _ in "xyz"], pa.string())
    probe_m = pa.array([m for _ in KEYS for m in "xyz"])
    want = [live.get((k, m)) for k in KEYS for m in "xyz"]
    assert view["m"].get(probe_k, probe_m).to_pylist() == want
    due = txn.due_timers(EVENT_TIMERS, 1 << 40)
    got_timers = {(t, CODEC.decode([k]).to_pylist()[0]) for t, _, k in due}
    assert got_timers == model.timers
    assert [t for t, _, _ in due] == sorted(t for t, _, _ in due)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(program=batches, cut=st.integers(0, 9))
def test_states_match_the_model_across_a_snapshot_and_restore(tmp_path_factory, program, cut):
    root = tmp_path_factory.mktemp("state")
    store = RocksDBStore(root / "db", ALL)
    model, now = Model(), 0
    try:
        for i, (advance, ops) in enumerate(program):
            now += advance
            txn = BufferedTransaction(store)
            expire(SPECS, txn, CODEC, {"processing": now})
            for o in ops:
                run(o, txn, now)
                model.apply(o, now)
                check(txn, model, now)  # reads see the micro-batch's own writes
            txn.commit()
            check(BufferedTransaction(store), model, now)
            if i == cut:  # snapshot, lose the working copy, continue on the restored one
                store.snapshot_to(root / "snap")
                store.close()
                shutil.rmtree(root / "db")
                store = RocksDBStore(root / "snap", ALL)
                check(BufferedTransaction(store), model, now)
    finally:
        store.close()


def test_expired_entries_are_deleted_physically_not_only_hidden(tmp_path):
    with RocksDBStore(tmp_path / "db", ALL) as store:
        txn = BufferedTransaction(store)
        users = pa.array(["a", "b"])
        open_view(SPECS["s"], txn, CODEC, {"processing": 0}).update(users, pa.array(["x", "y"]))
        txn.commit()
        txn = BufferedTransaction(store)  # "a" is written again at 30: expires at 80
        open_view(SPECS["s"], txn, CODEC, {"processing": 30}).update(users[:1], pa.array(["z"]))
        txn.commit()
        txn = BufferedTransaction(store)
        assert expire(SPECS, txn, CODEC, {"processing": 60}) == 1  # "b" only
        txn.commit()
        assert [k for k, _ in store.items("s", CODEC.encode(users[:1])[0][0])] == [b"a"]
        groups, kb = CODEC.encode(users)
        assert store.get_many("s", groups, kb)[1] is None
        txn = BufferedTransaction(store)
        assert expire(SPECS, txn, CODEC, {"processing": 100}) == 1
        txn.commit()
        assert store.get_many("s", groups, kb) == [None, None]


def test_composite_keys_encode_unambiguously_and_decode_back():
    """Each column's bytes are length-prefixed, so ("ab", "c") and ("a", "bc") are different
    keys; decoding gives the struct back; a null in any column is refused."""
    codec = KeyCodec(("string", "bigint", "binary"), 128, ("user", "n", "raw"))
    keys = pa.StructArray.from_arrays(
        [
            pa.array(["ab", "a", "", "日本"]),
            pa.array([1, 1, -(2**63), 2**63 - 1], pa.int64()),
            pa.array([b"c", b"bc", b"", b"\x00\x00\x00\x01"]),
        ],
        ["user", "n", "raw"],
    )
    groups, raw = codec.encode(keys)
    assert len(set(raw)) == 4
    # the stored layout: checkpoints written before any change must still decode
    assert raw[0] == b"\0\0\0\x02ab" + b"\0\0\0\x08" + (1).to_bytes(8, "big") + b"\0\0\0\x01c"
    assert codec.decode(raw).equals(keys)
    assert len(codec.decode([])) == 0
    assert groups.tolist() == key_groups(keys, codec.key_type, 128).tolist()
    with_null = pa.StructArray.from_arrays(
        [pa.array(["a", None]), pa.array([1, 2], pa.int64()), pa.array([b"", b""])],
        ["user", "n", "raw"],
    )
    with pytest.raises(StateAccessError, match="null key columns"):
        codec.encode(with_null)
    with pytest.raises(StateAccessError, match="struct array"):
        codec.encode(pa.array(["a"]))


def test_every_state_takes_composite_keys(tmp_path):
    """Value, list and map state keyed by (user, page): appends to one key arrive in order, a
    TTL cleanup finds composite keys again, and a reopened store reads them back."""
    codec = KeyCodec(("string", "bigint"), 128, ("user", "page"))

    def keys(users, pages):
        return pa.StructArray.from_arrays(
            [pa.array(users), pa.array(pages, pa.int64())], ["user", "page"]
        )

    with RocksDBStore(tmp_path / "db", ALL) as store:
        txn = BufferedTransaction(store)
        clock = {"processing": 0}
        k = keys(["a", "a", "b", "a"], [1, 2, 1, 1])
        open_view(SPECS["v"], txn, codec, clock).update(k, pa.array([1, 2, 3, 4]))
        open_view(SPECS["l"], txn, codec, clock).add(k, pa.array([0.5, 1.5, 2.5, 3.5]))
        open_view(SPECS["m"], txn, codec, clock).put(k, pa.array(["x"] * 4), pa.array([7] * 4))
        txn.commit()
        txn = BufferedTransaction(store)
        unique = keys(["a", "a", "b", "c"], [1, 2, 1, 1])
        assert open_view(SPECS["v"], txn, codec, clock).get(unique).to_pylist() == [4, 2, 3, None]
        lists = open_view(SPECS["l"], txn, codec, clock).get(unique).to_pylist()
        assert lists == [[0.5, 3.5], [1.5], [2.5], []]
        items = open_view(SPECS["m"], txn, codec, clock).items(unique)
        assert items.column("index").to_pylist() == [0, 1, 2]
        assert expire(SPECS, txn, codec, {"processing": TTL_MS + 1}) == 3  # the map entries
        txn.commit()
        txn = BufferedTransaction(store)
        assert open_view(SPECS["m"], txn, codec, clock).items(unique).num_rows == 0
