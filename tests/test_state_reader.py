"""Reading a state out of a checkpoint (state/state_reader.py), on real RocksDB over the local
filesystem and moto's S3 server: states written through the views user functions get
(state/user_state.py) at parallelism 2 (value, list, map, with a TTL, keyed by one column and by
two), snapshotted, then read back: every row equal to a reference computed by this test from
the users alone (each user's values follow from its number; its key group is Spark's hash,
checked against Spark in tests/test_keygroups.py), in the columns the module docstring names; a
state recorded in another form, or a stage the checkpoint lacks, is refused naming it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest

from state.keygroups import key_group_range, key_groups
from state.local_copies import LocalCopies
from state.manifest import CheckpointManifest
from state.rocksdb_store import RocksDBStore
from state.snapshot import SubtaskSnapshotter
from state.state_reader import StateReadError, read_state
from state.state_types import KeyCodec, ListStateSpec, MapStateSpec, Ttl, ValueStateSpec
from state.user_state import open_view
from state.write_buffer import BufferedTransaction

JOB, MAX, NOW = "job1", 128, 1_000_000
TOTAL = ValueStateSpec("total", pa.int64())
SEEN = ListStateSpec("seen", pa.string())
LAST = MapStateSpec("last", pa.float64(), key_type=pa.string())
FRESH = ValueStateSpec("fresh", pa.int32(), ttl=Ttl(5_000))
USERS = [f"u{i}" for i in range(500)]


def number(user: str) -> int:
    return int(user[1:])


def write_all(views, keys: pa.Array) -> None:
    """Each user's entries, which follow from its number: a total, a two-element list, a map of
    two entries, a value with a TTL."""
    users, n = keys.to_pylist(), len(keys)
    views["total"].update(keys, pa.array([3 * number(u) for u in users], pa.int64()))
    twice = pa.concat_arrays([keys, keys])
    firsts, seconds = [f"a{u}" for u in users], [f"b{number(u) % 4}" for u in users]
    views["seen"].add(twice, pa.array(firsts + seconds))
    halves = [number(u) / 2 for u in users]
    views["last"].put(twice, pa.array(["x"] * n + ["y"] * n), pa.array(halves + [-1.0] * n))
    views["fresh"].update(keys, pa.array([number(u) % 7 for u in users], pa.int32()))


def reference(users: list[str]) -> dict[str, list[dict]]:
    """The rows each state must read back as, sorted as :func:`sorted_rows` sorts them."""
    group = dict(zip(users, (int(g) for g in key_groups(users, "string", MAX)), strict=True))
    users = sorted(users)
    out = {
        "total": [{"user": u, "key_group": group[u], "value": 3 * number(u)} for u in users],
        "seen": [
            {"user": u, "key_group": group[u], "list_index": i, "list_element": e}
            for u in users
            for i, e in enumerate([f"a{u}", f"b{number(u) % 4}"])
        ],
        "last": [
            {"user": u, "key_group": group[u], "user_map_key": k, "user_map_value": v}
            for u in users
            for k, v in (("x", number(u) / 2), ("y", -1.0))
        ],
        "fresh": [
            {"user": u, "key_group": group[u], "value": number(u) % 7, "expires_at_ms": NOW + 5_000}
            for u in users
        ],
    }
    return out


def sorted_rows(table: pa.Table) -> list[dict]:
    keys = [c for c in ("user", "list_index", "user_map_key") if c in table.column_names]
    return table.sort_by([(c, "ascending") for c in keys]).to_pylist()


def write_and_snapshot(
    tmp_path, storage, specs, codec, keys: pa.Array, write
) -> CheckpointManifest:
    """Each subtask of 2 writes the keys of its key groups with ``write(views, keys)``."""
    groups, _ = KeyCodec(codec.key_type, MAX, codec.names).encode(keys)
    pool, handles = ThreadPoolExecutor(1), []
    for i in range(2):
        kg = key_group_range(i, 2, MAX)
        mine = keys.filter(pa.array([g in kg for g in groups]))
        copies = LocalCopies(tmp_path / "local", JOB, "stage", i)
        with RocksDBStore(copies.db_dir, kg) as store:
            txn = BufferedTransaction(store)
            views = {s.name: open_view(s, txn, codec, {"processing": NOW}) for s in specs}
            write(views, mine)
            txn.commit()
            snapshotter = SubtaskSnapshotter(storage, copies, JOB, "stage", i, executor=pool)
            handles.append(snapshotter.snapshot(store, 3, None).result())
    pool.shutdown()
    stages = {"stage": {s.name: s.fingerprint() for s in specs}}
    return CheckpointManifest(JOB, 3, 7, 1, 0, {}, tuple(handles), stages=stages)


def test_value_list_map_and_ttl_states_come_back_as_written(tmp_path, storage):
    codec = KeyCodec("string", MAX)
    specs = [TOTAL, SEEN, LAST, FRESH]
    m = write_and_snapshot(tmp_path, storage, specs, codec, pa.array(USERS), write_all)
    read = {
        s.name: read_state(m, storage, "stage", s, codec, ("user",), tmp_path / "s") for s in specs
    }
    assert read["total"].column_names == ["user", "key_group", "value"]
    assert read["seen"].column_names == ["user", "key_group", "list_index", "list_element"]
    assert read["last"].column_names == ["user", "key_group", "user_map_key", "user_map_value"]
    assert read["fresh"].column_names == ["user", "key_group", "value", "expires_at_ms"]
    expected = reference(USERS)
    for name, table in read.items():
        assert sorted_rows(table) == expected[name], name


def test_a_composite_key_comes_back_as_its_columns(tmp_path, storage):
    codec = KeyCodec(("string", "bigint"), MAX, ("user", "page"))
    keys = pa.StructArray.from_arrays(
        [pa.array(USERS), pa.array(range(500), pa.int64())], ["user", "page"]
    )

    def write(views, mine):
        views["total"].update(mine, pc_page(mine))

    m = write_and_snapshot(tmp_path, storage, [TOTAL], codec, keys, write)
    table = read_state(m, storage, "stage", TOTAL, codec, ("user", "page"), tmp_path / "s")
    assert table.column_names == ["user", "page", "key_group", "value"]
    rows = table.to_pylist()
    assert len(rows) == 500 and all(r["value"] == r["page"] for r in rows)
    assert {r["user"] for r in rows} == set(USERS)


def pc_page(keys: pa.StructArray) -> pa.Array:
    return keys.field("page")


def test_another_stored_form_or_a_missing_stage_is_refused_naming_it(tmp_path, storage):
    codec = KeyCodec("string", MAX)
    m = write_and_snapshot(
        tmp_path, storage, [TOTAL], codec, pa.array(USERS[:10]),
        lambda views, keys: views["total"].update(keys, pa.array([1] * len(keys), pa.int64())),
    )  # fmt: skip
    changed = ValueStateSpec("total", pa.float64())
    with pytest.raises(
        StateReadError, match=r"stage uid 'stage' stored state 'total' as value<int64>"
    ):
        read_state(m, storage, "stage", changed, codec, ("user",), tmp_path / "s")
    with pytest.raises(
        StateReadError, match=r"holds no state of stage uid 'other' \(it holds: \['stage'\]\)"
    ):
        read_state(m, storage, "other", TOTAL, codec, ("user",), tmp_path / "s")


def test_a_moved_savepoint_is_read_where_it_is_now_before_any_restore(
    tmp_path, storage, monkeypatch
):
    """``cutline state read --checkpoint LOCATION`` (``load_state``): a savepoint copied to
    another directory or bucket, its original and the job's own files deleted, reads back with
    the job's definition as the reference says, from where it is now."""
    import uuid

    from cutline import (
        CheckpointConfig,
        DeltaSink,
        JobDefinition,
        KeyedProcess,
        KeyedProcessFunction,
        LogSource,
    )
    from spark_jobs.commands.state_read import load_state
    from spark_jobs.deploy.settings import RuntimePaths
    from state.savepoint import delete_savepoint, write_savepoint
    from state.storage import LocalFileStorage, S3Storage

    class Counts(KeyedProcessFunction):
        states = (TOTAL, SEEN, LAST, FRESH)

    job = JobDefinition(
        name=JOB,
        sources=(LogSource("clicks", "clicks", "user string, ts long"),),
        operator=KeyedProcess("stage", {"clicks": "user"}, "string", Counts()),
        sink=DeltaSink("out", "out"),
        checkpoint=CheckpointConfig(interval_ms=1_000),
        max_parallelism=MAX,
    )
    codec = KeyCodec("string", MAX)
    m = write_and_snapshot(tmp_path, storage, job.operator.function.states, codec,
                           pa.array(USERS), write_all)  # fmt: skip
    if isinstance(storage, LocalFileStorage):
        first, moved = LocalFileStorage(tmp_path / "sp"), LocalFileStorage(tmp_path / "elsewhere")
    else:
        endpoint = storage._client.meta.endpoint_url
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
        bucket = f"cutline-moved-{uuid.uuid4().hex[:12]}"
        storage._client.create_bucket(Bucket=bucket)
        first = S3Storage(storage.bucket, "sp", endpoint_url=endpoint)
        moved = S3Storage(bucket, "elsewhere/sp", endpoint_url=endpoint)
    write_savepoint(m, storage, first)
    for info in first.list():
        first.copy_to(info.path, moved, info.path)
    delete_savepoint(first)
    storage.delete_many([i.path for i in storage.list(JOB)])
    paths = RuntimePaths.under(tmp_path / "home")  # no catalog: the location is all it needs
    expected = reference(USERS)
    for spec in job.operator.function.states:
        table = load_state(job, "stage", spec.name, paths, moved.url)
        assert sorted_rows(table) == expected[spec.name], spec.name
