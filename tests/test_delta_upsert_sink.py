"""The Delta upsert sink (delta-rs only, no Spark): the table holds each key's latest row; a
redone commit, a replay by a newer attempt and an older attempt's late commit change nothing;
rows without a key are refused naming the sink and column."""

from __future__ import annotations

import pyarrow as pa
import pytest

from cutline import DeltaUpsertSink, JobDefinitionError
from cutline.sinks.upsert import DeltaUpsertWriter
from spark_jobs.catalog.tables import read_delta
from state.catalog import FencedError

ENDS = {e: {"clicks": {"0": 10 * e}} for e in range(20)}
SINK = DeltaUpsertSink("latest", "latest_counts", key="user")


def stage(writer: DeltaUpsertWriter, epoch: int, rows: list[tuple], subtask: int = 0) -> None:
    users, counts = zip(*rows, strict=True) if rows else ((), ())
    schema = pa.schema([("user", pa.string()), ("n", pa.int64())])
    table = pa.table({"user": list(users), "n": list(counts)}, schema=schema)
    writer.staged.write(epoch, f"part-{subtask:05d}", table)


def table_rows(writer: DeltaUpsertWriter, *columns: str) -> list[tuple]:
    data = read_delta(writer.table_path)
    return sorted(zip(*(data[c].to_pylist() for c in columns), strict=True))


def writer(tmp_path, attempt: int, sink: DeltaUpsertSink = SINK) -> DeltaUpsertWriter:
    w = sink.writer(
        "job", attempt, output=str(tmp_path / "tables"), staging=str(tmp_path / "staging")
    )
    assert isinstance(w, DeltaUpsertWriter)
    return w


def test_the_table_holds_each_keys_latest_row_across_commits(tmp_path):
    w = writer(tmp_path, 1)
    w.fence()
    stage(w, 0, [("a", 1), ("b", 1), ("a", 2)])  # a's rows in emission order: 2 is the latest
    assert w.commit_through(0, ENDS) == 3
    assert table_rows(w, "user", "n", "_epoch") == [("a", 2, 0), ("b", 1, 0)]
    stage(w, 1, [("b", 5)])
    stage(w, 2, [("c", 1), ("b", 6)])
    stage(w, 2, [("d", 9)], subtask=1)
    assert w.commit_through(2, ENDS) == 4  # two epochs in one commit: b's epoch-2 row wins
    assert table_rows(w, "user", "n", "_epoch") == [
        ("a", 2, 0),
        ("b", 6, 2),
        ("c", 1, 2),
        ("d", 9, 2),
    ]
    assert w.commit_through(2, ENDS) == 0, "a redone commit commits nothing twice"
    assert w.committed_epoch() == 2 and w.committed_ends(-1) == {e: ENDS[e] for e in range(3)}


def test_a_replay_by_the_next_attempt_changes_nothing_and_the_older_attempt_is_fenced(tmp_path):
    """Attempt 1 committed through epoch 1 and staged epoch 2 when it died; attempt 2 restores
    from the checkpoint of epoch 0, replays epochs 1 and 2 (the same rows) and commits: the
    table is what one run gives. Attempt 1's late commit is refused."""
    old = writer(tmp_path, 1)
    old.fence()
    stage(old, 0, [("a", 1)])
    stage(old, 1, [("a", 2), ("b", 1)])
    assert old.commit_through(1, ENDS) == 3
    once = table_rows(old, "user", "n", "_epoch")
    stage(old, 2, [("a", 3)])
    new = writer(tmp_path, 2)
    new.fence()
    new.discard_other_attempts()
    stage(new, 1, [("a", 2), ("b", 1)])  # the replay of a committed epoch ...
    stage(new, 2, [("a", 3)])
    assert new.commit_through(1, ENDS) == 0  # ... commits nothing
    assert table_rows(new, "user", "n", "_epoch") == once
    with pytest.raises(FencedError, match="attempt 2 started"):
        old.commit_through(2, ENDS)
    assert new.commit_through(2, ENDS) == 1
    assert table_rows(new, "user", "n", "_epoch") == [("a", 3, 2), ("b", 1, 1)]


