"""The map side done by the sources' readers (cutline/routing.py ``ReadRoute``): the chunks a
reader cuts hold exactly the records, routing columns and order that Spark's map side gives the
same input, for single and composite keys, string and integer keys, a source read by a later
stage, and bad records; and which jobs route at the read."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict

import pyarrow as pa
import pytest

from cutline import (
    CheckpointConfig,
    DeltaSink,
    EnrichWithLatest,
    JobDefinition,
    KeyedAggregate,
    LogSource,
    Transform,
)
from cutline.routing import ReadRoute, read_chunks
from cutline.sources.files import partition_of
from cutline.sources.log import with_log_root
from cutline.sources.log_format import append_records, complete_size, partition_path


def two_stages() -> JobDefinition:
    """A second source read by the second stage only (its records forwarded past the
    first)."""
    per_user = KeyedAggregate(
        "per_user", "clicks", "user", "string", {"visits": ("count", None), "ts": ("max", "ts")}
    )
    enrich = EnrichWithLatest(
        "with_country",
        stream="per_user",
        table="profiles",
        key="user",
        key_type="string",
        fields=("country",),
        table_time="ts",
    )
    return JobDefinition(
        name="two_stages",
        sources=(
            LogSource("clicks", "clicks", "user string, url string, ts long"),
            LogSource("profiles", "profiles", "user string, country string, ts long"),
        ),
        operator=(per_user, enrich),
        sink=DeltaSink("out", "two_stages"),
        checkpoint=CheckpointConfig(interval_ms=1_000),
        parallelism=3,
        max_parallelism=16,
    )


def by_user_and_url() -> JobDefinition:
    """A composite key."""
    return JobDefinition(
        name="by_user_and_url",
        sources=(LogSource("clicks", "clicks", "user string, url string, ts long"),),
        operator=KeyedAggregate(
            "per_user_url", "clicks", ("user", "url"), ("string", "string"), {"n": ("count", None)}
        ),
        sink=DeltaSink("out", "by_user_and_url"),
        checkpoint=CheckpointConfig(interval_ms=1_000),
        parallelism=2,
    )


def by_number() -> JobDefinition:
    """A bigint key."""
    return JobDefinition(
        name="by_number",
        sources=(LogSource("numbers", "numbers", "n long, v double"),),
        operator=KeyedAggregate("per_n", "numbers", "n", "bigint", {"v": ("sum", "v")}),
        sink=DeltaSink("out", "by_number"),
        checkpoint=CheckpointConfig(interval_ms=1_000),
        parallelism=2,
    )


def _lines(rows: list) -> list[bytes]:
    return [r if isinstance(r, bytes) else json.dumps(r).encode() for r in rows]


def _write_inputs(root) -> None:
    clicks = [{"user": f"u{i % 7}", "url": f"/p{i % 5}", "ts": i} for i in range(400)]
    clicks[13] = {"user": None, "url": "/p1", "ts": 13}  # a null in the composite key: bad
    clicks[50] = {"user": "u1", "url": "/p1", "ts": "late"}  # a wrong type: bad
    for p in range(2):
        rows = clicks[p::2] + ([b"{not json"] if p else [])
        append_records(root, "clicks", p, _lines(rows))
    profiles = [{"user": f"u{i}", "country": f"c{i % 3}", "ts": i} for i in range(7)]
    append_records(root, "profiles", 0, _lines([*profiles, {"user": None, "country": "x"}]))
    numbers = [{"n": i % 11 - 5, "v": i / 3} for i in range(300)] + [{"n": None, "v": 1.0}]
    for p in range(3):
        append_records(root, "numbers", p, _lines(numbers[p::3]))


def _ends(job: JobDefinition, root) -> dict[str, dict[str, int]]:
    return {
        s.name: {
            str(p): complete_size(partition_path(root, s.topic, p))
            for p in range(3)
            if partition_path(root, s.topic, p).exists()
        }
        for s in job.sources
    }


def _by_subtask_and_stage(items) -> dict[tuple[int, int], pa.Table]:
    """The shuffle's items as each subtask reads them, per stage they are for."""
    from spark_jobs.executor.dataflow import Forwarded

    chunks = defaultdict(list)
    for subtask, value in items:
        stage, chunk = (value.stage, value.chunk) if isinstance(value, Forwarded) else (0, value)
        chunks[subtask, stage].append(chunk)
    return {k: read_chunks(v, None) for k, v in chunks.items()}


