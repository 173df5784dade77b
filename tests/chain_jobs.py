"""A job whose third stage reads the stage before it and, past it, the first: a stage's output
carried through the stage between (tests/test_chains.py). Loaded by
``cutline run tests.chain_jobs:skip_chain`` (not installed: its code reaches the executors by
value, spark_jobs/job_loader.py)."""

from __future__ import annotations

from cutline import (
    CheckpointConfig,
    DeltaSink,
    EnrichWithLatest,
    JobDefinition,
    KeyedAggregate,
    LogSource,
)

CLICKS_SCHEMA = "user string, url string, ts long"


def skip_chain() -> JobDefinition:
    """Per user: the running click count (``clicks_by_user``), the number of micro-batches that
    changed it (``updates_by_user``, reading the first stage), and those updates with the
    latest count of the first stage beside them (``with_clicks``, reading both)."""
    counts = KeyedAggregate(
        "clicks_by_user",
        "clicks",
        "user",
        "string",
        {"clicks": ("count", None), "ts": ("max", "ts")},
    )
    updates = KeyedAggregate(
        "updates_by_user", "clicks_by_user", "user", "string", {"updates": ("count", None)}
    )
    both = EnrichWithLatest(
        "with_clicks",
        stream="updates_by_user",
        table="clicks_by_user",
        key="user",
        key_type="string",
        fields=("clicks",),
        table_time="ts",
    )
    return JobDefinition(
        name="skip_chain",
        sources=(LogSource("clicks", "clicks", CLICKS_SCHEMA),),
        operator=(counts, updates, both),
        sink=DeltaSink("out", "skip_chain"),
        checkpoint=CheckpointConfig(interval_ms=1_000),
        parallelism=2,
    )