def test_order_by_picks_the_latest_row_and_composite_keys_upsert_by_every_column(tmp_path):
    sink = DeltaUpsertSink("latest", "latest_pages", key=("user", "url"), order_by="ts")
    w = writer(tmp_path, 1, sink)
    w.fence()
    rows = {"user": ["a", "a", "a", "b"], "url": ["/1", "/1", "/2", "/1"], "ts": [5, 3, 1, 2]}
    w.staged.write(0, "part-00000", pa.table(rows))
    w.commit_through(0, ENDS)
    assert table_rows(w, "user", "url", "ts") == [("a", "/1", 5), ("a", "/2", 1), ("b", "/1", 2)]
    w.staged.write(1, "part-00000", pa.table({"user": ["a"], "url": ["/1"], "ts": [4]}))
    w.commit_through(1, ENDS)  # an older ts in a later epoch: the row in the table is newer ...
    assert ("a", "/1", 4) in table_rows(w, "user", "url", "ts")  # ... but a commit replaces it


def test_a_row_without_its_key_is_refused_naming_the_sink_and_column(tmp_path):
    w = writer(tmp_path, 1)
    w.fence()
    w.staged.write(0, "part-00000", pa.table({"user": ["a", None], "n": [1, 2]}))
    with pytest.raises(ValueError, match=r"sink 'latest': 1 rows .* null key column 'user'"):
        w.commit_through(0, ENDS)
    assert w.staged.epochs() == [0], "the refused epoch stays staged"
    other = writer(tmp_path / "other", 1)
    other.staged.write(0, "part-00000", pa.table({"name": ["a"], "n": [1]}))
    with pytest.raises(ValueError, match=r"sink 'latest': the stage's output has no column 'user'"):
        other.commit_through(0, ENDS)


def test_definitions_are_checked():
    with pytest.raises(JobDefinitionError, match="sink 'x': key must be a column"):
        DeltaUpsertSink("x", "t", key=())
    with pytest.raises(JobDefinitionError, match="'_epoch' is the runtime's"):
        DeltaUpsertSink("x", "t", key="user", order_by="_epoch")
    assert DeltaUpsertSink("x", "t", key=["a", "b"]).key == ("a", "b")


def test_commits_beside_a_concurrent_writer_land_once_each(tmp_path, monkeypatch):
    """Another writer appending to the table between a MERGE's plan and its commit (on the
    first try of every odd epoch's commit): the MERGE is planned again on the new version, never
    lost, never doubled."""
    from state.storage.tables import write_table

    w = writer(tmp_path, 1)
    w.fence()
    stage(w, 0, [("a", 1)])
    w.commit_through(0, ENDS)
    merge, landed = w._write, []

    def interfered(dt, data, first, properties):
        epoch = int(data.column("_epoch").to_pylist()[-1]) if data.num_rows else -1
        if epoch % 2 and epoch not in landed:  # a key the sink never writes
            zz = pa.table({"user": ["zz"], "n": [0], "_epoch": [-1]})
            write_table(w.table_path, zz, mode="append")
            landed.append(epoch)
        merge(dt, data, first, properties)

    monkeypatch.setattr(w, "_write", interfered)
    for e in range(1, 11):
        stage(w, e, [("a", e + 1), (f"k{e}", e)])
        w.commit_through(e, ENDS)
    rows = [r for r in table_rows(w, "user", "n", "_epoch") if r[0] != "zz"]
    assert rows == sorted([("a", 11, 10)] + [(f"k{e}", e, e) for e in range(1, 11)])
    assert w.committed_epoch() == 10
    assert landed == [1, 3, 5, 7, 9] and w.conflicts_retried == 5, w.conflicts_retried
    assert len([r for r in table_rows(w, "user") if r[0] == "zz"]) == 5
