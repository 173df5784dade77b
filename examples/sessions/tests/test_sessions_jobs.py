"""The sessions package's functions, tested with ``cutline.testing`` alone: no Spark."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from cutline_sessions.jobs import sessions
from cutline_sessions.pipelines import country_clicks, page_visits, profiled_clicks

from cutline.testing import Harness, InjectedFailure

GAP = 10_000
END = 600_000 + GAP  # the watermark that closes every session (not so far on that TTL expires)


def clicks(n: int = 2_000, users: int = 40, seed: int = 7) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, 600_000, n))
    return pd.DataFrame(
        {"user": [f"u{u}" for u in rng.integers(0, users, n)], "url": "/", "ts": ts}
    )


def expected_sessions(df: pd.DataFrame) -> pd.DataFrame:
    """Sessions computed independently: a gap of GAP or more between a user's clicks."""
    df = df.sort_values(["user", "ts"], kind="stable")
    new = (df.user != df.user.shift()) | (df.ts.diff() >= GAP)
    df = df.assign(session=new.cumsum())
    return (
        df.groupby("session")
        .agg(user=("user", "first"), session_start=("ts", "min"), clicks=("ts", "size"))
        .sort_values(["user", "session_start"])
        .reset_index(drop=True)
    )


def run(h: Harness, df: pd.DataFrame, batch: int) -> list[pa.Table]:
    return [h.process(df.iloc[i : i + batch]) for i in range(0, len(df), batch)]


def closed(outputs: list[pa.Table]) -> pd.DataFrame:
    out = pa.concat_tables([o for o in outputs if o.num_rows]).to_pandas()
    return out.sort_values(["user", "session_start"]).reset_index(drop=True)


def test_sessions_match_an_independent_computation():
    df = clicks()
    with Harness(sessions(gap_ms=GAP, out_of_orderness_ms=0)) as h:
        outputs = [*run(h, df, 250), h.advance_watermark(END)]
    got = closed(outputs)
    expected = expected_sessions(df)
    pd.testing.assert_frame_equal(got[["user", "session_start", "clicks"]], expected)
    numbers = got.groupby("user").session_no.apply(list)
    assert all(n == list(range(1, len(n) + 1)) for n in numbers), "numbered per user from 1"


def test_a_restore_from_a_mid_sequence_snapshot_gives_the_same_sessions():
    df = clicks()
    job = sessions(gap_ms=GAP)
    with Harness(job) as h:
        uninterrupted = [*run(h, df, 200), h.advance_watermark(END)]
    with Harness(job) as h:
        before = run(h, df.iloc[:1_000], 200)
        snapshot = h.snapshot()
        run(h, df.iloc[1_000:1_400], 200)  # lost in the failure
        h.restore(snapshot)
        after = [*run(h, df.iloc[1000:], 200), h.advance_watermark(END)]
    pd.testing.assert_frame_equal(closed(before + after), closed(uninterrupted))


def test_idle_users_totals_expire_by_event_time():
    job = sessions(gap_ms=GAP, idle_ttl_ms=60_000, out_of_orderness_ms=0)
    with Harness(job) as h:
        h.process([{"user": "ann", "url": "/", "ts": 0}])
        h.advance_watermark(GAP)  # ann's session closes: her totals count one session
        users = pa.array(["ann"])
        assert h.state("totals").get(users, pa.array(["sessions"])).to_pylist() == [1]
        h.advance_watermark(GAP + 60_001)  # a minute of event time without a session
        assert h.state("totals").get(users, pa.array(["sessions"])).to_pylist() == [None]


def test_country_totals_follow_the_per_user_counts():
    parsed = clicks(500).assign(country=lambda d: d.user.str[-1])  # as the transform leaves them
    with Harness(country_clicks()) as h:
        run(h, parsed, 100)
        per_user = h.outputs["clicks_by_user"]
    expected = parsed.groupby("country").agg(clicks=("ts", "size"), users=("user", "nunique"))
    latest = {}
    with Harness(country_clicks()) as h:
        for out in run(h, parsed, 100):
            latest.update({r["country"]: (r["clicks"], r["users"]) for r in out.to_pylist()})
    assert latest == {c: (int(e.clicks), int(e.users)) for c, e in expected.iterrows()}
    assert per_user.num_rows > 0


def test_page_visits_sum_per_composite_key():
    df = clicks(300).assign(url=lambda d: "/p/" + (d.ts % 3).astype(str))
    df = df.assign(bucket=df.user.str[-1])
    latest = {}
    with Harness(page_visits()) as h:
        for out in run(h, df, 50):
            latest.update({(r["url"], r["bucket"]): r["visits"] for r in out.to_pylist()})
    expected = df.groupby(["url", "bucket"]).size()
    assert latest == {k: int(v) for k, v in expected.items()}


