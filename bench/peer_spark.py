"""The Spark peers of the peer benchmark (bench/peer_bench.py): the same per-user aggregation
as Cutline's ``user_activity`` job, as a Spark Structured Streaming query that runs until killed.

- ``spark_sql``: ``groupBy().agg(count, sum, max_by(payload, ts), max(ts))``;
- ``spark_python``: Spark's first Python stateful API (``applyInPandasWithState``);
- ``spark_tws``: Spark 4's Python stateful API (``transformWithStateInPandas``, a
  ``StatefulProcessor`` with one value state per user).

Both read the benchmark's log through ``cutline_log``, keep their state in the RocksDB state store
with changelog checkpointing, write their updates to Delta through ``foreachBatch`` (idempotent
by ``txnVersion``) and print one ``PEER_BATCH`` line per micro-batch.

    python bench/peer_spark.py spark_sql HOME --batch-records 100000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyspark.sql.streaming.stateful_processor import StatefulProcessor  # noqa: E402

from bench.peer_input import PARTITIONS, SCHEMA, TOPIC  # noqa: E402

EVENT = "PEER_BATCH "  # a Spark peer's progress line
# The JVM's tiered JIT with C2 for methods ten times hotter than its defaults: Cutline's driver
# options until 2026-12-07 (a faster start than the defaults on two cores), the Spark peers' since
# their first run; after Cutline's C1 alone, so the last of the conflicting options wins.
LATE_C2 = " ".join((
    "-XX:TieredStopAtLevel=4",
    "-XX:Tier4InvocationThreshold=50000",
    "-XX:Tier4MinInvocationThreshold=6000",
    "-XX:Tier4CompileThreshold=150000",
    "-XX:Tier4BackEdgeThreshold=400000",
))  # fmt: skip


def spark_worker(system: str, home: Path, batch_records: int) -> None:
    """A Spark driver running ``system``'s query until killed; prints one line per batch."""
    from pyspark.sql import functions as F

    from cutline.sources.log import register_data_source
    from spark_jobs.deploy.session import build_spark

    spark = build_spark(
        "local[2]",
        f"peer-{system}",
        shuffle_partitions=2,
        delta=True,  # the peer writes its output with delta-spark
        extra={
            # the tiered JIT the peers have always run with, not Cutline's C1 alone: their JVM
            # does the state's work (the aggregation, the RocksDB state store)
            "spark.driver.extraJavaOptions": LATE_C2,
            "spark.sql.streaming.stateStore.providerClass": "org.apache.spark.sql.execution."
            "streaming.state.RocksDBStateStoreProvider",
            "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        },
    )
    register_data_source(spark)
    events = (
        spark.readStream.format("cutline_log")
        .schema(f"{SCHEMA}, _partition int, _next_offset long")
        .option("path", str(home / "log"))
        .option("topic", TOPIC)
        .option("partitions", json.dumps(list(range(PARTITIONS))))
        .option("maxRecordsPerPartition", str(batch_records))
        .load()
        .select("user", "amount", "payload", "ts")
    )
    state_schema = "events long, amount double, last_ts long, payload string"
    out_schema = "user string, events long, amount double, payload string, last_ts long"
    if system == "spark_sql":
        updates = events.groupBy("user").agg(
            F.count(F.lit(1)).alias("events"),
            F.sum("amount").alias("amount"),
            F.max_by("payload", "ts").alias("payload"),
            F.max("ts").alias("last_ts"),
        )
    elif system == "spark_tws":
        updates = events.groupBy("user").transformWithStateInPandas(
            LatestPerUser(state_schema), out_schema, "Update", "None"
        )
    else:
        from pyspark.sql.streaming.state import GroupStateTimeout

        updates = events.groupBy("user").applyInPandasWithState(
            _latest_per_user, out_schema, state_schema, "Update", GroupStateTimeout.NoTimeout
        )
    table = str(home / "warehouse" / "tables" / system)

    def write(batch, batch_id: int) -> None:
        # Delta skips an append whose txnVersion it has seen (a batch replayed after a restart),
        # and Spark 4.2 then fails the batch because its state stores were never evaluated
        # (STATE_STORE_COMMIT_VALIDATION_FAILED): materialise the batch first.
        batch = batch.persist()
        batch.count()
        (
            batch.write.format("delta")
            .mode("append")
            .option("txnAppId", system)
            .option("txnVersion", batch_id)
            .save(table)
        )
        batch.unpersist()

    query = (
        updates.writeStream.outputMode("update")
        .foreachBatch(write)
        .option("checkpointLocation", str(home / "checkpoints"))
        .start()
    )
    reported = -1
    while query.isActive:
        for p in query.recentProgress:
            if p["batchId"] > reported:
                reported = p["batchId"]
                state = (p.get("stateOperators") or [{}])[0]
                line = {
                    "batch": p["batchId"],
                    "records": p["numInputRows"],
                    "ms": p["durationMs"].get("triggerExecution"),
                    "state_rows": state.get("numRowsTotal"),
                    "state_memory_bytes": state.get("memoryUsedBytes"),
                }
                print(EVENT + json.dumps(line), flush=True)
        time.sleep(0.1)
    raise SystemExit(f"the query stopped: {query.exception()}")


def _fold(start: tuple, frames) -> tuple:
    """A user's (events, amount, last_ts, payload) after ``frames``: count, sum and the latest
    payload by event time."""
    events, amount, last_ts, payload = start
    for pdf in frames:
        events += len(pdf)
        amount += float(pdf["amount"].sum())
        i = int(pdf["ts"].to_numpy().argmax())
        if int(pdf["ts"].iat[i]) >= last_ts:
            last_ts, payload = int(pdf["ts"].iat[i]), pdf["payload"].iat[i]
    return events, amount, last_ts, payload


def _row(user: str, folded: tuple):
    import pandas as pd

    events, amount, last_ts, payload = folded
    return pd.DataFrame(
        {"user": [user], "events": [events], "amount": [amount], "payload": [payload],
         "last_ts": [last_ts]}
    )  # fmt: skip


EMPTY = (0, 0.0, -(2**63), None)


def _latest_per_user(key, frames, state):
    """applyInPandasWithState's function."""
    folded = _fold(state.get if state.exists else EMPTY, frames)
    state.update(folded)
    yield _row(key[0], folded)


class LatestPerUser(StatefulProcessor):
    """transformWithStateInPandas's processor: one value state per user."""

    def __init__(self, schema: str) -> None:
        self.schema = schema

    def init(self, handle) -> None:
        self.state = handle.getValueState("latest", self.schema)

    def handleInputRows(self, key, rows, timerValues):
        folded = _fold(tuple(self.state.get()) if self.state.exists() else EMPTY, rows)
        self.state.update(folded)
        yield _row(key[0], folded)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("system", choices=["spark_sql", "spark_python", "spark_tws"])
    parser.add_argument("home", type=Path)
    parser.add_argument("--batch-records", type=int, required=True)
    args = parser.parse_args()
    spark_worker(args.system, args.home, args.batch_records)


if __name__ == "__main__":
    main()
