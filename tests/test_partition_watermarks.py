"""Per-partition watermarks on Spark (tests/watermark_jobs.py): a windowed job reads two live
partitions, partition 1 producing 30 s of event time behind partition 0 (the bound is 2 s), then
partition 1 stops while partition 0 goes on. Under the per-partition rule no record is late and
the output is exactly the reference's (tests/reference.py, its watermarks computed with pandas
from the records' partitions, the epoch cuts and the epochs' processing times the commits
recorded); the old rule (the largest event time over all partitions) would have dropped most
of partition 1, which the test computes and prints; and the idle partition does not stall the
windows."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from tests.e2e_util import cutline, finish, report
from tests.epoch_cuts import watermarks
from tests.reference import expect_windowed_revenue, job_cuts, late_orders, output, read_log
from tests.row_check import compare_rows
from tests.watermark_jobs import BOUND_MS, IDLE_MS, TABLE, WINDOW_MS

pytestmark = [pytest.mark.slow, pytest.mark.spark]

JOB = "tests.watermark_jobs:lagging_revenue"
BASE, STEP_MS, LAG_MS = 1_700_000_000_000, 20, 30_000  # partition 1: 30 s behind partition 0
BLOCK = 250  # records per partition per append


class Producer:
    """Appends orders to ``partition-<p>.jsonl``, whole lines at once, event times rising by
    ``STEP_MS`` per record (partition 1 ``LAG_MS`` behind)."""

    def __init__(self, home: Path) -> None:
        self.root = home / "log" / "orders"
        self.root.mkdir(parents=True, exist_ok=True)
        self.count = {0: 0, 1: 0}

    def append(self, partition: int, n: int = BLOCK) -> None:
        lines = []
        for _ in range(n):
            i = self.count[partition]
            ts = BASE + i * STEP_MS - (LAG_MS if partition else 0)
            order = {"order_id": f"{partition}-{i}", "user": f"u{i % 40}", "amount": i % 7 + 0.5}
            lines.append(json.dumps({**order, "ts": ts}) + "\n")
            self.count[partition] = i + 1
        with open(self.root / f"partition-{partition}.jsonl", "a") as f:
            f.write("".join(lines))


def first_commit(home: Path, timeout_s: float = 180) -> None:
    """Wait until the job's first checkpoint committed its sink (the micro-batches run)."""
    log = home / "warehouse" / "tables" / TABLE / "_delta_log"
    deadline = time.monotonic() + timeout_s
    while len(list(log.glob("*.json"))) < 2:
        assert time.monotonic() < deadline, "the job committed nothing"
        time.sleep(0.2)


def test_a_lagging_partition_loses_nothing_and_an_idle_one_stalls_no_window(tmp_path):
    home = tmp_path / "home"
    producer = Producer(home)
    for partition in (0, 1):
        producer.append(partition, 2 * BLOCK)
    run = ["run", JOB, "--idle-timeout", "4", "--interval-ms", "1000"]
    proc = cutline(home, *run, "--max-records-per-partition", "500")

    def produce() -> None:
        first_commit(home)
        for _ in range(12):  # 3 s: both partitions live, partition 1 behind
            producer.append(0)
            producer.append(1)
            time.sleep(0.25)
        for _ in range(24):  # 6 s: partition 1 idle (the job's idle time: 1.5 s)
            producer.append(0)
            time.sleep(0.25)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    thread.join(timeout=240)
    assert finish(proc, timeout=120) == 0, (home / "driver.log").read_text()[-4000:]

    cuts = job_cuts(home, [TABLE])
    orders = cuts.assign(read_log(home, "orders"), "orders")
    assert len(orders) == producer.count[0] + producer.count[1]
    epochs, times = cuts.epochs, cuts.times
    per_partition = watermarks(orders, epochs, BOUND_MS, times, IDLE_MS)
    global_max = watermarks(orders.drop(columns="partition"), epochs, BOUND_MS)
    late_now = late_orders(orders, per_partition, WINDOW_MS)
    late_before = late_orders(orders, global_max, WINDOW_MS)
    report(
        f"{len(orders):,} orders in {len(epochs)} epochs; late under the per-partition rule: "
        f"{len(late_now):,}; under the old global-max rule: {len(late_before):,} "
        f"(of partition 1's {producer.count[1]:,})"
    )
    assert late_now.empty
    assert len(late_before) > producer.count[1] // 2 and set(late_before["partition"]) == {1}

    expected = expect_windowed_revenue(
        {"orders": orders}, epochs, times, window_ms=WINDOW_MS, lateness_ms=BOUND_MS,
        idle_ms=IDLE_MS, table=TABLE,
    )[TABLE]  # fmt: skip
    got = output(home, TABLE)
    report(
        compare_rows(got, expected.rows, expected.keys, expected.values, TABLE, approx=("revenue",))
    )
    assert got["orders"].sum() == expected.rows["orders"].sum()

    # partition 1's last record is far behind partition 0's: had it kept holding the watermark
    # after it went idle, no window past it would have closed
    last_lagging = orders.loc[orders["partition"] == 1, "ts"].max()
    stalled = watermarks(orders, epochs, BOUND_MS, times, idle_ms=None)
    beyond = got[got["window_start"] > last_lagging]
    report(
        f"{len(got):,} windows emitted, {len(beyond):,} of them past the idle partition's last "
        f"event time (a partition never idle would have held the watermark at "
        f"{int(stalled.max()) - BASE:,} ms, behind all of them)"
    )
    assert len(beyond) > 0 and stalled.max() < last_lagging
