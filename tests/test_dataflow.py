"""The micro-batch dataflow without Spark: records cut into one Arrow IPC chunk per subtask,
read back whole and in log order whatever order the chunks arrive in, and a stage's output
re-keyed to the subtasks of the next stage that own its keys."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest
from cutline_examples.jobs import clicks_per_user

from cutline import DeltaSink
from cutline.keyed_process import SOURCE_COLUMN
from cutline.operators import KeyedAggregate
from cutline.routing import KEY_GROUP_COLUMN, STAGE_COLUMN, SUBTASK_COLUMN, read_chunks, rekey
from cutline.sources.base import NEXT_OFFSET_COLUMN, PARTITION_COLUMN
from cutline.validation import JobDefinitionError
from spark_jobs.errors import ConfigurationError, TaskError, carry_to_driver, task_error
from spark_jobs.executor.dataflow import Forwarded, empty_input, split_by_subtask, stage_input
from state.keygroups import key_group_of, key_group_range, key_groups


def _chunks(batch: pa.RecordBatch) -> dict[int, bytes]:
    return dict(
        zip(batch.column("subtask").to_pylist(), batch.column("chunk").to_pylist(), strict=True)
    )


def test_a_partition_is_cut_into_one_chunk_per_subtask_and_read_back_whole():
    batches = [
        pa.record_batch({"user": ["a", "b", "c"], SUBTASK_COLUMN: pa.array([2, 0, 2], pa.int32())}),
        pa.record_batch({"user": ["d"], SUBTASK_COLUMN: pa.array([0], pa.int32())}),
    ]
    (out,) = list(split_by_subtask(iter(batches)))
    chunks = _chunks(out)
    assert sorted(chunks) == [0, 2]
    assert sorted(read_chunks([chunks[0]], None).column("user").to_pylist()) == ["b", "d"]
    assert read_chunks([chunks[2]], None).column("user").to_pylist() == ["a", "c"]


def test_a_subtask_without_records_gets_an_empty_table_of_the_batch_schema():
    schema = pa.schema([("user", pa.string()), (SUBTASK_COLUMN, pa.int32())])
    empty = pa.RecordBatch.from_pylist([], schema=schema)
    assert list(split_by_subtask(iter([empty]))) == []
    table = read_chunks([], schema)
    assert table.num_rows == 0 and table.schema == schema


def test_records_are_read_in_log_order_whatever_order_the_shuffle_delivers_them_in():
    def part(partition: int, offsets: list[int]) -> pa.RecordBatch:
        n = len(offsets)
        return pa.record_batch(
            {
                "user": [f"u{partition}-{o}" for o in offsets],
                SOURCE_COLUMN: ["clicks"] * n,
                PARTITION_COLUMN: pa.array([partition] * n, pa.int32()),
                NEXT_OFFSET_COLUMN: pa.array(offsets, pa.int64()),
                SUBTASK_COLUMN: pa.array([0] * n, pa.int32()),
            }
        )

    a = _chunks(next(split_by_subtask(iter([part(1, [5, 9])]))))[0]
    b = _chunks(next(split_by_subtask(iter([part(0, [3, 7])]))))[0]
    expected = ["u0-3", "u0-7", "u1-5", "u1-9"]
    assert read_chunks([a, b], None).column("user").to_pylist() == expected
    assert read_chunks([b, a], None).column("user").to_pylist() == expected


def _two_stages():
    counts = KeyedAggregate("per_user", "clicks", "user", "string", {"clicks": ("count", None)})
    totals = KeyedAggregate(
        "per_country", "per_user", "country", "string", {"users": ("count", None)}
    )
    return dataclasses.replace(
        clicks_per_user(), operator=(counts, totals), sink=DeltaSink("out", "out"), parallelism=4
    )


def test_a_stage_output_goes_to_the_next_stage_subtask_that_owns_its_key():
    job = _two_stages()
    countries = [f"c{i}" for i in range(40)]
    output = pa.table(
        {
            "user": [f"user-{i}" for i in range(40)],
            "country": countries,
            "clicks": pa.array(range(40), pa.int64()),
            "_internal": pa.array(range(40), pa.int64()),  # an operator's column: not passed on
        }
    )
    routed = rekey(output, job, 1, upstream=3)
    seen = []
    for subtask, chunk in routed:
        table = read_chunks([chunk], None)
        owned = key_group_range(subtask, job.parallelism, job.max_parallelism)
        for country, group in zip(
            table.column("country").to_pylist(),
            table.column(KEY_GROUP_COLUMN).to_pylist(),
            strict=True,
        ):
            assert group == key_group_of(country, "string", job.max_parallelism)
            assert group in owned
        assert "_internal" not in table.column_names
        assert set(table.column(SOURCE_COLUMN).to_pylist()) == {"per_user"}
        assert set(table.column(PARTITION_COLUMN).to_pylist()) == {3}
        seen += table.column("country").to_pylist()
    assert sorted(seen) == sorted(countries)
    assert rekey(output.slice(0, 0), job, 1, upstream=0) == []


def test_a_next_stage_key_the_output_lacks_is_a_clear_error():
    job = _two_stages()
    with pytest.raises(JobDefinitionError, match=r"keyed by 'country'.*'per_user'") as error:
        rekey(pa.table({"user": ["a"], "clicks": [1]}), job, 1, upstream=0)
    with pytest.raises(TaskError) as marked, carry_to_driver():  # raised in a task: typed
        raise error.value
    assert type(task_error(str(marked.value))) is JobDefinitionError


def test_an_idle_later_stage_subtask_gets_its_key_column():
    spec = _two_stages().stages[1]
    table = empty_input(spec)
    assert table.num_rows == 0 and table.schema.field("country").type == pa.string()


def test_a_composite_key_routes_each_column_combination_to_its_owner():
    """A later stage keyed by two columns: every row goes to the subtask owning the key group of
    Spark's hash(country, clicks), and an idle subtask's empty input has both columns."""
    job = _two_stages()
    by_pair = KeyedAggregate(
        "per_pair", "per_user", ("country", "clicks"), ("string", "bigint"), {"n": ("count", None)}
    )
    job = dataclasses.replace(job, operator=(job.stages[0], by_pair))
    output = pa.table(
        {
            "user": [f"user-{i}" for i in range(60)],
            "country": [f"c{i % 7}" for i in range(60)],
            "clicks": pa.array([i % 5 for i in range(60)], pa.int64()),
        }
    )
    pairs = []
    for subtask, chunk in rekey(output, job, 1, upstream=0):
        table = read_chunks([chunk], None)
        owned = key_group_range(subtask, job.parallelism, job.max_parallelism)
        keys = pa.StructArray.from_arrays(
            [table.column("country").combine_chunks(), table.column("clicks").combine_chunks()],
            ["country", "clicks"],
        )
        groups = key_groups(keys, ("string", "bigint"), job.max_parallelism).tolist()
        assert table.column(KEY_GROUP_COLUMN).to_pylist() == groups
        assert all(g in owned for g in groups)
        pairs += table.select(["country", "clicks"]).to_pylist()
    expected = output.select(["country", "clicks"]).to_pylist()
    assert sorted(pairs, key=str) == sorted(expected, key=str)
    empty = empty_input(by_pair).schema
    assert (empty.field("country").type, empty.field("clicks").type) == (pa.string(), pa.int64())


def test_records_of_a_source_a_later_stage_reads_are_cut_apart_for_that_stage():
    batch = pa.record_batch(
        {
            "user": ["a", "b", "c", "d"],
            STAGE_COLUMN: pa.array([0, 1, 0, 1], pa.int32()),
            SUBTASK_COLUMN: pa.array([1, 1, 1, 0], pa.int32()),
        }
    )
    (out,) = list(split_by_subtask(iter([batch])))
    stages, subtasks = out.column("stage").to_pylist(), out.column("subtask").to_pylist()
    routes = list(zip(stages, subtasks, strict=True))
    assert routes == [(0, 1), (1, 0), (1, 1)]
    users = [
        read_chunks([c], None).column("user").to_pylist() for c in out.column("chunk").to_pylist()
    ]
    assert users == [["a", "c"], ["d"], ["b"]]


def _source_chunk(source: str, columns: dict, offsets: list[int]) -> bytes:
    n = len(offsets)
    table = pa.table(
        {
            **columns,
            SOURCE_COLUMN: [source] * n,
            PARTITION_COLUMN: pa.array([0] * n, pa.int32()),
            NEXT_OFFSET_COLUMN: pa.array(offsets, pa.int64()),
        }
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def test_a_later_stage_reads_each_forwarded_source_with_its_own_columns_in_log_order():
    """The map side's union carries every source's columns; the stage keeps its source's (as
    its transforms left them) beside the upstream stage's records, sorted by input."""
    upstream = pa.table(
        {
            "user": ["u2", "u1"],
            "clicks": pa.array([3, 1], pa.int64()),
            SOURCE_COLUMN: ["counts", "counts"],
            PARTITION_COLUMN: pa.array([0, 0], pa.int32()),
            NEXT_OFFSET_COLUMN: pa.array([1, 2], pa.int64()),
        }
    )
    union = {"user": ["u1", "u2"], "country": ["FR", "IT"], "amount": [None, None]}
    chunk = _source_chunk("profiles", union, [9, 4])
    table = stage_input(upstream, [Forwarded(1, chunk)], {"profiles": ("user", "country")})
    assert "amount" not in table.column_names  # another source's column
    assert table.column(SOURCE_COLUMN).to_pylist() == ["counts", "counts", "profiles", "profiles"]
    assert table.column("country").to_pylist() == [None, None, "IT", "FR"]
    assert table.column("clicks").to_pylist() == [3, 1, None, None]


