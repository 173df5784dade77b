"""What the example jobs must output, epoch by epoch, computed from their input logs with pandas
alone.

Independent of Cutline's code paths (no operators, no Arrow group-bys, no Spark): the tests
compare Cutline's Delta output with these answers, never with another Cutline run. The one thing
taken from the run is where each committed epoch ended in the input, as the sinks' commits
record it (tests/epoch_cuts.py): every input record belongs to one committed epoch, and each
job's expected rows follow from the records of the epochs up to theirs:

- ``clicks_per_user``: in each epoch, one row per user with clicks in it: the user's click
  count and latest event time through that epoch;
- ``country_clicks`` (examples/sessions, two stages, three sinks): after the job's filter, per user
  and epoch the running count (and the user's country), per country and epoch the running count
  and the number of distinct users; and in the upsert sink's table, per user its row of the last
  epoch with clicks of theirs (the count, the country and that epoch);
- ``page_visits`` (examples/sessions, composite keys): per (user, url) and per (url, bucket) and
  epoch, the running count;
- ``windowed_revenue``: each window once, in the epoch whose watermark first reaches its end,
  with the count and sum of its orders that were on time when they arrived. The watermark is
  Flink's per-partition rule, modelled here from the records' partitions, the epoch cuts and the
  epochs' planned processing times the commits recorded (tests/epoch_cuts.py ``watermarks``):
  the minimum over the partitions not idle of their largest event time of the epochs before,
  less the allowed lateness;
- ``sessions`` (examples/sessions): each session once, in the epoch whose watermark first passes
  its end by the gap, numbered per user;
- ``enriched_orders``: each order once, in its own epoch, with the fields of its user's latest
  profile by event time (ties: the later epoch, then the later log position) among the profiles of
  the epochs up to the order's;
- ``profiled_clicks`` (examples/sessions, a two-input second stage): in each epoch, one row per
  user with clicks in it: the running count and latest click time, with the fields of the user's
  latest profile as ``enriched_orders`` picks it;
- ``skip_chain`` (tests/chain_jobs.py, a third stage reading the first past the second): in each
  epoch, one row per user with clicks in it: the number of epochs with clicks so far and the
  running count.

Output is compared row by row, (key, epoch) by (key, epoch) (tests/row_check.py), so an epoch
lost, emitted twice, recomputed or reordered fails the check, naming key and epoch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from pyarrow import ipc

from state.storage.tables import table_uri
from tests.epoch_cuts import EPOCH, EpochCuts, committed_cuts, first_epoch_at_least, watermarks
from tests.epoch_cuts import output as read_table
from tests.row_check import compare_rows

IDLE_MS = 60_000  # the jobs' idle_timeout_ms (KeyedProcess's default)

# what makes a record valid, per topic: its key, and its fields of a numeric type
VALID = {
    "clicks": ("user", ["ts"]),
    "orders": ("user", ["ts", "amount"]),
    "profiles": ("user", ["ts", "tier"]),
}


def read_log(home: Path, topic: str, *, bad: bool = False) -> pd.DataFrame:
    """The valid records of a topic of the local log (or, with ``bad``, the others), with
    their partition and offset: in bytes in JSON-lines files, in records in Arrow segments."""
    key, numeric = VALID[topic]
    rows, rejects = [], []
    for directory in sorted(p for p in (home / "log" / topic).glob("partition-*") if p.is_dir()):
        partition, offset = int(directory.name.split("-")[1]), 0
        for path in sorted(directory.glob("*.arrow")):  # named by their first record's offset
            assert int(path.stem) == offset, f"{path}: a gap or an overlap before it"
            for record in ipc.open_file(str(path)).read_all().to_pylist():
                where = {"partition": partition, "offset": offset, "raw": json.dumps(record)}
                offset += 1
                ok = isinstance(record.get(key), str)
                if ok and all(isinstance(record.get(f), int | float) for f in numeric):
                    rows.append({**record, **where})
                else:
                    rejects.append(where)
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
    found = rejects if bad else rows
    return pd.DataFrame(found) if found else pd.DataFrame(columns=["partition", "offset", "raw"])


def before_cut(records: pd.DataFrame, cut: dict[str, int]) -> pd.DataFrame:
    """The records (with partition and offset) read before a checkpoint's cut: its source
    positions, the offset after the last record read in each partition."""
    return records[records["offset"] < records["partition"].astype(str).map(cut).fillna(0)]


def output_root(home: Path) -> str:
    """The output root of a run under ``home`` with the embedded default."""
    return str(home / "warehouse" / "tables")


def output(home: Path, table: str, root: str | None = None) -> pd.DataFrame:
    return read_table(table_uri(root or output_root(home), table))


@dataclass(frozen=True)
class Expected:
    """One sink table's expected rows (with ``_epoch``), its key and its value columns."""

    rows: pd.DataFrame
    keys: list[str]
    values: list[str]
    approx: tuple[str, ...] = ()  # sums of floats: their order may differ
    latest: bool = False  # an upsert sink's table: each key's latest row, with its epoch


