"""The replayable local log and the generator (no Spark), plus the Spark data source."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute
import pytest

from cutline.sources.log_format import (
    append_records,
    complete_size,
    offset_after_records,
    partition_path,
    read_range,
    topic_partitions,
)
from spark_jobs.sources.generate import PAYLOAD_BYTES, _records, generate, records_in

SCHEMA = pa.schema([("user", pa.string()), ("n", pa.int64())])


def lines(n, start=0):
    return [json.dumps({"user": f"u{i}", "n": i}).encode() for i in range(start, start + n)]


def test_append_read_and_positions(tmp_path):
    end = append_records(tmp_path, "t", 0, lines(5))
    path = partition_path(tmp_path, "t", 0)
    assert complete_size(path) == end == path.stat().st_size
    mid = offset_after_records(path, 0, 2, end)
    table = read_range(path, 0, 0, mid, SCHEMA)
    assert table.column("user").to_pylist() == ["u0", "u1"]
    assert table.column("_partition").to_pylist() == [0, 0]
    assert table.column("_next_offset").to_pylist()[-1] == mid
    rest = read_range(path, 0, mid, end, SCHEMA)
    assert rest.column("n").to_pylist() == [2, 3, 4]
    assert offset_after_records(path, mid, 100, end) == end
    assert offset_after_records(path, end, 5, end) == end
    assert topic_partitions(tmp_path, "t") == [0]


def test_a_torn_last_line_is_not_read(tmp_path):
    end = append_records(tmp_path, "t", 0, lines(3))
    path = partition_path(tmp_path, "t", 0)
    with open(path, "ab") as f:
        f.write(b'{"user": "half')
    assert complete_size(path) == end
    assert offset_after_records(path, 0, 10, complete_size(path)) == end


def test_bad_records_are_returned_with_reason_raw_line_and_offset(tmp_path):
    """Truncated JSON, a string where a number belongs, a null key, a blank line: each comes back
    with its reason, its raw line and where it starts; the good records around them are parsed
    as usual and nothing is consumed twice or lost."""
    good = lines(2)
    bad = [b'{"user": "x", "n": "not a number"}', b'{"user": "y", "n": 1', b'{"n": 4}', b""]
    end = append_records(tmp_path, "t", 1, [*good, *bad, *lines(1, start=7)])
    path = partition_path(tmp_path, "t", 1)
    table = read_range(path, 1, 0, end, SCHEMA, key="user")
    ok = table.filter(pa.compute.is_null(table["_bad_reason"]))
    assert ok.column("user").to_pylist() == ["u0", "u1", "u7"]
    rejects = table.filter(pa.compute.is_valid(table["_bad_reason"])).to_pylist()
    assert [r["_bad_raw"] for r in rejects] == [b.decode() for b in bad]
    reasons = [r["_bad_reason"] for r in rejects]
    assert reasons[0] == "field 'n' must be int64, got \"not a number\""
    assert reasons[1].startswith("not valid JSON")
    assert reasons[2:] == ["null key 'user'", "empty line"]
    data = path.read_bytes()
    for r in rejects:  # the offset is where the raw line starts; the position is after it
        offset = r["_bad_offset"]
        assert data[offset : offset + len(r["_bad_raw"])] == r["_bad_raw"].encode()
        assert r["_next_offset"] == offset + len(r["_bad_raw"]) + 1
    assert max(table.column("_next_offset").to_pylist()) == end
    assert read_range(path, 1, 0, end, SCHEMA).num_rows == 7  # without a key: 3 bad


def test_a_null_in_any_column_of_a_composite_key_is_a_bad_record(tmp_path):
    records = [b'{"user": "a", "n": 1}', b'{"n": 2}', b'{"user": "b"}', b'{"user": "c", "n": 3}']
    end = append_records(tmp_path, "t", 0, records)
    table = read_range(partition_path(tmp_path, "t", 0), 0, 0, end, SCHEMA, key=("user", "n"))
    reasons = table.column("_bad_reason").to_pylist()
    assert reasons == [None, None, "null key 'user'", "null key 'n'"]  # rejects come last
    assert table.column("user").to_pylist()[:2] == ["a", "c"]


def test_generator_is_deterministic_and_chunk_aligned(tmp_path):
    assert _records("orders", 3, 0, 0, 25_000, 50) == (
        _records("orders", 3, 0, 0, 12_345, 50) + _records("orders", 3, 0, 12_345, 12_655, 50)
    )
    generate(tmp_path / "a", "clicks", "clicks", count=15_000, partitions=2, seed=9)
    generate(tmp_path / "b", "clicks", "clicks", count=10_000, partitions=2, seed=9)
    generate(tmp_path / "b", "clicks", "clicks", count=5_000, partitions=2, seed=9)
    for p in (0, 1):
        a = partition_path(tmp_path / "a", "clicks", p).read_bytes()
        assert a == partition_path(tmp_path / "b", "clicks", p).read_bytes()
        assert records_in(tmp_path / "a", "clicks", p) == 15_000
    with pytest.raises(ValueError, match="kind must be one of"):
        generate(tmp_path, "x", "tweets", count=1)


def test_events_carry_a_payload_of_fixed_size():
    lines = _records("events", 1, 0, 9_990, 20, 100)
    assert lines == _records("events", 1, 0, 9_990, 10, 100) + _records(
        "events", 1, 0, 10_000, 10, 100
    )
    records = [json.loads(line) for line in lines]
    assert {len(r["payload"]) for r in records} == {PAYLOAD_BYTES}
    assert len({r["payload"] for r in records}) == 20
    assert set(records[0]) == {"user", "amount", "payload", "ts"}


@pytest.mark.spark
def test_spark_stream_reads_bounded_batches_from_recorded_positions(spark, tmp_path):
    from cutline.sources.log import register_data_source

    for p in (0, 1):
        append_records(tmp_path, "t", p, lines(25, start=100 * p))
    register_data_source(spark)
    ends = [complete_size(partition_path(tmp_path, "t", p)) for p in (0, 1)]
    start = {"0": offset_after_records(partition_path(tmp_path, "t", 0), 0, 5, ends[0]), "1": 0}
    batches = stream_batches(spark, tmp_path, "user string, n long", start)
    assert [len(b) for b in batches] == [20, 20, 5]
    assert sorted(n for b in batches for n in b) == list(range(5, 25)) + list(range(100, 125))


def stream_batches(spark, root, ddl: str, start: dict, **options: str) -> list[list[int]]:
    """``cutline_log`` over topic ``t`` of partitions 0 and 1 under ``root`` as a stream from
    ``start``, 10 records per partition and micro-batch: each micro-batch's ``n``, sorted."""
    batches: list[list[int]] = []
    reader = (
        spark.readStream.format("cutline_log")
        .schema(f"{ddl}, _partition int, _next_offset long")
        .option("path", str(root))
        .option("topic", "t")
        .option("partitions", "[0, 1]")
        .option("startingOffsets", json.dumps(start))
        .option("maxRecordsPerPartition", "10")
    )
    query = (
        reader.options(**options)
        .load()
        .writeStream.foreachBatch(lambda df, i: batches.append(sorted(r.n for r in df.collect())))
        .option("checkpointLocation", str(root / "spark-chk"))
        .start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    return batches


@pytest.mark.spark
@pytest.mark.parametrize("fmt", ["jsonl", "arrow"])
def test_a_position_past_the_logs_end_fails_the_stream_naming_it(spark, tmp_path, fmt):
    """A recorded position beyond what a partition holds (the log truncated or replaced, or
    another log under the same topic) fails the query, as Spark's ``failOnDataLoss`` does,
    instead of waiting for records that will never come."""
    from pyspark.errors import StreamingQueryException

    from cutline.sources.log import register_data_source
    from spark_jobs.sources.generate import generate

    generate(tmp_path, "t", "clicks", count=30, partitions=2, fmt=fmt)
    register_data_source(spark)
    with pytest.raises(StreamingQueryException, match=r"partition 1 ends at .* before the posit"):
        stream_batches(spark, tmp_path, "user string, n long", {"0": 0, "1": 10**9})
