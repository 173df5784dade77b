"""A job restored from another job's savepoint (tests/test_savepoint_runs.py): the example's
clicks_per_user under another name, into a table of its own. Loaded by ``cutline run
tests.savepoint_jobs:clicks_copy`` (not installed: its code reaches the executors by value)."""

from __future__ import annotations

import dataclasses

from cutline_examples.jobs import clicks_per_user

from cutline import DeltaSink, JobDefinition


def clicks_copy() -> JobDefinition:
    return dataclasses.replace(
        clicks_per_user(), name="clicks_copy", sink=DeltaSink("clicks_out", "clicks_copy")
    )
