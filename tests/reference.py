"""What the example jobs must output, computed from their input logs with pandas alone.

Independent of Cutline's code paths (no operators, no Arrow group-bys, no Spark): the exactly-once
tests compare Cutline's Delta output with these answers, never with another Cutline run.

An output table is an update stream, so what "exactly once" means is checked per job:

- ``clicks_per_user``: per user, the emitted click counts rise strictly from epoch to epoch (a
  record processed twice, or an update emitted twice, breaks that), and the last one is the
  user's number of clicks in the input, with the latest event time;
- ``windowed_revenue``: every window the final watermark closes is emitted once, with the count
  and sum of its orders in the input;
- ``enriched_orders``: every order is emitted once, with a profile of its user (or none);
- ``sessions`` (examples/sessions): every session the final watermark closes is emitted once,
  numbered per user, with its clicks and distinct pages;
- ``country_clicks`` (examples/sessions, two stages): per user and per country, the emitted
  counts rise strictly and the last ones are the input's, after the job's filter;
- ``page_visits`` (examples/sessions, two stages keyed by composite keys): per (user, url) and
  per (url, bucket), the emitted counts rise strictly and end at the input's.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd

from spark_jobs.catalog.tables import read_delta

# what makes a record valid, per topic: its key, and its fields of a numeric type
VALID = {
    "clicks": ("user", ["ts"]),
    "orders": ("user", ["ts", "amount"]),
    "profiles": ("user", ["ts", "tier"]),
}


def read_log(home: Path, topic: str, *, bad: bool = False) -> pd.DataFrame:
    """The valid records of a topic of the local log (or, with ``bad``, the others), with
    their partition and byte offset."""
    key, numeric = VALID[topic]
    rows, rejects = [], []
    for path in sorted((home / "log" / topic).glob("partition-*.jsonl")):
        partition, offset = int(path.stem.split("-")[1]), 0
        for line in path.read_bytes().splitlines(keepends=True):
            where = {"partition": partition, "offset": offset, "raw": line.rstrip(b"\n").decode()}
            offset += len(line)
            try:
                record = json.loads(line)
            except ValueError:
                rejects.append(where)
                continue
            ok = isinstance(record, dict) and isinstance(record.get(key), str)
            if ok and all(isinstance(record.get(f), int | float) for f in numeric):
                rows.append({**record, **where})
            else:
                rejects.append(where)
    return pd.DataFrame(rejects if bad else rows)


def output(home: Path, table: str) -> pd.DataFrame:
    return read_delta(home / "warehouse" / "tables" / table).to_pandas()


def check_clicks(home: Path) -> str:
    """Fails unless ``clicks_per_user``'s output is exactly once; returns a summary."""
    clicks = read_log(home, "clicks")
    expected = clicks.groupby("user").agg(clicks=("ts", "size"), last_ts=("ts", "max"))
    got = output(home, "clicks_per_user").sort_values(["user", "_epoch"])
    duplicated = got[got.duplicated(["user", "clicks"], keep=False)]
    assert duplicated.empty, f"updates emitted twice:\n{duplicated.head(10)}"
    falling = got.groupby("user")["clicks"].diff() <= 0
    assert not falling.any(), f"counts going backwards:\n{got[falling].head(10)}"
    final = got.groupby("user").last()[["clicks", "last_ts"]]
    final["last_ts"] = final["last_ts"].astype("int64")
    pd.testing.assert_frame_equal(final.sort_index(), expected.sort_index(), check_dtype=False)
    return f"{len(clicks):,} clicks, {len(expected):,} users, {len(got):,} output rows compared"


def windowed_expected(home: Path, window_ms: int = 10_000, lateness_ms: int = 2_000):
    orders = read_log(home, "orders")
    watermark = orders["ts"].max() - lateness_ms
    orders["window_start"] = orders["ts"] - orders["ts"] % window_ms
    closed = orders[orders["window_start"] + window_ms - 1 <= watermark]
    expected = closed.groupby(["user", "window_start"]).agg(
        orders=("ts", "size"), revenue=("amount", "sum")
    )
    return orders, expected


def check_windows(home: Path) -> str:
    orders, expected = windowed_expected(home)
    got = output(home, "windowed_revenue")
    duplicated = got[got.duplicated(["user", "window_start"], keep=False)]
    assert duplicated.empty, f"windows emitted twice:\n{duplicated.head(10)}"
    got = got.set_index(["user", "window_start"])[["orders", "revenue"]].sort_index()
    assert len(got) == len(expected), f"{len(got)} windows emitted, {len(expected)} expected"
    pd.testing.assert_frame_equal(
        got, expected.sort_index(), check_dtype=False, check_exact=False, rtol=1e-9
    )
    return f"{len(orders):,} orders, {len(expected):,} windows compared"


def check_enriched(home: Path) -> str:
    orders, profiles = read_log(home, "orders"), read_log(home, "profiles")
    got = output(home, "enriched_orders")
    twice = got[got.duplicated("order_id", keep=False)]
    assert twice.empty, f"orders emitted twice:\n{twice.head(10)}"
    assert set(got["order_id"]) == set(orders["order_id"]), "orders lost"
    merged = got.merge(orders, on="order_id", suffixes=("", "_in"))
    assert (merged["user"] == merged["user_in"]).all() and (merged["ts"] == merged["ts_in"]).all()
    known = set(zip(profiles["user"], profiles["country"], profiles["tier"], strict=True))
    enriched = merged.dropna(subset=["country"])
    pairs = zip(enriched["user"], enriched["country"], enriched["tier"].astype(int), strict=True)
    strange = [p for p in pairs if p not in known]
    assert not strange, f"enriched with profiles their user never had: {strange[:5]}"
    return f"{len(orders):,} orders ({len(enriched):,} enriched) compared"


