"""Jobs restored from savepoints (tests/test_savepoint_runs.py). Loaded by ``cutline run
tests.savepoint_jobs:NAME`` (not installed: their code reaches the executors by value).

- ``clicks_copy``: the example's clicks_per_user under another name, into a table of its own;
- ``clicks_counted``: clicks per user counted by a function of the user's own, its state one
  value per user that a person can write (a migration bootstraps it from a DataFrame).
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pyarrow.compute as pc
from cutline_examples.jobs import clicks_per_user

from cutline import (
    DeltaSink,
    JobDefinition,
    KeyedContext,
    KeyedProcess,
    KeyedProcessFunction,
    ValueStateSpec,
)


def clicks_copy() -> JobDefinition:
    return dataclasses.replace(
        clicks_per_user(), name="clicks_copy", sink=DeltaSink("clicks_out", "clicks_copy")
    )


class CountClicks(KeyedProcessFunction):
    """Per user, the running number of clicks; each micro-batch emits the users it touched."""

    output_schema = pa.schema([("user", pa.string()), ("clicks", pa.int64())])
    states = (ValueStateSpec("clicks", pa.int64()),)

    def process_batch(self, records: pa.Table, ctx: KeyedContext) -> pa.Table:
        counts = records.group_by("user").aggregate([("user", "count")])
        users = counts.column("user")
        total = pc.add(ctx.state("clicks").get(users).fill_null(0), counts.column("user_count"))
        ctx.state("clicks").update(users, total)
        return pa.table({"user": users, "clicks": total})


def clicks_counted() -> JobDefinition:
    base = clicks_per_user()
    return dataclasses.replace(
        base,
        name="clicks_counted",
        operator=KeyedProcess(
            name="count_clicks",
            inputs={"clicks": "user"},
            key_type="string",
            function=CountClicks(),
        ),
        sink=DeltaSink("clicks_out", "clicks_counted"),
    )