def _running(rows: pd.DataFrame, keys: list[str], sums: list[str], maxes: list[str] = ()):
    """Per key, the running sums and maxima of per-epoch figures, in epoch order."""
    rows = rows.sort_values([*keys, EPOCH]).reset_index(drop=True)
    grouped = rows.groupby(keys, sort=False)
    for c in sums:
        rows[c] = grouped[c].cumsum()
    for c in maxes:
        rows[c] = grouped[c].cummax()
    return rows


def expect_clicks_per_user(inputs: dict[str, pd.DataFrame], epochs: list[int]) -> dict:
    clicks = inputs["clicks"]
    per = clicks.groupby(["user", EPOCH]).agg(clicks=("ts", "size"), last_ts=("ts", "max"))
    rows = _running(per.reset_index(), ["user"], ["clicks"], ["last_ts"])
    return {"clicks_per_user": Expected(rows, ["user"], ["clicks", "last_ts"])}


def kept_clicks(clicks: pd.DataFrame) -> pd.DataFrame:
    """examples/sessions' ``parse`` transform: clicks on every fifth page dropped; the country
    is the first hex digit of the MD5 of the user name."""
    page = clicks["url"].str.extract(r"^/p/(\d+)$", expand=False).astype("int64")
    kept = clicks[page % 5 != 0].copy()
    kept["country"] = [hashlib.md5(u.encode()).hexdigest()[0] for u in kept["user"]]
    return kept


def expect_country_clicks(inputs: dict[str, pd.DataFrame], epochs: list[int]) -> dict:
    kept = kept_clicks(inputs["clicks"])
    users = kept.groupby(["user", EPOCH]).agg(clicks=("ts", "size"), country=("country", "last"))
    users = _running(users.reset_index(), ["user"], ["clicks"])
    countries = kept.groupby(["country", EPOCH]).agg(clicks=("ts", "size")).reset_index()
    joined = kept.groupby(["country", "user"])[EPOCH].min().reset_index()
    new = joined.groupby(["country", EPOCH]).size().rename("users").reset_index()
    countries = countries.merge(new, on=["country", EPOCH], how="left").fillna({"users": 0})
    countries = _running(countries, ["country"], ["clicks", "users"])
    latest = users.sort_values(EPOCH).groupby("user").tail(1)
    return {
        "user_clicks": Expected(users, ["user"], ["clicks", "country"]),
        "country_clicks": Expected(countries, ["country"], ["clicks", "users"]),
        "user_totals": Expected(latest, ["user"], ["clicks", "country"], latest=True),
    }


def expect_page_visits(inputs: dict[str, pd.DataFrame], epochs: list[int]) -> dict:
    clicks = inputs["clicks"].assign(bucket=lambda c: c["user"].str[-1])
    visits = clicks.groupby(["user", "url", EPOCH]).agg(
        visits=("ts", "size"), bucket=("bucket", "last")
    )
    visits = _running(visits.reset_index(), ["user", "url"], ["visits"])
    totals = clicks.groupby(["url", "bucket", EPOCH]).agg(visits=("ts", "size")).reset_index()
    totals = _running(totals, ["url", "bucket"], ["visits"])
    return {
        "page_visits": Expected(visits, ["user", "url"], ["visits", "bucket"]),
        "page_bucket_visits": Expected(totals, ["url", "bucket"], ["visits"]),
    }


def expect_windowed_revenue(
    inputs: dict[str, pd.DataFrame],
    epochs: list[int],
    times: dict[int, int] | None = None,
    *,
    window_ms: int = 10_000,
    lateness_ms: int = 2_000,
    idle_ms: int | None = IDLE_MS,
    table: str = "windowed_revenue",
) -> dict:
    """``times``: the epochs' planned processing times (None: no partition goes idle)."""
    orders = inputs["orders"].copy()
    marks = watermarks(orders, epochs, lateness_ms, times, idle_ms)
    orders["window_start"] = orders["ts"] - orders["ts"] % window_ms
    mark_then = orders[EPOCH].map(marks)
    on_time = mark_then.isna() | (orders["window_start"] + window_ms - 1 > mark_then)
    windows = (
        orders[on_time]
        .groupby(["user", "window_start"])
        .agg(orders=("ts", "size"), revenue=("amount", "sum"))
        .reset_index()
    )
    windows["window_end"] = windows["window_start"] + window_ms
    windows[EPOCH] = first_epoch_at_least(marks, windows["window_end"] - 1)
    windows = windows[windows[EPOCH] >= 0]
    return {
        table: Expected(
            windows, ["user", "window_start"], ["window_end", "orders", "revenue"], ("revenue",)
        )
    }


