"""Jobs of a "user" who changes theirs between runs, for tests/test_user_jobs.py. Loaded by
``cutline run tests.user_jobs:NAME`` (this module is not installed: its code reaches the
executors by value, spark_jobs/job_loader.py)."""

from __future__ import annotations

import dataclasses
import os

import pyarrow as pa
import pyarrow.compute as pc
from cutline_sessions.jobs import Sessionize, sessions
from cutline_sessions.pipelines import country_clicks, parse_clicks

from cutline import (
    JobDefinition,
    KeyedContext,
    ListStateSpec,
    MapStateSpec,
    Transform,
    Ttl,
)

FAIL_AFTER = "CUTLINE_TEST_FAIL_AFTER_TS"


def _with(function=None, **stage) -> JobDefinition:
    job = sessions()
    if function is not None:
        stage["function"] = function
    return dataclasses.replace(job, operator=dataclasses.replace(job.operator, **stage))


def renamed() -> JobDefinition:
    """The stage renamed, its uid kept: restores its state."""
    return _with(name="sessions_by_gap", uid="sessionize")


def new_uid() -> JobDefinition:
    """The stage replaced by one with another uid: the old state has no stage to go to."""
    return _with(name="sessionize_v2", uid="sessionize_v2")


class WiderTimes(Sessionize):
    """A changed state type: the event times as float64."""

    def __init__(self) -> None:
        super().__init__()
        self.states = (
            ListStateSpec("times", pa.float64()),
            ListStateSpec("pages", pa.string()),
            MapStateSpec("totals", pa.int64(), ttl=Ttl(3_600_000, clock="event")),
        )


def changed_type() -> JobDefinition:
    return _with(function=WiderTimes())


class Fragile(Sessionize):
    """Sessionize with a bug: it raises on clicks later than ``$CUTLINE_TEST_FAIL_AFTER_TS``."""

    def process_batch(self, records: pa.Table, ctx: KeyedContext) -> None:
        limit = os.environ.get(FAIL_AFTER)
        if limit and pc.max(records.column("ts")).as_py() > int(limit):
            self.check(records)
        return super().process_batch(records, ctx)

    def check(self, records: pa.Table) -> None:
        raise ValueError(f"a click after {os.environ.get(FAIL_AFTER)}: cannot sessionize it")


def fragile() -> JobDefinition:
    return _with(function=Fragile())


def _pipeline(transform) -> JobDefinition:
    job = country_clicks()
    return dataclasses.replace(job, transforms=(Transform("parse", "clicks", transform),))


def dropping_transform() -> JobDefinition:
    """A transform that projects away the runtime's columns: refused, naming it."""
    return _pipeline(lambda df: parse_clicks(df).select("user", "url", "ts", "country"))


def raising_transform() -> JobDefinition:
    """A transform that raises while the job's plan is built."""

    def parse(df):
        raise KeyError("no column 'referrer'")

    return _pipeline(parse)
