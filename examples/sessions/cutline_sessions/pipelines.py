"""Pipelines of two keyed stages, written only against Cutline's public API.

``country_clicks``: clicks are parsed and filtered by a stateless transform (pages ``/p/N`` with
``N`` a multiple of 5 are dropped; a country is derived from the user), counted per user, and
the users' latest counts re-keyed by country into per-country totals. Three sinks: the per-user
counts and the per-country totals as they change, epoch by epoch, and a table of each user's
current count (an upsert by user). Both stages snapshot at the same micro-batch cut.
``page_visits``: the same shape with composite keys. ``profiled_clicks``: a two-input stage
after a keyed one, the per-user counts joined with a second source.
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pyarrow.compute as pc

from cutline import (
    DeltaSink,
    DeltaUpsertSink,
    EnrichWithLatest,
    JobDefinition,
    KeyedAggregate,
    KeyedContext,
    KeyedProcess,
    KeyedProcessFunction,
    LogSource,
    MapStateSpec,
    Transform,
    ValueStateSpec,
)
from cutline_sessions.jobs import CHECKPOINTS, CLICKS_SCHEMA

PROFILES_SCHEMA = "user string, country string, tier int, ts long"

DROPPED_PAGE_MULTIPLE = 5


def parse_clicks(df):
    """Drop the clicks on every fifth page; the user's country is the first hex digit of the
    MD5 of the user name."""
    from pyspark.sql import functions as F

    page = F.regexp_extract(F.col("url"), r"^/p/(\d+)$", 1).cast("long")
    return df.where(page % DROPPED_PAGE_MULTIPLE != 0).withColumn(
        "country", F.substring(F.md5(F.col("user")), 1, 1)
    )


class CountryTotals(KeyedProcessFunction):
    """Per country: every user's latest click count (a map) and their sum. Each micro-batch
    emits the new totals of the countries it touched."""

    output_schema = pa.schema(
        [("country", pa.string()), ("clicks", pa.int64()), ("users", pa.int64())]
    )
    states = (
        MapStateSpec("latest", pa.int64(), key_type=pa.string()),
        ValueStateSpec("clicks", pa.int64()),
        ValueStateSpec("users", pa.int64()),
    )

    def process_batch(self, records: pa.Table, ctx: KeyedContext) -> pa.Table:
        latest = records.group_by(["country", "user"]).aggregate([("clicks", "max")])
        countries, users = latest.column("country"), latest.column("user")
        clicks = latest.column("clicks_max")
        before = ctx.state("latest").get(countries, users)
        ctx.state("latest").put(countries, users, clicks)
        change = (
            pa.table(
                {
                    "country": countries,
                    "clicks": pc.subtract(clicks, before.fill_null(0)),
                    "users": pc.is_null(before).cast(pa.int64()),
                }
            )
            .group_by("country")
            .aggregate([("clicks", "sum"), ("users", "sum")])
        )
        keys = change.column("country")
        out = {"country": keys}
        for name in ("clicks", "users"):
            state = ctx.state(name)
            out[name] = pc.add(state.get(keys).fill_null(0), change.column(f"{name}_sum"))
            state.update(keys, out[name])
        return pa.table(out)


def country_clicks() -> JobDefinition:
    """Clicks per user and per country, exactly once into ``user_clicks`` and
    ``country_clicks``, and each user's current count and country into ``user_totals``."""
    per_user = KeyedAggregate(
        name="clicks_by_user",
        source="clicks",
        key="user",
        key_type="string",
        aggregates={"clicks": ("count", None), "country": ("last", "country")},
        event_time="ts",
    )
    per_country = KeyedProcess(
        name="clicks_by_country",
        inputs={"clicks_by_user": "country"},
        key_type="string",
        function=CountryTotals(),
    )
    return JobDefinition(
        name="country_clicks",
        description="Clicks per user, then per country (two keyed stages)",
        sources=(LogSource("clicks", "clicks", CLICKS_SCHEMA, max_records_per_partition=20_000),),
        transforms=(Transform("parse", "clicks", parse_clicks),),
        operator=(per_user, per_country),
        sink=(
            DeltaSink("user_clicks_out", "user_clicks", stage="clicks_by_user"),
            DeltaSink("country_clicks_out", "country_clicks"),
            DeltaUpsertSink("user_totals_out", "user_totals", key="user", stage="clicks_by_user"),
        ),
        checkpoint=CHECKPOINTS,
        parallelism=2,
    )