def late_orders(orders: pd.DataFrame, marks: pd.Series, window_ms: int = 10_000) -> pd.DataFrame:
    """The orders (with ``_epoch``) whose window the watermark of their epoch (``marks``) had
    already closed: the ones a window drops."""
    start = orders["ts"] - orders["ts"] % window_ms
    return orders[start + window_ms - 1 <= orders[EPOCH].map(marks)]


def sessions_of(clicks: pd.DataFrame, gap_ms: int) -> pd.DataFrame:
    """Per user, runs of clicks less than ``gap_ms`` apart in event time, numbered per user."""
    rows = []
    for user, ts_pages in clicks.sort_values("ts", kind="stable").groupby("user"):
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
    return pd.DataFrame(
        rows, columns=["user", "session_start", "session_end", "pages", "session_no", "clicks"]
    )


def expect_sessions(
    inputs: dict[str, pd.DataFrame],
    epochs: list[int],
    times: dict[int, int] | None = None,
    gap_ms: int = 10_000,
    lateness_ms: int = 2_000,
    idle_ms: int | None = IDLE_MS,
) -> dict:
    """Sessions close when the watermark passes their last click by the gap. The reference
    models no late click (one behind the watermark when it arrives, which could not join the
    session it belongs to): it refuses input that has one."""
    clicks = inputs["clicks"]
    marks = watermarks(clicks, epochs, lateness_ms, times, idle_ms)
    late = clicks[clicks["ts"] < clicks[EPOCH].map(marks)]
    if not late.empty:
        raise AssertionError(f"the input has {len(late):,} late clicks; the reference has none")
    sessions = sessions_of(clicks, gap_ms)
    sessions[EPOCH] = first_epoch_at_least(marks, sessions["session_end"] + gap_ms)
    sessions = sessions[sessions[EPOCH] >= 0]
    values = ["session_end", "clicks", "pages", "session_no"]
    return {"sessions": Expected(sessions, ["user", "session_start"], values)}


def with_latest_profile(rows: pd.DataFrame, profiles: pd.DataFrame) -> pd.DataFrame:
    """``rows`` (with ``user`` and ``_epoch``) with ``country`` and ``tier`` of the user's latest
    profile by event time (ties: the later epoch, then the later log position) among the
    profiles of the epochs up to the row's; none: null."""
    # the order in which a profile supersedes another: event time, then arrival
    ranked = profiles.sort_values(["ts", EPOCH, "partition", "offset"]).reset_index(drop=True)
    ranked["rank"] = np.arange(len(ranked), dtype=np.float64)
    best = ranked.groupby(["user", EPOCH])["rank"].max().reset_index().sort_values(EPOCH)
    best["rank"] = best.groupby("user")["rank"].cummax()
    rows = pd.merge_asof(rows.sort_values(EPOCH), best, on=EPOCH, by="user", direction="backward")
    chosen = ranked.reindex(rows["rank"].fillna(-1).astype(int))
    rows["country"] = chosen["country"].to_numpy()
    rows["tier"] = pd.array(chosen["tier"].to_numpy(), dtype="Int64")
    return rows.drop(columns=["rank"])


def expect_enriched_orders(inputs: dict[str, pd.DataFrame], epochs: list[int]) -> dict:
    rows = with_latest_profile(inputs["orders"], inputs["profiles"])
    values = ["user", "amount", "ts", "country", "tier"]
    return {"enriched_orders": Expected(rows, ["order_id"], values)}


def expect_profiled_clicks(inputs: dict[str, pd.DataFrame], epochs: list[int]) -> dict:
    clicks = inputs["clicks"]
    per = clicks.groupby(["user", EPOCH]).agg(clicks=("ts", "size"), ts=("ts", "max"))
    rows = _running(per.reset_index(), ["user"], ["clicks"], ["ts"])
    rows = with_latest_profile(rows, inputs["profiles"])
    return {"profiled_clicks": Expected(rows, ["user"], ["clicks", "ts", "country", "tier"])}


def expect_skip_chain(inputs: dict[str, pd.DataFrame], epochs: list[int]) -> dict:
    per = inputs["clicks"].groupby(["user", EPOCH]).agg(clicks=("ts", "size")).reset_index()
    rows = _running(per.assign(updates=1), ["user"], ["clicks", "updates"])
    return {"skip_chain": Expected(rows, ["user"], ["updates", "clicks"])}


@dataclass(frozen=True)
class JobReference:
    """A job's input topics (its sources' names), its sink tables, and their expected rows."""

    topics: tuple[str, ...]
    tables: tuple[str, ...]
    expect: Callable[..., dict[str, Expected]]  # (inputs, epochs[, times]) -> per table
    clocked: bool = False  # event time: expect takes the epochs' processing times too
    # per topic, the records the job's transforms keep: only those are placed in epochs (the
    # position a micro-batch records is after its last kept record, so records a transform
    # drops at the very end of the input lie past every recorded cut, and are not lost)
    kept: dict[str, Callable[[pd.DataFrame], pd.DataFrame]] = field(default_factory=dict)


