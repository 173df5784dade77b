"""The file source: a directory of immutable JSON-lines or Parquet files, each a partition
numbered by its name, on local disk and on S3, read through the source's own functions. Jobs on
it run under the random kills (tests/test_exactly_once.py, files on S3, a new one per attempt)
and on the two-worker cluster (tests/test_cluster_recovery.py, a file arriving while it runs)."""

from __future__ import annotations

import random
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cutline import FileSource, JobDefinitionError
from cutline.sources.files import _Ends, list_files, partition_of, read_records
from state.storage import S3Storage
from tests.file_input import clicks, json_lines, put_file

SCHEMA = pa.schema([("user", pa.string()), ("url", pa.string()), ("ts", pa.int64())])


def colliding_names() -> tuple[str, str]:
    """Two file names with the same partition number (a birthday search over 31 bits)."""
    rng, seen = random.Random(7), {}
    while True:
        name = f"part-{rng.getrandbits(64):016x}.json"
        number = zlib.crc32(name.encode()) & 0x7FFFFFFF
        if number in seen:
            return seen[number], name
        seen[number] = name


def test_each_file_is_a_partition_numbered_by_its_name(tmp_path):
    put_file(tmp_path, "a.json", clicks(3, 1))
    put_file(tmp_path / "2026", "b.jsonl", clicks(2, 2))
    (tmp_path / "_SUCCESS").write_bytes(b"")
    (tmp_path / "notes.txt").write_bytes(b"not data")
    files = list_files(str(tmp_path), "json")
    assert files == {partition_of("a.json"): "a.json", partition_of("2026/b.jsonl"): "2026/b.jsonl"}
    source = FileSource("clicks", str(tmp_path), "user string, url string, ts long")
    assert source.current_partitions() == (sorted(files), 0)
    first, second = colliding_names()
    put_file(tmp_path, first, clicks(1, 3))
    put_file(tmp_path, second, clicks(1, 4))
    with pytest.raises(ValueError, match="have the same partition number") as refused:
        list_files(str(tmp_path), "json")
    assert repr(first) in str(refused.value) and repr(second) in str(refused.value)


def test_positions_are_bytes_for_json_and_rows_for_parquet():
    data = json_lines(clicks(5, 1))
    ends = _Ends(data, "json")
    line = data.index(b"\n") + 1
    assert ends.after(0, 2) == int(ends.ends[1]) and ends.after(0, 1) == line
    assert ends.after(line, 100) == len(data) == ends.end() and ends.after(len(data), 3) == len(
        data
    )
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(clicks(5, 1), SCHEMA), sink)
    rows = _Ends(sink.getvalue().to_pybytes(), "parquet")
    assert (rows.after(0, 2), rows.after(2, 10), rows.end()) == (2, 5, 5)


def test_bad_records_come_back_with_their_reason_in_both_formats():
    good = clicks(3, 1)
    data = json_lines(good[:1]) + b"{not json\n" + json_lines([{"user": None, "ts": 5}, *good[1:]])
    table = read_records(data, "json", 7, 0, len(data), SCHEMA, ("user",), "f.json")
    table = table.sort_by("_next_offset")  # in the file's order (bad records come back last)
    reasons = table.column("_bad_reason").to_pylist()
    assert reasons[0] is None and "not valid JSON" in reasons[1] and "null key" in reasons[2]
    assert reasons[3:] == [None, None] and table.column("_partition").to_pylist() == [7] * 5
    starts = [0] + [int(e) for e in table.column("_next_offset").to_pylist()[:-1]]
    assert table.column("_bad_offset").to_pylist()[1:3] == starts[1:3]
    sink = pa.BufferOutputStream()
    rows = [*good, {"user": None, "url": "/x", "ts": 9}]
    pq.write_table(pa.Table.from_pylist(rows, SCHEMA), sink)
    data = sink.getvalue().to_pybytes()
    table = read_records(data, "parquet", 3, 1, 4, SCHEMA, ("user",), "f.parquet")
    assert table.column("user").to_pylist() == [good[1]["user"], good[2]["user"], None]
    assert table.column("_next_offset").to_pylist() == [2, 3, 4]
    assert table.column("_bad_reason").to_pylist()[:2] == [None, None]
    assert "null key" in table.column("_bad_reason").to_pylist()[2]
    assert table.column("_bad_offset").to_pylist() == [None, None, 3]


@pytest.mark.s3
def test_files_on_s3_are_listed_and_read_through_the_storage(s3_server, s3_bucket, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    storage = S3Storage(s3_bucket, "in/clicks", endpoint_url=s3_server)
    records = clicks(4, 5)
    storage.put_bytes("day=1/a.json", json_lines(records))
    url = f"s3://{s3_bucket}/in/clicks"
    assert list_files(url, "json") == {partition_of("day=1/a.json"): "day=1/a.json"}
    data = storage.get_bytes("day=1/a.json")
    table = read_records(data, "json", 1, 0, len(data), SCHEMA, ("user",), url)
    assert table.select(["user", "url", "ts"]).to_pylist() == records


def test_definitions_are_checked():
    with pytest.raises(JobDefinitionError, match="format must be one of"):
        FileSource("c", "/tmp/x", "user string", format="csv")
    with pytest.raises(JobDefinitionError, match="path must be a directory"):
        FileSource("c", "", "user string")


@pytest.mark.spark
def test_a_replay_reads_a_file_that_appeared_in_its_micro_batch_from_its_start(
    spark, tmp_path, monkeypatch
):
    """A replayed micro-batch runs from the previous cut, which names only the files that
    existed then: a file that appeared in that micro-batch is read from its first record (a
    long replay, from an older checkpoint or a savepoint, spans many such files)."""
    from spark_jobs.sources.frames import range_frame
    from tests.file_jobs import FILES_ENV, file_clicks

    monkeypatch.setenv(FILES_ENV, str(tmp_path))
    put_file(tmp_path, "clicks-000.json", clicks(300, 1))
    put_file(tmp_path, "clicks-001.json", clicks(200, 2))
    job = file_clicks()
    sizes = {str(partition_of(p.name)): p.stat().st_size for p in tmp_path.iterdir()}
    first = str(partition_of("clicks-000.json"))
    cut = {first: sizes[first]}  # the first file read whole; the other not there yet
    assert range_frame(spark, job, "clicks", cut, sizes).count() == 200
    assert range_frame(spark, job, "clicks", {}, sizes).count() == 500
    assert range_frame(spark, job, "clicks", sizes, sizes).count() == 0


def test_a_kinds_data_source_is_registered_once_per_session(tmp_path):
    """Every read of a source asks for its data source; the session registers each once."""
    from cutline import LogSource

    class Registry:
        def __init__(self) -> None:
            self.names: list[str] = []

        def register(self, data_source: type) -> None:
            self.names.append(data_source.name())

    class Session:  # the part of a SparkSession a kind's data_source touches
        def __init__(self) -> None:
            self.dataSource = Registry()

    class Reader:
        def format(self, _name: str) -> Reader:
            return self

        def option(self, _key: str, _value: str) -> Reader:
            return self

    files = FileSource(name="f", path=str(tmp_path), schema="user string", format="json")
    log = LogSource(name="l", topic="t", schema="user string", root=str(tmp_path))
    first, second = Session(), Session()
    for _ in range(3):
        files.data_source(first, Reader())
        log.data_source(first, Reader())
    files.data_source(second, Reader())
    assert first.dataSource.names == ["cutline_files", "cutline_log"]
    assert second.dataSource.names == ["cutline_files"]
