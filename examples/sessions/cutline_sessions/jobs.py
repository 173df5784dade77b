"""Sessionization written only against Cutline's public API (``cutline``).

A session is a maximal run of a user's clicks with less than ``gap_ms`` between consecutive
clicks in event time. It closes once the watermark is ``gap_ms`` past its last click; clicks that
arrive out of order within the watermark's bound join the right session.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from cutline import (
    CheckpointConfig,
    DeltaSink,
    JobDefinition,
    KeyedContext,
    KeyedProcess,
    KeyedProcessFunction,
    ListStateSpec,
    LogSource,
    MapStateSpec,
    Ttl,
)

CLICKS_SCHEMA = "user string, url string, ts long"
# a checkpoint every 3 s (incremental, with local recovery: the defaults); two retained, so that
# a corrupt latest checkpoint can fall back to the previous one
CHECKPOINTS = CheckpointConfig(
    interval_ms=3_000,
    num_retained=2,
    max_concurrent=2,
    tolerable_failed_checkpoints=3,
)
OUTPUT = pa.schema(
    [
        ("user", pa.string()),
        ("session_start", pa.int64()),
        ("session_end", pa.int64()),
        ("clicks", pa.int64()),
        ("pages", pa.int64()),
        ("session_no", pa.int64()),
    ]
)


class Sessionize(KeyedProcessFunction):
    """Per user: the open sessions' clicks in two lists (event times, pages), running totals in
    a map that expires after ``idle_ttl_ms`` of event time without a closed session."""

    output_schema = OUTPUT

    def __init__(self, gap_ms: int = 10_000, idle_ttl_ms: int = 3_600_000) -> None:
        self.gap_ms = gap_ms
        self.states = (
            ListStateSpec("times", pa.int64()),
            ListStateSpec("pages", pa.string()),
            MapStateSpec("totals", pa.int64(), ttl=Ttl(idle_ttl_ms, clock="event")),
        )

    def process_batch(self, records: pa.Table, ctx: KeyedContext) -> None:
        users, ts = records.column("user"), records.column("ts")
        ctx.state("times").add(users, ts)
        ctx.state("pages").add(users, records.column("url"))
        # a timer per click: whichever session the click ends up closing, a timer is due then
        ctx.register_event_timers(users, pc.add(ts, self.gap_ms))
        return None

    def on_timers(self, timers: pa.Table, ctx: KeyedContext) -> pa.Table:
        users = pc.unique(timers.column("user"))
        times, pages = ctx.state("times").get(users), ctx.state("pages").get(users)
        clicks = pd.DataFrame(
            {
                "owner": pc.list_parent_indices(times).to_numpy(),
                "ts": times.flatten().to_numpy(),
                "page": pages.flatten().to_pandas(),
            }
        ).sort_values(["owner", "ts"], kind="stable")
        new = (clicks["owner"].diff() != 0) | (clicks["ts"].diff() >= self.gap_ms)
        clicks["session"] = np.cumsum(new.to_numpy())
        sessions = clicks.groupby("session").agg(
            owner=("owner", "first"),
            session_start=("ts", "min"),
            session_end=("ts", "max"),
            clicks=("ts", "size"),
            pages=("page", "nunique"),
        )
        closed = sessions[sessions["session_end"] + self.gap_ms <= ctx.watermark]
        open_clicks = clicks[~clicks["session"].isin(closed.index)]
        self._keep_open(ctx, users, open_clicks)
        if closed.empty:
            return None
        owners = pa.array(closed["owner"].to_numpy())
        return self._numbered(ctx, users, closed, owners)

    def _keep_open(self, ctx: KeyedContext, users: pa.Array, open_clicks: pd.DataFrame) -> None:
        """The lists keep the clicks of sessions still open; a user with none is cleared."""
        still = np.unique(open_clicks["owner"].to_numpy())
        done = np.setdiff1d(np.arange(len(users)), still)
        if len(done):
            gone = pc.take(users, pa.array(done))
            ctx.state("times").clear(gone)
            ctx.state("pages").clear(gone)
        if len(still):
            keep = pc.take(users, pa.array(still))
            counts = open_clicks.groupby("owner").size().reindex(still).to_numpy()
            offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
            ctx.state("times").update(
                keep, pa.ListArray.from_arrays(offsets, pa.array(open_clicks["ts"].to_numpy()))
            )
            ctx.state("pages").update(
                keep, pa.ListArray.from_arrays(offsets, pa.array(open_clicks["page"], pa.string()))
            )

    def _numbered(
        self, ctx: KeyedContext, users: pa.Array, closed: pd.DataFrame, owners: pa.Array
    ) -> pa.Table:
        """The closed sessions, numbered per user after the sessions the totals counted."""
        totals = ctx.state("totals")
        who = pc.unique(owners)
        keys = pc.take(users, who)
        before = totals.get(keys, pa.array(["sessions"] * len(keys))).fill_null(0)
        base = pd.Series(before.to_numpy(), index=who.to_numpy())
        rank = closed.groupby("owner").cumcount().to_numpy() + 1
        numbers = base.reindex(closed["owner"].to_numpy()).to_numpy() + rank
        per_user = closed.groupby("owner").size().reindex(who.to_numpy()).to_numpy()
        totals.put(keys, pa.array(["sessions"] * len(keys)), pa.array(base.to_numpy() + per_user))
        return pa.table(
            {
                "user": pc.take(users, owners),
                "session_start": pa.array(closed["session_start"].to_numpy()),
                "session_end": pa.array(closed["session_end"].to_numpy()),
                "clicks": pa.array(closed["clicks"].to_numpy()),
                "pages": pa.array(closed["pages"].to_numpy()),
                "session_no": pa.array(numbers),
            }
        )


def sessions(
    gap_ms: int = 10_000, idle_ttl_ms: int = 3_600_000, out_of_orderness_ms: int = 2_000
) -> JobDefinition:
    """Clicks per user session, exactly once into the Delta table ``sessions``."""
    return JobDefinition(
        name="sessions",
        description="User sessions (event-time gap), from the clicks log",
        sources=(LogSource("clicks", "clicks", CLICKS_SCHEMA, max_records_per_partition=20_000),),
        operator=KeyedProcess(
            name="sessionize",
            inputs={"clicks": "user"},
            key_type="string",
            function=Sessionize(gap_ms, idle_ttl_ms),
            event_time="ts",
            out_of_orderness_ms=out_of_orderness_ms,
        ),
        sink=DeltaSink("sessions_out", "sessions"),
        checkpoint=CHECKPOINTS,
        parallelism=2,
    )