def test_inputs_with_a_column_of_one_name_and_two_types_are_a_clear_error():
    upstream = read_chunks([_source_chunk("counts", {"tier": ["gold"]}, [1])], None)
    chunk = _source_chunk("profiles", {"tier": pa.array([1], pa.int32())}, [1])
    with pytest.raises(ConfigurationError, match="same name with different types"):
        stage_input(upstream, [Forwarded(1, chunk)], {"profiles": ("tier",)})


def test_dead_letters_of_two_stages_of_one_subtask_are_both_staged(tmp_path):
    """A source read by a later stage has its bad records split off there: that stage's dead
    letters and the first stage's, same subtask and epoch, are two parts, neither replacing
    the other."""
    from cutline.sinks.staging import StagedEpochs
    from spark_jobs.executor.subtask import BatchPlan, RunContext, stage_output

    ctx = RunContext(clicks_per_user(), 3, str(tmp_path / "c"), str(tmp_path / "l"), str(tmp_path))
    plan = BatchPlan(ctx, epoch=5, previous_epoch=4)
    for stage in (0, 1):
        stage_output(plan, stage, 1, "dead_letters", pa.table({"raw": [f"from stage {stage}"]}))
    rows = StagedEpochs(str(tmp_path), "clicks_per_user", "dead_letters", 3).read([5])
    assert rows.column("raw").to_pylist() == ["from stage 0", "from stage 1"]