def _assert_same_chunks(spark, job, start, end, routes) -> dict[tuple[int, int], pa.Table]:
    """Spark's map side and the readers cut the same chunks of the records from ``start`` to
    ``end``: the same tables per subtask and stage, schema included. Returns the readers'."""
    from spark_jobs.executor.dataflow import chunk_items, map_side
    from spark_jobs.sources.frames import range_input

    by_spark = _by_subtask_and_stage(
        map_side(range_input(spark, job, start, end, None), job)[1].collect()
    )
    by_reader = _by_subtask_and_stage(
        chunk_items(range_input(spark, job, start, end, routes)).collect()
    )
    assert sorted(by_reader) == sorted(by_spark)
    assert {subtask for subtask, _ in by_spark} == set(range(job.parallelism))
    for where, table in by_spark.items():
        assert by_reader[where].equals(table), where
    return by_reader


@pytest.mark.spark
@pytest.mark.parametrize("make", [two_stages, by_user_and_url, by_number])
def test_a_reader_cuts_the_chunks_spark_map_side_cuts(spark, tmp_path, make):
    from spark_jobs.sources.frames import read_routes

    _write_inputs(tmp_path)
    job = with_log_root(make(), str(tmp_path))
    routes = read_routes(spark, job)
    assert routes is not None and set(routes) == set(job.source_inputs)
    start, end = {name: {} for name in job.source_inputs}, _ends(job, tmp_path)

    by_reader = _assert_same_chunks(spark, job, start, end, routes)
    bad = sum(t.column("_bad_reason").drop_null().__len__() for t in by_reader.values())
    assert bad == {"two_stages": 4, "by_user_and_url": 3, "by_number": 1}[job.name]


@pytest.mark.spark
def test_the_file_source_cuts_the_chunks_spark_map_side_cuts(spark, tmp_path, monkeypatch):
    from spark_jobs.sources.frames import read_routes
    from tests.file_input import clicks, json_lines, put_file
    from tests.file_jobs import FILES_ENV, file_clicks

    monkeypatch.setenv(FILES_ENV, str(tmp_path))
    put_file(tmp_path, "clicks-000.json", clicks(300, 1))
    put_file(tmp_path, "clicks-001.json", [*clicks(200, 2), {"user": None, "ts": 1}])
    (tmp_path / "clicks-002.json").write_bytes(json_lines(clicks(50, 3)) + b"{torn\n")
    job = file_clicks()
    routes = read_routes(spark, job)
    assert routes is not None
    end = {str(partition_of(p.name)): p.stat().st_size for p in tmp_path.iterdir()}
    by_reader = _assert_same_chunks(spark, job, {"clicks": {}}, {"clicks": end}, routes)
    assert sum(t.column("_bad_reason").drop_null().__len__() for t in by_reader.values()) == 2


@pytest.mark.spark
def test_no_input_and_an_empty_range_are_chunks_when_the_readers_route(spark, tmp_path):
    from cutline.routing import CHUNKS_DDL
    from spark_jobs.sources.frames import no_input, range_input, read_routes

    _write_inputs(tmp_path)
    job = with_log_root(by_number(), str(tmp_path))
    routes = read_routes(spark, job)
    ends = _ends(job, tmp_path)
    empty = spark.createDataFrame([], CHUNKS_DDL).schema
    assert no_input(spark, job, routes).schema == empty
    assert range_input(spark, job, ends, ends, routes).count() == 0


@pytest.mark.spark
def test_a_transform_or_a_key_a_transform_makes_keeps_the_map_side_in_spark(spark, tmp_path):
    from spark_jobs.sources.frames import read_routes

    job = with_log_root(by_number(), str(tmp_path))
    with_transform = dataclasses.replace(
        job, transforms=(Transform("same", "numbers", lambda df: df),)
    )
    assert read_routes(spark, with_transform) is None
    made_key = dataclasses.replace(
        job,
        operator=KeyedAggregate("per_m", "numbers", "m", "bigint", {"v": ("sum", "v")}),
    )
    assert read_routes(spark, made_key) is None


def test_a_route_travels_as_one_option():
    schema = pa.schema([("user", pa.string()), ("url", pa.string())])
    route = ReadRoute("clicks", 1, ("user", "url"), ("string", "string"), 3, 16, schema, schema)
    back = ReadRoute.from_option(route.to_option())
    assert back == route
    assert isinstance(back.key, tuple) and isinstance(back.key_type, tuple)
