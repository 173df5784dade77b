"""The local log's columnar format (Arrow segments): appends are whole or absent, a range reads
back exactly what was written, a writer killed mid-append loses nothing it reported, and a damaged
log is an error naming the file."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cutline.sources.log_format import (
    MalformedRecordError,
    append_records,
    topic_format,
    topic_partitions,
)
from cutline.sources.log_segments import (
    append_table,
    end_offset,
    read_segments,
    segment_dir,
    segments,
)
from state.errors import BadInputError
from tests.test_liveness import exited_pid
from tests.test_local_log import stream_batches

SCHEMA = pa.schema([("user", pa.string()), ("n", pa.int64())])
ROOT = Path(__file__).resolve().parent.parent


def rows(start: int, count: int, *, append: int = 0) -> pa.Table:
    return pa.table(
        {
            "user": [f"u{append}-{i}" for i in range(start, start + count)],
            "n": list(range(start, start + count)),
        }
    )


def good(table: pa.Table) -> pa.Table:
    return table.filter(pc.is_null(table["_bad_reason"]))


def test_append_read_and_positions_in_records(tmp_path):
    assert append_table(tmp_path, "t", 0, rows(0, 5)) == 5
    assert append_table(tmp_path, "t", 0, rows(5, 3)) == 8
    assert append_table(tmp_path, "t", 0, rows(0, 0)) == 8  # nothing: no segment
    d = segment_dir(tmp_path, "t", 0)
    assert [first for first, _ in segments(d)] == [0, 5]
    assert end_offset(d) == 8
    table = read_segments(d, 0, 3, 7, SCHEMA, key="user")  # across the two segments
    assert table.column("n").to_pylist() == [3, 4, 5, 6]
    assert table.column("_next_offset").to_pylist() == [4, 5, 6, 7]
    assert table.column("_partition").to_pylist() == [0] * 4
    assert read_segments(d, 0, 8, 8, SCHEMA).num_rows == 0
    assert topic_partitions(tmp_path, "t") == [0]
    assert topic_format(tmp_path, "t") == "arrow"


def test_a_topic_has_one_format(tmp_path):
    append_table(tmp_path, "t", 0, rows(0, 2))
    with pytest.raises(BadInputError, match="Arrow format"):
        append_records(tmp_path, "t", 0, [b'{"user": "a", "n": 1}'])
    append_records(tmp_path, "j", 0, [b'{"user": "a", "n": 1}'])
    with pytest.raises(BadInputError, match="JSON-lines format"):
        append_table(tmp_path, "j", 0, rows(0, 2))
    append_records(tmp_path, "t", 1, [b'{"user": "a", "n": 1}'])
    with pytest.raises(BadInputError, match="mixes"):
        topic_format(tmp_path, "t")


def test_a_torn_append_is_invisible_and_the_next_writer_removes_it(tmp_path):
    """What a writer killed mid-append leaves (a hidden, half-written file under its pid) is no
    segment: readers never see it; the next append removes it unless its writer still lives."""
    append_table(tmp_path, "t", 0, rows(0, 3))
    d = segment_dir(tmp_path, "t", 0)
    whole = (d / f"{0:020d}.arrow").read_bytes()
    torn = d / f".{3:020d}.{exited_pid()}.0123456789ab.tmp"
    torn.write_bytes(whole[: len(whole) // 2])
    live = d / f".{3:020d}.{os.getpid()}.0123456789ab.tmp"  # a writer still appending
    live.write_bytes(whole[:10])
    assert end_offset(d) == 3 and read_segments(d, 0, 0, 3, SCHEMA).num_rows == 3
    assert append_table(tmp_path, "t", 0, rows(3, 2)) == 5
    assert not torn.exists() and live.exists()
    assert read_segments(d, 0, 0, 5, SCHEMA).column("n").to_pylist() == [0, 1, 2, 3, 4]


def test_a_null_key_is_a_bad_record_with_its_row_as_raw(tmp_path):
    table = pa.table({"user": ["a", None, "c"], "n": [1, 2, None]})
    append_table(tmp_path, "t", 0, rows(0, 1))
    append_table(tmp_path, "t", 0, table)
    out = read_segments(segment_dir(tmp_path, "t", 0), 0, 0, 4, SCHEMA, key=("user", "n"))
    assert good(out).column("user").to_pylist() == ["u0-0", "a"]
    rejects = out.filter(pc.is_valid(out["_bad_reason"])).to_pylist()
    assert [r["_bad_reason"] for r in rejects] == ["null key 'user'", "null key 'n'"]
    assert [r["_bad_offset"] for r in rejects] == [2, 3]
    assert [r["_next_offset"] for r in rejects] == [3, 4]
    assert [json.loads(r["_bad_raw"]) for r in rejects] == [
        {"user": None, "n": 2},
        {"user": "c", "n": None},
    ]


def test_fields_are_cast_or_the_segment_is_named(tmp_path):
    narrow = pa.table({"n": pa.array([1, 2], pa.int32()), "extra": ["x", "y"]})
    append_table(tmp_path, "t", 0, narrow)
    out = read_segments(segment_dir(tmp_path, "t", 0), 0, 0, 2, SCHEMA)
    assert out.column("n").type == pa.int64() and out.column("n").to_pylist() == [1, 2]
    assert out.column("user").to_pylist() == [None, None]  # a missing field is null
    append_table(tmp_path, "u", 0, pa.table({"user": ["a"], "n": ["not a number"]}))
    d = segment_dir(tmp_path, "u", 0)
    with pytest.raises(MalformedRecordError, match=r"00000000000000000000\.arrow.*field 'n'"):
        read_segments(d, 0, 0, 1, SCHEMA)


def test_a_damaged_log_is_an_error_naming_where(tmp_path):
    for count in (3, 3, 3):
        append_table(tmp_path, "t", 0, rows(0, count))
    d = segment_dir(tmp_path, "t", 0)
    (d / f"{3:020d}.arrow").unlink()  # a gap: records 3 to 5 are gone
    assert read_segments(d, 0, 0, 3, SCHEMA).num_rows == 3
    assert read_segments(d, 0, 6, 9, SCHEMA).num_rows == 3
    with pytest.raises(MalformedRecordError, match="record 3"):
        read_segments(d, 0, 1, 7, SCHEMA)
    with pytest.raises(MalformedRecordError, match="ends at record 9"):
        read_segments(d, 0, 6, 12, SCHEMA)  # past the end: never a silent short read
    (d / f"{6:020d}.arrow").write_bytes(b"not arrow at all")
    with pytest.raises(MalformedRecordError, match="not a readable Arrow segment"):
        read_segments(d, 0, 6, 9, SCHEMA)
    with pytest.raises(MalformedRecordError, match="not a readable Arrow segment"):
        end_offset(d)
    append_table(tmp_path, "v", 0, rows(0, 4))
    e = segment_dir(tmp_path, "v", 0)
    (e / f"{2:020d}.arrow").write_bytes((e / f"{0:020d}.arrow").read_bytes())  # an overlap
    with pytest.raises(MalformedRecordError, match="record 4 was expected"):
        read_segments(e, 0, 0, 5, SCHEMA)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=8),
    cuts=st.lists(st.integers(0, 400), min_size=2, max_size=6),
)
def test_any_range_reads_back_exactly_what_was_written(tmp_path_factory, sizes, cuts):
    """Appends of any sizes; reading the log as consecutive ranges (micro-batches ending
    anywhere, inside segments or on their edges) gives every record once, in order."""
    root = tmp_path_factory.mktemp("log")
    written: list[int] = []
    for i, size in enumerate(sizes):
        end = append_table(root, "t", 0, rows(len(written), size, append=i))
        written.extend(range(len(written), len(written) + size))
        assert end == len(written)
    d = segment_dir(root, "t", 0)
    bounds = sorted({0, len(written), *(min(c, len(written)) for c in cuts)})
    read: list[int] = []
    for lo, hi in itertools.pairwise(bounds):
        table = read_segments(d, 0, lo, hi, SCHEMA, key="user")
        assert table.column("_next_offset").to_pylist() == list(range(lo + 1, hi + 1))
        read.extend(table.column("n").to_pylist())
    assert read == written


def test_the_generator_writes_the_same_records_in_both_formats(tmp_path):
    from cutline.sources.log_format import partition_path, read_range
    from spark_jobs.sources.generate import generate, records_in

    generate(tmp_path / "j", "orders", "orders", count=25_000, seed=4, users=90)
    generate(tmp_path / "a", "orders", "orders", count=12_345, seed=4, users=90, fmt="arrow")
    generate(tmp_path / "a", "orders", "orders", count=12_655, seed=4, users=90)  # the topic's
    schema = pa.schema([("order_id", pa.string()), ("amount", pa.float64()), ("ts", pa.int64())])
    for p in (0, 1):
        n = records_in(tmp_path / "a", "orders", p)
        assert n == records_in(tmp_path / "j", "orders", p) == 25_000
        path = partition_path(tmp_path / "j", "orders", p)
        lines = read_range(path, p, 0, path.stat().st_size, schema).select(schema.names)
        arrow = read_segments(segment_dir(tmp_path / "a", "orders", p), p, 0, n, schema)
        assert arrow.select(schema.names).equals(lines)
        assert len(segments(segment_dir(tmp_path / "a", "orders", p))) == 4  # appends of 10,000


WRITER = """
import sys
import pyarrow as pa
from cutline.sources.log_segments import append_table
root, size = sys.argv[1], int(sys.argv[2])
for i in range(10_000):
    n = size + i % 7
    n_ = pa.array(range(n), pa.int64())
    table = pa.table({"user": [f"a{i}"] * n, "n": n_, "pad": ["x" * 200] * n})
    end = append_table(root, "t", 0, table)
    print(i, n, end, flush=True)
