"""The example jobs' functions, tested with ``cutline.testing`` alone: no Spark, milliseconds."""

from __future__ import annotations

import pandas as pd
import pytest
from cutline_examples.jobs import (
    clicks_per_user,
    enriched_orders,
    user_activity,
    windowed_revenue,
)

from cutline.testing import Harness

CLICKS = [
    {"user": "ann", "url": "/a", "ts": 1_000},
    {"user": "bob", "url": "/b", "ts": 1_500},
    {"user": "ann", "url": "/c", "ts": 2_000},
]


def rows(table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda r: tuple(str(v) for v in r.values()))


def test_clicks_per_user_counts_across_batches_and_a_restore():
    with Harness(clicks_per_user()) as h:
        assert rows(h.process(CLICKS)) == [
            {"user": "ann", "clicks": 2, "last_ts": 2_000},
            {"user": "bob", "clicks": 1, "last_ts": 1_500},
        ]
        snapshot = h.snapshot()
        h.process([{"user": "ann", "url": "/d", "ts": 3_000}])
        h.restore(snapshot)  # as after a failure: the batch after the snapshot runs again
        again = h.process(pd.DataFrame([{"user": "ann", "url": "/d", "ts": 3_000}]))
        assert rows(again) == [{"user": "ann", "clicks": 3, "last_ts": 3_000}]


def test_user_activity_keeps_the_payload_of_the_latest_event_time():
    events = [
        {"user": "ann", "amount": 2.0, "payload": "new", "ts": 5_000},
        {"user": "ann", "amount": 3.0, "payload": "old", "ts": 4_000},
    ]
    with Harness(user_activity()) as h:
        (out,) = h.process(events).to_pylist()
        assert (out["events"], out["amount"], out["payload"]) == (2, 5.0, "new")


def test_windowed_revenue_emits_a_window_once_the_watermark_passes_it():
    orders = pd.DataFrame(
        {
            "order_id": ["o1", "o2", "o3", "o4"],
            "user": ["ann", "ann", "bob", "ann"],
            "amount": [10.0, 5.0, 7.0, 1.0],
            "ts": [1_000, 9_000, 4_000, 12_500],
        }
    )
    with Harness(windowed_revenue()) as h:
        assert h.process(orders.iloc[:3]).num_rows == 0  # window [0, 10 s) still open
        h.process(orders.iloc[3:])  # 12.5 s less 2 s out of orderness: watermark 10.5 s
        closed = rows(h.advance_watermark(0))  # the next micro-batch fires the window
        expected = (
            orders[orders.ts < 10_000]
            .groupby("user")
            .agg(orders=("ts", "size"), revenue=("amount", "sum"))
        )
        assert [(r["user"], r["orders"], r["revenue"]) for r in closed] == [
            (u, int(e.orders), float(e.revenue)) for u, e in expected.iterrows()
        ]
        late = h.process([{"order_id": "o5", "user": "bob", "amount": 9.0, "ts": 2_000}])
        assert late.num_rows == 0, "a record of a window the watermark passed is dropped"


def test_enriched_orders_take_the_profile_latest_in_event_time():
    with Harness(enriched_orders()) as h:
        h.process(
            {
                "profiles": [
                    {"user": "ann", "country": "DE", "tier": 2, "ts": 2_000},
                    {"user": "ann", "country": "FR", "tier": 1, "ts": 1_000},  # older, later
                ]
            }
        )
        snapshot = h.snapshot()
        with Harness(enriched_orders(), restore=snapshot) as restored:
            out = restored.process(
                {"orders": [{"order_id": "o1", "user": "ann", "amount": 1.0, "ts": 3_000}]}
            )
            assert [(r["order_id"], r["country"], r["tier"]) for r in out.to_pylist()] == [
                ("o1", "DE", "2")  # the table fields are kept as text
            ]


@pytest.mark.parametrize("batch", [1, 7, 100])
def test_clicks_per_user_does_not_depend_on_how_records_are_batched(batch):
    clicks = [{"user": f"u{i % 13}", "url": "/", "ts": i} for i in range(200)]
    with Harness(clicks_per_user()) as h:
        latest = {}
        for i in range(0, len(clicks), batch):
            latest.update(
                {r["user"]: r["clicks"] for r in h.process(clicks[i : i + batch]).to_pylist()}
            )
    assert latest == pd.DataFrame(clicks).groupby("user").size().to_dict()
