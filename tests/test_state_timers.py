"""Timers in the state processor (state/state_timers.py), on real RocksDB over the local
filesystem and moto's S3 server: event- and processing-time timers registered at parallelism 2
as a keyed function registers them, read out of the checkpoint, written into a savepoint at
parallelism 3 and read back: every timer equal to a reference computed from the users alone,
each once, under its key's key group; timers tables that do not fit are refused naming what."""

from __future__ import annotations

import pyarrow as pa
import pytest

from state.keygroups import key_groups
from state.paths import SavepointLayout
from state.savepoint import read_savepoint
from state.savepoint_writer import write_states_savepoint
from state.state_timers import encode_timers, read_timers
from state.state_types import KeyCodec
from state.state_writer import StateWriteError
from tests.test_savepoint import beside
from tests.test_state_reader import JOB, MAX, TOTAL, USERS, number, write_and_snapshot

CODEC = KeyCodec("string", MAX)
KEY = ("user",)
SETS = {"event": "__event_timers__", "processing": "__processing_timers__"}


def register(views, keys: pa.Array) -> None:
    """Each user's timers, which follow from its number: an event-time timer at 1,000 times
    it and another 60 s later; a processing-time timer at 7 plus it for every third user."""
    users = keys.to_pylist()
    txn = views["total"].txn
    groups, kbytes = CODEC.encode(keys)
    for shift in (0, 60_000):
        txn.set_timers(SETS["event"], groups, kbytes,
                       [1_000 * number(u) + shift for u in users], registered=True)  # fmt: skip
    third = [i for i, u in enumerate(users) if number(u) % 3 == 0]
    txn.set_timers(SETS["processing"], groups[third], [kbytes[i] for i in third],
                   [7 + number(users[i]) for i in third], registered=True)  # fmt: skip


def reference(users: list[str]) -> list[dict]:
    group = dict(zip(users, (int(g) for g in key_groups(users, "string", MAX)), strict=True))
    rows = [
        {"user": u, "key_group": group[u], "timestamp": 1_000 * number(u) + shift,
         "domain": "event"}
        for u in users for shift in (0, 60_000)
    ] + [
        {"user": u, "key_group": group[u], "timestamp": 7 + number(u), "domain": "processing"}
        for u in users if number(u) % 3 == 0
    ]  # fmt: skip
    return sorted(rows, key=lambda r: (r["timestamp"], r["domain"], r["user"]))


def in_order(table: pa.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda r: (r["timestamp"], r["domain"], r["user"]))


def test_timers_read_out_written_at_another_layout_read_back_the_same(tmp_path, storage):
    manifest = write_and_snapshot(tmp_path, storage, [TOTAL], CODEC, pa.array(USERS), register)
    read = read_timers(manifest, storage, "stage", SETS, CODEC, KEY, tmp_path / "scratch")
    assert read.column_names == ["user", "key_group", "timestamp", "domain"]
    expected = reference(USERS)
    assert in_order(read) == expected
    target = beside(storage, tmp_path, "with-timers")
    encoded = encode_timers(read.drop_columns(["key_group"]), SETS, CODEC, KEY, "stage")
    write_states_savepoint(
        {"stage": [encoded]}, target, job_id=JOB, stages={"stage": {}}, parallelism=3,
        max_parallelism=MAX,
    )  # fmt: skip
    saved = read_savepoint(target)
    assert sorted(h.subtask for h in saved.subtasks) == [0, 1, 2]
    again = read_timers(saved, target, "stage", SETS, CODEC, KEY, tmp_path / "s2",
                        SavepointLayout())  # fmt: skip
    assert in_order(again) == expected, "each timer once, under its key's key group"


@pytest.mark.parametrize("storage", ["local"], indirect=True)
@pytest.mark.parametrize(
    "change, says",
    [
        (lambda t: t.drop_columns(["domain"]), r"missing \['domain'\]"),
        (lambda t: t.append_column("x", pa.array([1] * t.num_rows)), r"unexpected \['x'\]"),
        (lambda t: t.set_column(3, "domain", pa.array(["wall"] * t.num_rows)),
         r"timer domain\(s\) \['wall'\]"),
        (lambda t: t.set_column(1, "key_group", pa.array([5000] * t.num_rows, pa.int32())),
         "is in key group"),
    ],
)  # fmt: skip
def test_timers_tables_that_do_not_fit_are_refused_naming_what(change, says, tmp_path, storage):
    users = USERS[:20]
    group = [int(g) for g in key_groups(users, "string", MAX)]
    table = pa.table({"user": users, "key_group": pa.array(group, pa.int32()),
                      "timestamp": pa.array(range(20), pa.int64()),
                      "domain": ["event"] * 20})  # fmt: skip
    encode_timers(table, SETS, CODEC, KEY, "stage 'x'")  # as read: it fits
    with pytest.raises(StateWriteError, match=says):
        encode_timers(change(table), SETS, CODEC, KEY, "stage 'x'")