"""


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(delay=st.floats(0.3, 1.2), size=st.integers(2_000, 20_000))
def test_a_writer_killed_mid_append_loses_nothing_it_reported(tmp_path_factory, delay, size):
    """``kill -9`` of a writer at a random moment of its appends: the log holds every append it
    reported and at most the one in flight, each whole; the next writer removes what the killed
    one left and appends after it."""
    root = tmp_path_factory.mktemp("log")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), str(size)], stdout=subprocess.PIPE, env=env
    )
    time.sleep(delay)
    writer.send_signal(signal.SIGKILL)
    out, _ = writer.communicate()
    reported = [tuple(map(int, line.split())) for line in out.decode().splitlines()]
    d = segment_dir(root, "t", 0)
    end = end_offset(d)
    table = read_segments(d, 0, 0, end, SCHEMA, key="user")
    appends = [int(u[1:]) for u in table.column("user").unique().to_pylist()]
    assert appends == list(range(len(appends)))  # in order, none skipped
    assert len(reported) <= len(appends) <= len(reported) + 1
    for i, n, after in reported:
        users = pc.equal(table["user"], f"a{i}")
        assert table.filter(users).column("n").to_pylist() == list(range(n))
        assert table.column("_next_offset")[after - 1].as_py() == after
    if len(appends) > len(reported):  # the one in flight landed whole
        last = len(appends) - 1
        assert pc.sum(pc.equal(table["user"], f"a{last}")).as_py() == size + last % 7
    assert append_table(root, "t", 0, rows(0, 2)) == end + 2
    assert sorted(os.listdir(d)) == [
        name for _, name in sorted((f, p.name) for f, p in segments(d))
    ]


@pytest.mark.spark
def test_spark_reads_a_columnar_topic_in_bounded_batches_and_replays_a_range(spark, tmp_path):
    """``cutline_log`` over Arrow segments: micro-batches of at most 10 records per partition
    from recorded positions (cutting inside segments), and a fixed range read back as a batch
    gives the same records."""
    from cutline.sources.log import register_data_source

    for p in (0, 1):
        for lo in (0, 7, 19):  # segments of 7, 12 and 6 records
            append_table(tmp_path, "t", p, rows(100 * p + lo, {0: 7, 7: 12, 19: 6}[lo]))
    append_table(tmp_path, "t", 1, pa.table({"user": [None], "n": [999]}))  # a bad record
    register_data_source(spark)
    ddl = "user string, n long, _bad_reason string"
    batches = stream_batches(spark, tmp_path, ddl, {"0": 5, "1": 0}, keyColumn="user")
    assert [len(b) for b in batches] == [20, 20, 6]
    assert sorted(n for b in batches for n in b) == [*range(5, 25), *range(100, 125), 999]
    replay = (
        spark.read.format("cutline_log")
        .schema(f"{ddl}, _partition int, _next_offset long")
        .option("path", str(tmp_path))
        .option("topic", "t")
        .option("startingOffsets", json.dumps({"0": 3, "1": 20}))
        .option("endingOffsets", json.dumps({"0": 21, "1": 26}))
        .option("keyColumn", "user")
        .load()
        .collect()
    )
    assert sorted(r.n for r in replay) == [*range(3, 21), *range(120, 125), 999]
    assert [r._bad_reason for r in replay if r.n == 999] == ["null key 'user'"]
