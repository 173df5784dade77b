"""The checkers themselves (tests/reference.py, tests/epoch_cuts.py, tests/row_check.py): fed the
right output they pass; fed output with one epoch lost, one duplicated, two swapped, one value
off by one, or one enrichment missing or stale, each fails, naming the key, the epoch, what was
expected and what came. No Spark: the input is a generated log cut into epochs here, and the
right output is the reference's own rows (what real runs emit is compared by the end-to-end
tests)."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from deltalake import CommitProperties, write_deltalake

from spark_jobs.sources.generate import generate
from tests.epoch_cuts import EPOCH, EpochCuts, committed_cuts, first_epoch_at_least, watermarks
from tests.reference import (
    REFERENCES,
    compare_outputs,
    expect_windowed_revenue,
    late_orders,
    read_log,
)

EPOCHS = 9  # cut into this many epochs with records, then one empty (a final checkpoint's)
TIMES = {e: 1_000 * e for e in range(EPOCHS + 1)}  # the epochs' planned processing times


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("reference")
    for kind, count in (("clicks", 5_000), ("orders", 5_000), ("profiles", 2_000)):
        generate(home / "log", kind, kind, count=count, seed=3, users=1_500)
    return home


def cut(home, topics: tuple[str, ...]) -> EpochCuts:
    """Each partition of each topic cut into ``EPOCHS`` runs of records, then an empty epoch."""
    ends: dict[int, dict] = {e: {} for e in range(EPOCHS + 1)}
    for topic in topics:
        records = read_log(home, topic)
        for partition, rows in records.groupby("partition"):
            after = (rows["offset"] + rows["raw"].str.len() + 1).to_numpy()
            bounds = np.linspace(0, len(after), EPOCHS + 1).astype(int)[1:]
            for e in range(EPOCHS + 1):
                end = int(after[bounds[min(e, EPOCHS - 1)] - 1])
                ends[e].setdefault(topic, {})[str(partition)] = end
    return EpochCuts(ends, TIMES)


def job_case(home, job: str):
    reference = REFERENCES[job]
    cuts = cut(home, reference.topics)
    inputs = {t: cuts.assign(read_log(home, t), t) for t in reference.topics}
    expected = reference.expect(inputs, cuts.epochs, TIMES) if reference.clocked else None
    expected = expected or reference.expect(inputs, cuts.epochs)
    right = {t: e.rows.sample(frac=1.0, random_state=1) for t, e in expected.items()}
    return inputs, cuts.epochs, expected, right


def fails(job, inputs, epochs, outputs) -> str:
    with pytest.raises(AssertionError) as failure:
        compare_outputs(job, inputs, epochs, outputs, TIMES)
    return str(failure.value)


def names(message: str, key, epoch: int, *fragments: str) -> None:
    """The failure names the key and the epoch on one line, with what it says of them."""
    key_text = repr(key) if not isinstance(key, tuple) else None
    lines = [line for line in re.split(r"; |\n", message) if f"epoch {epoch}:" in line]
    hit = [
        line
        for line in lines
        if (key_text in line if key_text else all(repr(k) in line for k in key))
        and all(f in line for f in fragments)
    ]
    assert hit, f"no line names key {key} epoch {epoch} with {fragments}:\n{message}"


def key_of(row: pd.Series, keys: list[str]):
    values = tuple(v.item() if hasattr(v, "item") else v for v in row[keys])
    return values[0] if len(keys) == 1 else values


@pytest.mark.parametrize("job", list(REFERENCES))
def test_each_fault_in_each_table_fails_naming_key_and_epoch(home, job):
    inputs, epochs, expected, right = job_case(home, job)
    assert compare_outputs(job, inputs, epochs, right, TIMES)
    for table, e in expected.items():
        if e.latest:
            continue  # an upsert sink's table: test_an_upsert_table_behind_...
        rows = right[table]
        assert len(rows) > 50 and rows[EPOCH].nunique() >= 3, (table, len(rows))
        busy = rows[EPOCH].value_counts().sort_index()
        middle = int(busy.index[len(busy) // 2])
        victim = rows[rows[EPOCH] == middle].sort_values(e.keys).iloc[0]
        key = key_of(victim, e.keys)

        lost = {**right, table: rows[rows[EPOCH] != middle]}
        names(fails(job, inputs, epochs, lost), key, middle, "expected {", "got none")

        twice = {**right, table: pd.concat([rows, rows[rows[EPOCH] == middle]])}
        names(fails(job, inputs, epochs, twice), key, middle, "emitted 2 times")

        after = int(busy.index[len(busy) // 2 + 1])
        swap = {middle: after, after: middle}
        swapped = rows.assign(**{EPOCH: rows[EPOCH].replace(swap)})
        names(fails(job, inputs, epochs, {**right, table: swapped}), key, middle, "expected {")

        number = next(c for c in e.values if pd.api.types.is_numeric_dtype(rows[c]))
        off = rows.copy()
        at = off.index[(off[EPOCH] == middle) & (off[e.keys] == victim[e.keys]).all(axis=1)]
        off.loc[at, number] += 1
        was, now = victim[number].item(), victim[number].item() + 1
        message = fails(job, inputs, epochs, {**right, table: off})
        names(message, key, middle, "expected {", f"{number}={was!r}", "got {", f"{number}={now!r}")


def test_an_upsert_table_behind_duplicated_or_off_fails_naming_key_and_epoch(home):
    """``user_totals`` holds each user's latest row: a lost last commit (the rows of the epochs
    before it), a key's row twice or a value off by one each fail, naming key and epoch."""
    job = "country_clicks"
    inputs, epochs, expected, right = job_case(home, job)
    rows, history = right["user_totals"], expected["user_clicks"].rows
    last = int(rows[EPOCH].max())
    assert len(rows) > 50 and rows[EPOCH].nunique() >= 3, "latest rows from several epochs"
    victim = rows[rows[EPOCH] == last].sort_values("user").iloc[0]
    key = victim["user"]

    before = history[history[EPOCH] < last].sort_values(EPOCH).groupby("user").tail(1)
    behind = {**right, "user_totals": before}
    names(fails(job, inputs, epochs, behind), key, last, "expected {", "got none")

    twice = {**right, "user_totals": pd.concat([rows, rows[rows["user"] == key]])}
    names(fails(job, inputs, epochs, twice), key, last, "emitted 2 times")

    off = rows.copy()
    off.loc[off["user"] == key, "clicks"] += 1
    was = int(victim["clicks"])
    message = fails(job, inputs, epochs, {**right, "user_totals": off})
    names(message, key, last, f"clicks={was!r}", f"clicks={was + 1!r}")


