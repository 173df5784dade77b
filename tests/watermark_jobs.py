"""A windowed job for tests/test_partition_watermarks.py, loaded by ``cutline run
tests.watermark_jobs:lagging_revenue`` (code reaches the executors by value)."""

from __future__ import annotations

from cutline import CheckpointConfig, DeltaSink, JobDefinition, LogSource, WindowedAggregate

WINDOW_MS, BOUND_MS, IDLE_MS = 10_000, 2_000, 1_500
TABLE = "lagging_revenue"


def lagging_revenue() -> JobDefinition:
    """Orders per user in 10 s event-time windows, 2 s out of orderness, a partition idle after
    1.5 s without records."""
    return JobDefinition(
        name="lagging_revenue",
        sources=(
            LogSource("orders", "orders", "order_id string, user string, amount double, ts long"),
        ),
        operator=WindowedAggregate(
            name="windows",
            source="orders",
            key="user",
            key_type="string",
            event_time="ts",
            window_ms=WINDOW_MS,
            out_of_orderness_ms=BOUND_MS,
            aggregates={"orders": ("count", None), "revenue": ("sum", "amount")},
            idle_timeout_ms=IDLE_MS,
        ),
        sink=DeltaSink("out", TABLE),
        checkpoint=CheckpointConfig(interval_ms=1_000),
        parallelism=2,
    )