def with_bucket(df):
    """A user's bucket: the last character of the user name."""
    from pyspark.sql import functions as F

    return df.withColumn("bucket", F.substring(F.col("user"), -1, 1))


class LatestSum(KeyedProcessFunction):
    """Per (url, bucket), a composite key: every user's latest visit count (a map) and their
    sum. Each micro-batch emits the new totals of the keys it touched."""

    states = (
        MapStateSpec("latest", pa.int64(), key_type=pa.string()),
        ValueStateSpec("total", pa.int64()),
    )

    def process_batch(self, records: pa.Table, ctx: KeyedContext) -> pa.Table:
        latest = records.group_by(["url", "bucket", "user"]).aggregate([("visits", "max")])
        keys, visits = ctx.key_of(latest), latest.column("visits_max")  # keys: (url, bucket)
        before = ctx.state("latest").get(keys, latest.column("user")).fill_null(0)
        ctx.state("latest").put(keys, latest.column("user"), visits)
        change = (
            latest.select(["url", "bucket"])
            .append_column("added", pc.subtract(visits, before))
            .group_by(["url", "bucket"])
            .aggregate([("added", "sum")])
        )
        keys = ctx.key_of(change)
        total = pc.add(ctx.state("total").get(keys).fill_null(0), change.column("added_sum"))
        ctx.state("total").update(keys, total)
        return change.select(["url", "bucket"]).append_column("visits", total)


def page_visits() -> JobDefinition:
    """Two stages keyed by composite keys: visits per (user, url), then per (url, bucket) the
    sum of its users' latest visit counts, re-partitioned by both columns. Run it as
    ``cutline run cutline_sessions.pipelines:page_visits``."""
    job = country_clicks()
    per_user_page = KeyedAggregate(
        name="visits_by_user_page",
        source="clicks",
        key=("user", "url"),
        key_type=("string", "string"),
        aggregates={"visits": ("count", None), "bucket": ("last", "bucket")},
        event_time="ts",
    )
    per_page_bucket = KeyedProcess(
        name="visits_by_page_bucket",
        inputs={"visits_by_user_page": ("url", "bucket")},
        key_type=("string", "string"),
        function=LatestSum(),
    )
    return dataclasses.replace(
        job,
        name="page_visits",
        description="Visits per (user, page), then per (page, bucket): composite keys",
        transforms=(Transform("bucket", "clicks", with_bucket),),
        operator=(per_user_page, per_page_bucket),
        sink=(
            DeltaSink("visits_out", "page_visits", stage="visits_by_user_page"),
            DeltaSink("totals_out", "page_bucket_visits"),
        ),
    )


def profiled_clicks() -> JobDefinition:
    """Clicks per user, each update with the user's latest profile: a two-input stage after a
    keyed stage. The second stage reads the first's output and the ``profiles`` source, both
    cut at the same barrier. Run it as
    ``cutline run cutline_sessions.pipelines:profiled_clicks``."""
    per_user = KeyedAggregate(
        name="clicks_by_user",
        source="clicks",
        key="user",
        key_type="string",
        aggregates={"clicks": ("count", None), "ts": ("max", "ts")},  # ts: the latest click's
    )
    with_profile = EnrichWithLatest(
        name="with_profile",
        stream="clicks_by_user",
        table="profiles",
        key="user",
        key_type="string",
        fields=("country", "tier"),
        table_time="ts",
    )
    return JobDefinition(
        name="profiled_clicks",
        description="Clicks per user, with the user's latest profile (a two-input later stage)",
        sources=(
            LogSource("clicks", "clicks", CLICKS_SCHEMA, max_records_per_partition=20_000),
            LogSource("profiles", "profiles", PROFILES_SCHEMA, max_records_per_partition=5_000),
        ),
        operator=(per_user, with_profile),
        sink=DeltaSink("profiled_out", "profiled_clicks"),
        checkpoint=CHECKPOINTS,
        parallelism=2,
    )