def test_an_enrichment_missing_or_stale_fails_naming_the_order(home):
    inputs, epochs, _, right = job_case(home, "enriched_orders")
    rows = right["enriched_orders"]
    profiles = inputs["profiles"]
    enriched = rows[rows["country"].notna()]
    assert 0.3 < len(enriched) / len(rows) < 1.0, "orders with and without a profile"

    order = enriched.iloc[len(enriched) // 2]
    missing = rows.copy()
    missing.loc[missing["order_id"] == order["order_id"], ["country", "tier"]] = None
    message = fails("enriched_orders", inputs, epochs, {"enriched_orders": missing})
    names(message, order["order_id"], order[EPOCH], f"country={order['country']!r}", "got {")

    # stale: an order enriched with an older profile of its user than the latest by event time
    seen = profiles.merge(rows[["order_id", "user", EPOCH]], on="user", suffixes=("", "_order"))
    seen = seen[seen[EPOCH] <= seen[f"{EPOCH}_order"]].merge(
        rows[["order_id", "country", "tier"]], on="order_id", suffixes=("", "_chosen")
    )
    older = seen[
        (seen["country"] != seen["country_chosen"]) | (seen["tier"] != seen["tier_chosen"])
    ].iloc[0]
    stale = rows.copy()
    at = stale["order_id"] == older["order_id"]
    stale.loc[at, ["country", "tier"]] = [older["country"], older["tier"]]
    epoch = int(rows.loc[at, EPOCH].iloc[0])
    message = fails("enriched_orders", inputs, epochs, {"enriched_orders": stale})
    names(message, older["order_id"], epoch, "got {user=")


def test_records_no_committed_epoch_covers_are_reported_lost(home):
    clicks = read_log(home, "clicks")
    cuts = cut(home, ("clicks",))
    short = EpochCuts({e: w for e, w in cuts.ends.items() if e < EPOCHS - 2})
    with pytest.raises(
        AssertionError,
        match=r"records of clicks are in no committed epoch, the "
        r"first at partition 0 offset \d+ \(last committed epoch: 6",
    ):
        short.assign(clicks, "clicks")
    backwards = {**cuts.ends, 4: {"clicks": {"0": 10, "1": 10}}}
    with pytest.raises(AssertionError, match="clicks partition 0: epoch 4 ends at 10, before"):
        EpochCuts(backwards).assign(clicks, "clicks")


def commit(path, rows: int, epochs: dict[int, dict]) -> None:
    info = {"cutline": json.dumps({"attempt": 1, "epochs": {str(e): w for e, w in epochs.items()}})}
    data = pa.table({"user": ["u"] * rows, EPOCH: pa.array([max(epochs)] * rows, pa.int64())})
    write_deltalake(
        path, data, mode="append", commit_properties=CommitProperties(custom_metadata=info)
    )


def test_cuts_come_from_the_sink_commits_since_its_last_reset(tmp_path):
    from deltalake import DeltaTable

    path = str(tmp_path / "sink")
    at = lambda n: {"clicks": {"0": n, "1": n}}  # noqa: E731
    commit(path, 2, {0: at(10), 1: at(20)})
    commit(path, 1, {2: at(30)})
    assert committed_cuts(path).ends == {0: at(10), 1: at(20), 2: at(30)}
    DeltaTable(path).delete()  # a start-over's --reset-sink: the input is read again
    commit(path, 1, {3: at(15)})
    assert committed_cuts(path).ends == {3: at(15)}
    commit(path, 1, {5: at(40)})
    with pytest.raises(AssertionError, match=r"no commit records where epochs \[4\] ended"):
        committed_cuts(path)
    commit(path, 1, {3: at(16), 4: at(20)})
    with pytest.raises(AssertionError, match="epoch 3 committed twice, ending at"):
        committed_cuts(path)


def test_watermarks_and_when_timers_fire():
    records = pd.DataFrame({"ts": [100, 250, 180, 400], EPOCH: [0, 1, 1, 3]})
    marks = watermarks(records, [0, 1, 2, 3, 4], lag_ms=50)
    assert marks.isna().tolist() == [True, False, False, False, False]
    assert marks.tolist()[1:] == [50, 200, 200, 350]
    fire = first_epoch_at_least(marks, pd.Series([10, 50, 51, 200, 350, 351]))
    assert fire.tolist() == [1, 1, 2, 2, 4, -1]


def test_watermarks_per_partition_with_idleness():
    """Partition 1 lags (holds the watermark), goes quiet for the idle time (left out), rejoins
    behind it (never backwards), all go quiet (holds)."""
    ts = [10_000, 10_000, 20_000, 30_000, 40_000, 12_000, 50_000, 45_000]
    records = pd.DataFrame(
        {"ts": ts, "partition": [0, 1, 0, 0, 0, 1, 0, 1], EPOCH: [0, 0, 1, 2, 3, 4, 5, 5]}
    )
    times = {0: 0, 1: 2_000, 2: 4_999, 3: 5_000, 4: 6_000, 5: 7_000, 6: 99_000, 7: 99_001}
    marks = watermarks(records, list(range(8)), 2_000, times, idle_ms=5_000)
    assert marks.tolist()[1:] == [8_000, 8_000, 8_000, 38_000, 38_000, 43_000, 43_000]
    never = watermarks(records, list(range(8)), 2_000, times, idle_ms=None)
    assert never.tolist()[1:] == [8_000, 8_000, 8_000, 8_000, 10_000, 43_000, 43_000]
    global_max = watermarks(records.drop(columns="partition"), list(range(8)), 2_000)
    assert global_max.tolist()[1:] == [8_000, 18_000, 28_000, 38_000, 38_000, 48_000, 48_000]


def test_output_of_the_global_max_rule_fails_when_a_partition_lags(home):
    """Orders of partition 1 delayed by 30 s of event time: under the per-partition rule none is
    late; output computed with the old rule (the global maximum) drops many and fails."""
    inputs, epochs, _, _ = job_case(home, "windowed_revenue")
    orders = inputs["orders"].copy()
    orders.loc[orders["partition"] == 1, "ts"] -= 30_000
    lagged, merged = {"orders": orders}, {"orders": orders.drop(columns="partition")}
    assert late_orders(orders, watermarks(orders, epochs, 2_000, TIMES, 60_000)).empty
    dropped = late_orders(orders, watermarks(merged["orders"], epochs, 2_000))
    assert len(dropped) > 100 and set(dropped["partition"]) == {1}, len(dropped)
    new = expect_windowed_revenue(lagged, epochs, TIMES)["windowed_revenue"].rows
    assert compare_outputs("windowed_revenue", lagged, epochs, {"windowed_revenue": new}, TIMES)
    old = expect_windowed_revenue(merged, epochs, TIMES)["windowed_revenue"].rows
    message = fails("windowed_revenue", lagged, epochs, {"windowed_revenue": old})
    assert "expected {" in message and "got none" in message


def test_records_a_transform_drops_past_the_last_cut_are_not_lost_but_kept_ones_are():
    """A micro-batch's recorded position is after its last record the job's transforms kept:
    clicks on a dropped page at the end of the input lie past every cut and are not lost; a
    kept click there is, and the check names it."""
    cuts = EpochCuts({0: {"clicks": {"0": 100}}})
    clicks = pd.DataFrame(
        {
            "user": ["u1", "u2", "u3"],
            "url": ["/p/7", "/p/7", "/p/10"],  # page 10: dropped by country_clicks' transform
            "ts": [1, 2, 3],
            "partition": [0, 0, 0],
            "offset": [0, 50, 100],
        }
    )
    keep = REFERENCES["country_clicks"].kept["clicks"]
    assert cuts.assign(keep(clicks), "clicks")[EPOCH].tolist() == [0, 0]
    late = clicks.assign(url=["/p/7", "/p/7", "/p/11"])
    with pytest.raises(AssertionError, match=r"1 records of clicks .* partition 0 offset 100"):
        cuts.assign(keep(late), "clicks")
