"""Placement helpers without Spark: which host each subtask prefers, and the Arrow IPC chunks a
micro-batch is cut into on its way to the subtasks."""

from __future__ import annotations

import pyarrow as pa

from spark_jobs.placement import lost_subtasks, preferred_hosts, spark_host_for
from spark_jobs.subtask import SUBTASK_COLUMN, BatchPlan, _read_chunks, split_by_subtask


def test_a_hinted_host_is_preferred_only_where_an_executor_runs():
    spark_hosts = {"127.0.0.2", "127.0.0.3"}
    allocation = {"0": "127.0.0.2", "1": "127.0.0.3", "2": "gone.invalid", "3": "localhost"}
    assert preferred_hosts(allocation, 5, spark_hosts) == [
        ["127.0.0.2"],
        ["127.0.0.3"],
        [],  # the host is gone: no preference, the subtask goes where Spark has room
        [],  # localhost is 127.0.0.1: no executor there
        [],  # no hint
    ]


def test_a_hint_matches_the_executor_host_by_name_or_address():
    assert spark_host_for("localhost", {"127.0.0.1", "127.0.0.9"}) == "127.0.0.1"
    assert spark_host_for("127.0.0.1", {"localhost"}) == "localhost"
    assert spark_host_for("nothing.invalid", {"127.0.0.1"}) is None


def test_a_host_without_executors_is_lost_with_the_subtasks_it_held():
    allocation = {"0": "127.0.0.2", "1": "127.0.0.3", "2": "127.0.0.2", "3": "127.0.0.3"}
    assert lost_subtasks(allocation, {"127.0.0.2", "127.0.0.3"}) == {}
    assert lost_subtasks(allocation, {"127.0.0.2"}) == {"127.0.0.3": [1, 3]}
    assert lost_subtasks(allocation, set()) == {"127.0.0.2": [0, 2], "127.0.0.3": [1, 3]}


def _plan(schema: pa.Schema) -> BatchPlan:
    return BatchPlan(ctx=None, epoch=1, previous_epoch=0, schema=schema)  # type: ignore[arg-type]


def test_a_partition_is_cut_into_one_chunk_per_subtask_and_read_back_whole():
    batches = [
        pa.record_batch({"user": ["a", "b", "c"], SUBTASK_COLUMN: pa.array([2, 0, 2], pa.int32())}),
        pa.record_batch({"user": ["d"], SUBTASK_COLUMN: pa.array([0], pa.int32())}),
    ]
    (out,) = list(split_by_subtask(iter(batches)))
    chunks = dict(
        zip(out.column("subtask").to_pylist(), out.column("chunk").to_pylist(), strict=True)
    )
    assert sorted(chunks) == [0, 2]
    plan = _plan(batches[0].schema)
    assert sorted(_read_chunks(plan, [chunks[0], None]).column("user").to_pylist()) == ["b", "d"]
    assert _read_chunks(plan, [None, chunks[2]]).column("user").to_pylist() == ["a", "c"]


def test_a_subtask_without_records_gets_an_empty_table_of_the_batch_schema():
    schema = pa.schema([("user", pa.string()), (SUBTASK_COLUMN, pa.int32())])
    empty = pa.RecordBatch.from_pylist([], schema=schema)
    assert list(split_by_subtask(iter([empty]))) == []
    table = _read_chunks(_plan(schema), [None, None])
    assert table.num_rows == 0 and table.schema == schema