REFERENCES = {
    "clicks_per_user": JobReference(("clicks",), ("clicks_per_user",), expect_clicks_per_user),
    "windowed_revenue": JobReference(
        ("orders",), ("windowed_revenue",), expect_windowed_revenue, clocked=True
    ),
    "enriched_orders": JobReference(
        ("orders", "profiles"), ("enriched_orders",), expect_enriched_orders
    ),
    "sessions": JobReference(("clicks",), ("sessions",), expect_sessions, clocked=True),
    "country_clicks": JobReference(
        ("clicks",),
        ("user_clicks", "country_clicks", "user_totals"),
        expect_country_clicks,
        kept={"clicks": kept_clicks},
    ),
    "page_visits": JobReference(
        ("clicks",), ("page_visits", "page_bucket_visits"), expect_page_visits
    ),
    "profiled_clicks": JobReference(
        ("clicks", "profiles"), ("profiled_clicks",), expect_profiled_clicks
    ),
    "skip_chain": JobReference(("clicks",), ("skip_chain",), expect_skip_chain),
    # clicks_per_user on a directory of files (tests/file_jobs.py): its input is not the log
    "file_clicks": JobReference(("clicks",), ("clicks_per_user",), expect_clicks_per_user),
}


def _all(records: pd.DataFrame) -> pd.DataFrame:
    return records


def compare_outputs(
    job: str,
    inputs: dict[str, pd.DataFrame],
    epochs: list[int],
    outputs: dict[str, pd.DataFrame],
    times: dict[int, int] | None = None,
) -> str:
    """Fail unless every sink table of ``job`` holds exactly the expected rows, epoch by epoch;
    ``inputs`` carry each record's committed epoch, ``times`` are the epochs' planned
    processing times (needed by jobs with event time). Returns a summary."""
    reference = REFERENCES[job]
    if reference.clocked:
        expected = reference.expect(inputs, epochs, clock_of(epochs, times))
    else:
        expected = reference.expect(inputs, epochs)
    lines = [
        compare_rows(outputs[table], e.rows, e.keys, e.values, table, approx=e.approx)
        for table, e in expected.items()
    ]
    records = ", ".join(f"{len(frame):,} {topic}" for topic, frame in inputs.items())
    return f"{records} in {len(epochs)} epochs; " + "; ".join(lines)


def clock_of(epochs: list[int], times: dict[int, int] | None) -> dict[int, int]:
    """``times`` after failing unless it has every epoch's: lateness cannot be modelled
    without."""
    missing = [e for e in epochs if e not in (times or {})]
    if missing:
        raise AssertionError(f"no commit records the processing time of epochs {missing[:5]}")
    return dict(times or {})


def job_cuts(home: Path, tables: list[str], root: str | None = None) -> EpochCuts:
    """The committed epochs of a job with these sink tables (each table records the epochs its
    commits covered, and their processing times; they must agree)."""
    ends: dict[int, dict] = {}
    times: dict[int, int] = {}
    for table in tables:
        cuts = committed_cuts(table_uri(root or output_root(home), table))
        for epoch, where in cuts.ends.items():
            if ends.setdefault(epoch, where) != where:
                raise AssertionError(f"{table}: epoch {epoch} ended at {where}, not {ends[epoch]}")
        for epoch, ms in cuts.times.items():
            if times.setdefault(epoch, ms) != ms:
                raise AssertionError(f"{table}: epoch {epoch} planned at {ms}, not {times[epoch]}")
    if not ends:
        raise AssertionError(f"{tables}: no committed epoch")
    return EpochCuts(ends, times).contiguous(", ".join(tables))


def check(
    job: str,
    home: Path,
    root: str | None = None,
    read: Callable[[str], pd.DataFrame] | None = None,
) -> str:
    """Fail unless ``job``'s output in ``home`` (its tables under ``root``, default the
    embedded one under ``home``) is exactly the reference's (see the module docstring); returns
    a summary. ``read``: a topic's records with partition and offset (default: the valid
    records of the local log under ``home``)."""
    reference = REFERENCES[job]
    tables = list(reference.tables)
    cuts = job_cuts(home, tables, root)
    read = read or (lambda topic: read_log(home, topic))
    keep = reference.kept
    inputs = {t: cuts.assign(keep.get(t, _all)(read(t)), t) for t in reference.topics}
    outputs = {table: output(home, table, root) for table in tables}
    return compare_outputs(job, inputs, cuts.epochs, outputs, cuts.times)
