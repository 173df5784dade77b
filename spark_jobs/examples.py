"""The example jobs, registered by name for ``cutline run`` and Dagster."""

from __future__ import annotations

from spark_jobs.job import DeltaSink, JobDefinition, KeyedAggregate, LogSource, register_job
from state.config import CheckpointConfig

CLICKS_SCHEMA = "user string, url string, ts long"


@register_job
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
        checkpoint=CheckpointConfig(
            interval_ms=3_000,
            num_retained=2,
            max_concurrent=2,
            tolerable_failed_checkpoints=3,
            incremental=True,
            local_recovery=True,
        ),
        parallelism=2,
    )