def sessions_expected(clicks: pd.DataFrame, gap_ms: int, lateness_ms: int) -> pd.DataFrame:
    """Per user, runs of clicks less than ``gap_ms`` apart in event time, which the final
    watermark (the largest event time less ``lateness_ms``) has passed by ``gap_ms``."""
    watermark = clicks["ts"].max() - lateness_ms
    rows = []
    for user, ts_pages in clicks.sort_values("ts").groupby("user"):
        number, start, last, pages, count = 0, None, None, set(), 0
        for ts, page in zip(ts_pages["ts"], ts_pages["url"], strict=True):
            if last is not None and ts - last >= gap_ms:
                number += 1
                rows.append((user, start, last, len(pages), number, count))
                start, pages = None, set()
            if start is None:
                start, count = ts, 0
            last, count = ts, count + 1
            pages.add(page)
        number += 1
        rows.append((user, start, last, len(pages), number, count))
    sessions = pd.DataFrame(
        rows, columns=["user", "session_start", "session_end", "pages", "session_no", "clicks"]
    )
    return sessions[sessions["session_end"] + gap_ms <= watermark]


def check_sessions(home: Path, gap_ms: int = 10_000, lateness_ms: int = 2_000) -> str:
    clicks = read_log(home, "clicks")
    expected = sessions_expected(clicks, gap_ms, lateness_ms)
    got = output(home, "sessions")
    twice = got[got.duplicated(["user", "session_start"], keep=False)]
    assert twice.empty, f"sessions emitted twice:\n{twice.head(10)}"
    columns = ["user", "session_start", "session_end", "clicks", "pages", "session_no"]
    got = got[columns].sort_values(columns[:2]).reset_index(drop=True)
    expected = expected[columns].sort_values(columns[:2]).reset_index(drop=True)
    assert len(got) == len(expected), f"{len(got)} sessions emitted, {len(expected)} expected"
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)
    return f"{len(clicks):,} clicks, {len(expected):,} sessions compared"


def _rising_to(got: pd.DataFrame, key: str | list[str], value: str, expected: pd.Series) -> None:
    """Per ``key`` (a column, or several), the emitted ``value`` rises strictly from epoch to
    epoch (a record counted twice, or an update emitted twice, breaks that) and ends at
    ``expected``."""
    keys = [key] if isinstance(key, str) else key
    got = got.sort_values([*keys, "_epoch"])
    twice = got[got.duplicated([*keys, value], keep=False)]
    assert twice.empty, f"updates emitted twice:\n{twice.head(10)}"
    falling = got.groupby(key)[value].diff() <= 0
    assert not falling.any(), f"{value} going backwards:\n{got[falling].head(10)}"
    final = got.groupby(key)[value].last()
    pd.testing.assert_series_equal(
        final.sort_index(), expected.sort_index(), check_dtype=False, check_names=False
    )


def check_country_clicks(home: Path) -> str:
    """The two-stage pipeline examples/sessions/cutline_sessions/pipelines.py: clicks on pages
    whose number is a multiple of 5 dropped, counted per user, then summed per country (the
    first hex digit of the MD5 of the user name)."""
    clicks = read_log(home, "clicks")
    page = clicks["url"].str.extract(r"^/p/(\d+)$", expand=False).astype("int64")
    kept = clicks[page % 5 != 0].copy()
    kept["country"] = [hashlib.md5(u.encode()).hexdigest()[0] for u in kept["user"]]
    per_user = kept.groupby("user").size()
    users = output(home, "user_clicks")
    _rising_to(users, "user", "clicks", per_user)
    country_of = kept.groupby("user")["country"].first()
    assert (users.groupby("user")["country"].last().sort_index() == country_of.sort_index()).all()
    countries = output(home, "country_clicks")
    _rising_to(countries, "country", "clicks", kept.groupby("country").size())
    final_users = countries.sort_values("_epoch").groupby("country")["users"].last()
    expected_users = kept.groupby("country")["user"].nunique()
    assert final_users.sort_index().tolist() == expected_users.sort_index().tolist()
    return (
        f"{len(clicks):,} clicks, {len(kept):,} kept, {len(per_user):,} users, "
        f"{len(expected_users)} countries, {len(users) + len(countries):,} output rows compared"
    )


def check_page_visits(home: Path) -> str:
    """The composite-key pipeline of examples/sessions/cutline_sessions/pipelines.py: visits per
    (user, url), then per (url, bucket) the sum of the users' latest counts, where the bucket is
    the user name's last character."""
    clicks = read_log(home, "clicks")
    clicks["bucket"] = clicks["user"].str[-1]
    visits = output(home, "page_visits")
    _rising_to(visits, ["user", "url"], "visits", clicks.groupby(["user", "url"]).size())
    totals = output(home, "page_bucket_visits")
    _rising_to(totals, ["url", "bucket"], "visits", clicks.groupby(["url", "bucket"]).size())
    return (
        f"{len(clicks):,} clicks, {clicks.groupby(['user', 'url']).ngroups:,} (user, url) and "
        f"{clicks.groupby(['url', 'bucket']).ngroups} (url, bucket) keys compared"
    )


CHECKS = {
    "clicks_per_user": check_clicks,
    "windowed_revenue": check_windows,
    "enriched_orders": check_enriched,
    "sessions": check_sessions,
    "country_clicks": check_country_clicks,
    "page_visits": check_page_visits,
}
