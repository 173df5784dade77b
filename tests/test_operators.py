"""The library operators (cutline/operators.py) on real RocksDB, against simple reference
computations, run the way the runtime runs every stage: records in log order, the stage's writes
committed in one write batch."""

from __future__ import annotations

import ast
import collections
import inspect

import numpy as np
import pyarrow as pa
import pytest

import cutline.operators
from cutline import __all__ as PUBLIC_API
from cutline.job import KeyedProcess
from cutline.keyed_process import (
    EVENT_TIMERS,
    OperatorResult,
    ProcessOperator,
    UserFunctionError,
)
from cutline.operators import EnrichWithLatest, KeyedAggregate, WindowedAggregate
from state.keygroups import KeyGroupRange, key_groups
from state.rocksdb_store import RocksDBStore
from state.write_buffer import BufferedTransaction


@pytest.fixture
def store(tmp_path):
    with RocksDBStore(tmp_path / "db", KeyGroupRange(0, 127)) as s:
        yield s


def batch(users, values=None, ts=None, source="s", **extra) -> pa.Table:
    n = len(users)
    cols = {
        "user": pa.array(users, pa.string()),
        "v": pa.array(values if values is not None else [1.0] * n, pa.float64()),
        "ts": pa.array(ts if ts is not None else [0] * n, pa.int64()),
        "_kg": pa.array(key_groups(users, "string"), pa.int32()),
        "_source": pa.array([source] * n, pa.string()),
        "_partition": pa.array([0] * n, pa.int32()),
        "_next_offset": pa.array(np.arange(1, n + 1), pa.int64()),
    }
    cols.update({k: pa.array(v) for k, v in extra.items()})
    return pa.table(cols)


class Stage:
    """A stage applied as a subtask applies it: records sorted into log order, the write batch
    committed."""

    def __init__(self, spec: KeyedProcess) -> None:
        self.op = ProcessOperator(spec, 128)

    def apply(self, store: RocksDBStore, table: pa.Table, watermark: int | None) -> OperatorResult:
        log_order = [(c, "ascending") for c in ("_source", "_partition", "_next_offset")]
        result = self.op.apply(store, table.sort_by(log_order), watermark, 0)
        result.txn.commit()
        return result


def test_the_library_uses_only_the_public_api():
    tree = ast.parse(inspect.getsource(cutline.operators))
    imported = {
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] in ("spark_jobs", "state")
        for alias in node.names
    }
    assert imported, "the library imports Cutline's API"
    private = sorted(f"{m}.{n}" for m, n in imported if n not in PUBLIC_API)
    assert private == [], f"the library reaches past the cutline package: {private}"


def test_keyed_aggregate_matches_a_reference_over_batches(store):
    op = Stage(
        KeyedAggregate(
            "agg",
            "s",
            "user",
            "string",
            {"n": ("count", None), "total": ("sum", "v"), "lo": ("min", "v"), "hi": ("max", "v")},
        )
    )
    rng = np.random.default_rng(1)
    seen = collections.defaultdict(list)
    for _ in range(3):
        users = [f"u{i}" for i in rng.integers(0, 50, 400)]
        values = rng.normal(size=400).round(3).tolist()
        for u, v in zip(users, values, strict=True):
            seen[u].append(v)
        out = op.apply(store, batch(users, values), None).output
        for row in out.to_pylist():
            vs = seen[row["user"]]
            assert row["n"] == len(vs)
            assert row["total"] == pytest.approx(sum(vs))
            assert (row["lo"], row["hi"]) == (min(vs), max(vs))
        assert sorted(out.column("user").to_pylist()) == sorted(set(users))


