"""Cutline's example jobs, on the public API alone: each a library operator over the local log
(or Kafka) into a Delta table. This package registers them through the ``cutline.jobs`` entry
point (pyproject.toml), as any user's package would; ``cutline run clicks_per_user`` and the
Dagster definitions find them by name."""

from __future__ import annotations

import dataclasses

from cutline import (
    CheckpointConfig,
    DeltaSink,
    EnrichWithLatest,
    JobDefinition,
    KafkaSource,
    KeyedAggregate,
    LogSource,
    WindowedAggregate,
)

CLICKS_SCHEMA = "user string, url string, ts long"
EVENTS_SCHEMA = "user string, amount double, payload string, ts long"
ORDERS_SCHEMA = "order_id string, user string, amount double, ts long"
PROFILES_SCHEMA = "user string, country string, tier int, ts long"

# Every example: a checkpoint every 3 s (incremental, with local recovery: the defaults); two
# retained so that a corrupt latest checkpoint can fall back to the previous one.
CHECKPOINTS = CheckpointConfig(
    interval_ms=3_000,
    num_retained=2,
    max_concurrent=2,
    tolerable_failed_checkpoints=3,
)


def clicks_per_user() -> JobDefinition:
    """Clicks per user: a keyed count over the clicks log, written to Delta exactly once."""
    return JobDefinition(
        name="clicks_per_user",
        description="Running count of clicks per user",
        sources=(LogSource("clicks", "clicks", CLICKS_SCHEMA, max_records_per_partition=20_000),),
        operator=KeyedAggregate(
            name="count_by_user",
            source="clicks",
            key="user",
            key_type="string",
            aggregates={"clicks": ("count", None), "last_ts": ("max", "ts")},
        ),
        sink=DeltaSink("clicks_out", "clicks_per_user"),
        checkpoint=CHECKPOINTS,
        parallelism=2,
    )


def clicks_per_user_kafka() -> JobDefinition:
    """clicks_per_user reading a Kafka topic (brokers from $CUTLINE_KAFKA_BOOTSTRAP)."""
    base = clicks_per_user()
    return dataclasses.replace(
        base,
        name="clicks_per_user_kafka",
        description="Running count of clicks per user, from Kafka",
        sources=(
            KafkaSource(
                "clicks", "clicks", CLICKS_SCHEMA, partitions=2, max_records_per_partition=20_000
            ),
        ),
        sink=DeltaSink("clicks_out", "clicks_per_user_kafka"),
    )


def user_activity() -> JobDefinition:
    """Per user: event count, amount sum and the latest 100-byte payload (the peer benchmark's
    state: bench/peer_bench.py runs the same aggregation in Spark's own stateful APIs)."""
    return JobDefinition(
        name="user_activity",
        description="Count, sum and latest payload per user",
        sources=(LogSource("events", "events", EVENTS_SCHEMA, max_records_per_partition=20_000),),
        operator=KeyedAggregate(
            name="activity_by_user",
            source="events",
            key="user",
            key_type="string",
            aggregates={
                "events": ("count", None),
                "amount": ("sum", "amount"),
                "payload": ("last", "payload"),
                "last_ts": ("max", "ts"),
            },
            event_time="ts",
        ),
        sink=DeltaSink("activity_out", "user_activity"),
        checkpoint=CHECKPOINTS,
        parallelism=2,
    )


def windowed_revenue() -> JobDefinition:
    """Revenue and order count per user in tumbling 10-second event-time windows."""
    return JobDefinition(
        name="windowed_revenue",
        description="Revenue per user per 10 s tumbling event-time window",
        sources=(LogSource("orders", "orders", ORDERS_SCHEMA, max_records_per_partition=20_000),),
        operator=WindowedAggregate(
            name="revenue_windows",
            source="orders",
            key="user",
            key_type="string",
            event_time="ts",
            window_ms=10_000,
            out_of_orderness_ms=2_000,
            aggregates={"orders": ("count", None), "revenue": ("sum", "amount")},
        ),
        sink=DeltaSink("revenue_out", "windowed_revenue"),
        checkpoint=CHECKPOINTS,
        parallelism=2,
    )


def enriched_orders() -> JobDefinition:
    """Orders enriched with the latest profile of their user: two inputs, one barrier."""
    return JobDefinition(
        name="enriched_orders",
        description="Orders joined with the latest user profile",
        sources=(
            LogSource("orders", "orders", ORDERS_SCHEMA, max_records_per_partition=20_000),
            LogSource("profiles", "profiles", PROFILES_SCHEMA, max_records_per_partition=5_000),
        ),
        operator=EnrichWithLatest(
            name="latest_profile",
            stream="orders",
            table="profiles",
            key="user",
            key_type="string",
            fields=("country", "tier"),
            table_time="ts",
        ),
        sink=DeltaSink("enriched_out", "enriched_orders"),
        checkpoint=CHECKPOINTS,
        parallelism=2,
    )