def test_per_user_counts_carry_the_latest_profile_across_a_restore():
    """A two-input second stage: each user's count update carries the latest profile (by its
    own event time) seen up to that micro-batch, also after a restore from a snapshot taken
    between the profile and the clicks."""
    profiles = [
        {"user": "u1", "country": "FR", "tier": 1, "ts": 5},
        {"user": "u1", "country": "DE", "tier": 2, "ts": 3},  # older: does not replace FR
        {"user": "u2", "country": "IT", "tier": 3, "ts": 1},
    ]
    with Harness(profiled_clicks()) as h:
        first = h.process({"clicks": clicks(100, users=3), "profiles": profiles})
        snapshot = h.snapshot()
        h.process({"clicks": clicks(10, users=3, seed=8)})  # lost in the failure
        h.restore(snapshot)
        later = h.process({"clicks": clicks(50, users=3, seed=9)})
    seen = {r["user"]: (r["country"], r["tier"]) for r in first.to_pylist()}
    assert seen == {"u0": (None, None), "u1": ("FR", 1), "u2": ("IT", 3)}
    counts = {r["user"]: r["clicks"] for r in later.to_pylist()}
    both = pd.concat([clicks(100, users=3), clicks(50, users=3, seed=9)])
    assert counts == both.groupby("user").size().to_dict()
    assert {r["user"]: r["country"] for r in later.to_pylist()}["u1"] == "FR"


def test_state_and_timers_inspected_without_knowing_the_keys():
    """After some clicks and before any session closes: every user who clicked has its open
    clicks in the lists, one event-time timer per click (its time plus the gap), nothing in the
    totals yet; once every session closed, the lists and timers are empty."""
    df = clicks(n=300, users=12)
    with Harness(sessions(gap_ms=GAP, out_of_orderness_ms=GAP * 100)) as h:
        run(h, df, 100)
        users = sorted(df.user.unique())
        assert h.keys("times").column("user").to_pylist() == users
        assert h.count("times") == h.count("pages") == len(df)
        assert h.count("totals") == 0
        timers = h.timers()
        assert timers.column("domain").unique().to_pylist() == ["event"]
        expected = (
            df.assign(timestamp=df.ts + GAP)[["user", "timestamp"]]
            .drop_duplicates()
            .sort_values(["timestamp", "user"])
        )
        got = timers.to_pandas().sort_values(["timestamp", "user"])
        assert got[["user", "timestamp"]].values.tolist() == expected.values.tolist()
        h.advance_watermark(END)
        assert h.count("times") == 0 and h.timers().num_rows == 0
        assert h.keys("totals").column("user").to_pylist() == users


def test_a_micro_batch_failed_half_way_is_restored_and_replayed_exactly():
    """A two-stage pipeline: the micro-batch fails after its first stage wrote state; the
    harness restores the last snapshot and the records since are replayed: the collected output
    equals an uninterrupted run's, micro-batch by micro-batch."""
    df = clicks(n=1_200, users=30).assign(country=lambda d: d.user.str[-1])  # as parsed
    job = country_clicks()
    batches = [df.iloc[i : i + 100] for i in range(0, len(df), 100)]
    with Harness(job) as clean:
        for records in batches:
            clean.process(records)
        reference = {s.name: clean.collected(s.name).to_pylist() for s in clean.stages}
    first = job.stages[0].name
    with Harness(job) as h:
        for records in batches[:5]:
            h.process(records)
        at = h.snapshot()
        h.process(batches[5])
        with pytest.raises(InjectedFailure, match=f"after stage {first!r}"):
            h.process(batches[6], fail_after=first)
        with pytest.raises(RuntimeError, match="restore a snapshot"):
            h.process(batches[6])
        h.restore(at)
        for records in batches[5:]:
            h.process(records)
        for s in h.stages:
            assert h.collected(s.name).to_pylist() == reference[s.name], s.name


def test_sessions_rescaled_1_to_3_to_2_keep_every_click_and_timer():
    """Sessionization snapshotted at parallelism 1, restored at 3, snapshotted, restored at 2
    (the runtime's rescaling by key group): each rescale keeps every open click and every
    timer, once; the sessions at the end are pandas' and an unrescaled run's."""
    df = clicks()
    job = sessions(gap_ms=GAP, out_of_orderness_ms=0)
    thirds = [df.iloc[:700], df.iloc[700:1_400], df.iloc[1_400:]]

    def look(h: Harness):
        return (h.keys("times").to_pylist(), h.count("times"), h.count("pages"),
                h.timers().to_pylist())  # fmt: skip

    with Harness(job) as h:
        run(h, thirds[0], 100)
        at_one = h.snapshot()
        before = look(h)
        h.restore(at_one, parallelism=3)
        assert h.parallelism == 3 and look(h) == before, "nothing lost or doubled by 1 -> 3"
        run(h, thirds[1], 100)
        at_three = h.snapshot()
        before = look(h)
        h.restore(at_three, parallelism=2)
        assert look(h) == before, "nothing lost or doubled by 3 -> 2"
        run(h, thirds[2], 100)
        h.advance_watermark(END)
        got = h.collected().to_pandas()
    got = got.sort_values(["user", "session_start"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got[["user", "session_start", "clicks"]], expected_sessions(df))
    with Harness(job) as plain:
        run(plain, df, 100)
        plain.advance_watermark(END)
        unrescaled = plain.collected().to_pandas()
    columns = ["user", "session_start", "session_no", "clicks"]
    unrescaled = unrescaled.sort_values(["user", "session_start"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got[columns], unrescaled[columns])