def test_last_keeps_the_latest_value_by_event_time_across_batches_and_reopens(tmp_path):
    spec = KeyedAggregate(
        "agg",
        "s",
        "user",
        "string",
        {"n": ("count", None), "p": ("last", "payload"), "q": ("last", "tag"), "at": ("max", "ts")},
        event_time="ts",
    )
    rng = np.random.default_rng(2)
    latest: dict[str, tuple[int, str | None, bytes]] = {}
    counts: collections.Counter[str] = collections.Counter()
    db = tmp_path / "db"
    for step in range(4):
        n = 300
        users = [f"u{i}" for i in rng.integers(0, 40, n)]
        ts = rng.integers(0, 50, n).tolist()  # out of order, with ties within and across batches
        payload = [None if i % 17 == 0 else "x" * int(i % 7) + f"{step}-{i}" for i in range(n)]
        tag = [bytes([step, i % 256]) * (i % 3) for i in range(n)]
        table = batch(users, ts=ts, payload=pa.array(payload, pa.string()), tag=tag)
        table = table.set_column(
            table.schema.get_field_index("_next_offset"),
            "_next_offset",
            pa.array(rng.permutation(n) + 1, pa.int64()),
        )
        offsets = table.column("_next_offset").to_pylist()
        for u, t, p, g, _offset in sorted(
            zip(users, ts, payload, tag, offsets, strict=True), key=lambda r: (r[1], r[4])
        ):
            counts[u] += 1
            if u not in latest or t >= latest[u][0]:
                latest[u] = (t, p, g)
        with RocksDBStore(db, KeyGroupRange(0, 127)) as store:  # state survives a reopen
            out = Stage(spec).apply(store, table, None).output
        assert out.schema.field("p").type == pa.string()
        assert out.schema.field("q").type == pa.binary()
        for row in out.to_pylist():
            t, p, g = latest[row["user"]]
            assert (row["n"], row["at"], row["p"], row["q"]) == (counts[row["user"]], t, p, g)


def test_last_needs_a_string_or_binary_column(store):
    spec = KeyedAggregate("agg", "s", "user", "string", {"p": ("last", "v")}, event_time="ts")
    with pytest.raises(UserFunctionError, match="'last' of 'v' needs a string or binary column"):
        Stage(spec).apply(store, batch(["a"]), None)


def test_keyed_aggregate_rejects_null_keys_and_foreign_key_groups(tmp_path):
    op = Stage(KeyedAggregate("agg", "s", "user", "string", {"n": ("count", None)}))
    with RocksDBStore(tmp_path / "db", KeyGroupRange(0, 63)) as store:
        users = [f"u{i}" for i in range(200)]
        with pytest.raises(UserFunctionError, match="KeyGroupError"):
            op.apply(store, batch(users), None)
        bad = batch(["a"]).set_column(0, "user", pa.array([None], pa.string()))
        with pytest.raises(UserFunctionError, match="1 null keys"):
            op.apply(store, bad, None)


def test_windows_fire_when_the_watermark_passes_and_late_records_are_dropped(store):
    spec = WindowedAggregate(
        "win", "s", "user", "string", "ts", 10, 0, {"n": ("count", None), "rev": ("sum", "v")}
    )
    op = Stage(spec)
    first = op.apply(store, batch(["a", "a", "b", "a"], [1, 2, 3, 4], [1, 5, 7, 12]), None)
    assert first.output.num_rows == 0 and first.max_event_time == 12
    # Watermark 12: window [0, 10) is complete; the record at ts 3 is late, [10, 20) is open.
    second = op.apply(store, batch(["a", "b"], [10, 20], [3, 15]), 12)
    assert second.late_records == 1
    fired = sorted(second.output.to_pylist(), key=lambda r: r["user"])
    assert fired == [
        {"user": "a", "window_start": 0, "window_end": 10, "n": 2, "rev": 3.0},
        {"user": "b", "window_start": 0, "window_end": 10, "n": 1, "rev": 3.0},
    ]
    third = op.apply(store, batch([], [], []), 19)
    assert sorted((r["user"], r["n"], r["rev"]) for r in third.output.to_pylist()) == [
        ("a", 1, 4.0),
        ("b", 1, 20.0),
    ]
    assert BufferedTransaction(store).due_timers(EVENT_TIMERS, 10**9) == [], "no timers left"
    assert [k for kg in range(128) for k, _ in store.items("windows", kg)] == [], "nor state"


def test_enrich_applies_the_table_side_first_and_keeps_types(store):
    spec = EnrichWithLatest(
        "join", "orders", "profiles", "user", "string", ("country", "tier"), "ts"
    )
    op = Stage(spec)
    profiles = batch(
        ["a", "a", "b"],
        ts=[5, 9, 1],
        source="profiles",
        country=["DE", "FR", "US"],
        tier=pa.array([1, 2, 0], pa.int32()),
    )
    orders = (
        batch(["a", "b", "c"], ts=[10, 10, 10], source="orders")
        .append_column("country", pa.nulls(3, pa.string()))
        .append_column("tier", pa.nulls(3, pa.int32()))
    )
    out = op.apply(store, pa.concat_tables([profiles, orders]), None).output
    rows = {r["user"]: (r["country"], r["tier"]) for r in out.to_pylist()}
    assert rows == {"a": ("FR", 2), "b": ("US", 0), "c": (None, None)}
    assert out.schema.field("tier").type == pa.int32()


def test_enrich_keeps_the_latest_profile_by_event_time_not_the_last_arrived(store):
    """A profile at ts 100 ("DE"), then in a later micro-batch one at ts 50 ("FR"): the order
    after them is enriched with "DE". Equal event times: the later arrival wins, in a batch and
    across batches."""
    spec = EnrichWithLatest("join", "orders", "profiles", "user", "string", ("country",), "ts")
    op = Stage(spec)

    def profiles(users, ts, countries):
        return batch(users, ts=ts, source="profiles", country=countries)

    def enrich(users):
        orders = batch(users, ts=[200] * len(users), source="orders")
        orders = orders.append_column("country", pa.nulls(len(users), pa.string()))
        out = op.apply(store, orders, None).output
        return {r["user"]: r["country"] for r in out.to_pylist()}

    op.apply(store, profiles(["a", "b", "c"], [100, 7, 7], ["DE", "US", "JP"]), None)
    op.apply(store, profiles(["a", "b", "c", "c"], [50, 7, 7, 6], ["FR", "BR", "DE", "FR"]), None)
    assert enrich(["a", "b", "c"]) == {"a": "DE", "b": "BR", "c": "DE"}
    # one batch: the latest event time wins whatever the arrival order; ties: the later row
    op.apply(store, profiles(["d", "d", "d", "e", "e"], [9, 3, 9, 1, 0], list("XYZUV")), None)
    assert enrich(["d", "e"]) == {"d": "Z", "e": "U"}


def test_composite_keys_aggregate_and_window_per_column_combination(store):
    """A key of two columns: each (user, page) pair has its own running count, and its own
    windows fired by timers whose keys come back as both columns."""
    rng = np.random.default_rng(5)
    per_pair = Stage(
        KeyedAggregate("pairs", "s", ("user", "page"), ("string", "bigint"), {"n": ("count", None)})
    )
    windows = Stage(
        WindowedAggregate(
            "win", "s", ("user", "page"), ("string", "bigint"), "ts", 10, 0, {"n": ("count", None)}
        )
    )
    counts: collections.Counter = collections.Counter()
    per_window: collections.Counter = collections.Counter()
    fired, watermark = [], None
    for step in range(4):
        users = [f"u{i}" for i in rng.integers(0, 5, 200)]
        pages = rng.integers(0, 4, 200).tolist()
        ts = (step * 10 + rng.integers(0, 10, 200)).tolist()
        table = batch(users, ts=ts, page=pa.array(pages, pa.int64()))
        out = per_pair.apply(store, table, None).output
        counts.update(zip(users, pages, strict=True))
        got = {(r["user"], r["page"]): r["n"] for r in out.to_pylist()}
        assert got == {k: counts[k] for k in set(zip(users, pages, strict=True))}
        per_window.update((u, p, t // 10 * 10) for u, p, t in zip(users, pages, ts, strict=True))
        fired += windows.apply(store, table, watermark).output.to_pylist()
        watermark = max(ts)
    fired += windows.apply(
        store, batch([], ts=[], page=pa.array([], pa.int64())), 10**6
    ).output.to_pylist()
    got = {(r["user"], r["page"], r["window_start"]): r["n"] for r in fired}
    assert got == dict(per_window), "every (user, page) window, once, with its count"
