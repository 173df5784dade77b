"""The Flink peer of the peer benchmark (bench/peer_bench.py): the same per-user aggregation as
Cutline's ``user_activity`` job, as a Flink SQL ``GROUP BY`` that runs until killed.

Runs in a virtualenv of its own (``.venv-flink``: PyFlink pins its own Beam, pandas and pyarrow),
imports nothing of the project and reads the benchmark's records as immutable JSON files
(``<home>/files``, written by bench/peer_input.py beside the log: Flink's filesystem source
does not follow a growing file) through the filesystem source, which discovers new files every
second. State in RocksDB with incremental checkpoints every 3 s, exactly-once, parallelism 2 on
one local task manager, bloom filters and (``--managed-mib``) 256 MiB of managed memory, about
what Cutline's RocksDB has. Sinks:

- ``blackhole``: Flink's blackhole connector (the aggregation and its checkpoints only);
- ``files``: the filesystem sink writing the updates as Debezium JSON, files committed
  exactly-once at each checkpoint (the real sink, as Cutline's Delta table is).

The latest payload by event time is ``MAX`` over the zero-padded event time and the payload
concatenated (exact; Flink SQL has no ``max_by``); mini-batch aggregation is on (Flink's own
advice for a keyed aggregation; one update per key per mini-batch, like a micro-batch). A
restart resumes from the newest retained checkpoint under ``<home>/checkpoints``.

One ``PEER_BATCH`` line per completed checkpoint, from the REST API polled every 0.25 s: the
records its source read since the previous line, the checkpoint's end-to-end duration, the
bytes it uploaded (``checkpointed_size``) and the full state (``state_size``).

    .venv-flink/bin/python bench/peer_flink.py files HOME --rest-port 18081
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from pathlib import Path

EVENT = "PEER_BATCH "  # the Spark peers' progress line too (bench/peer_spark.py)
JVM_UP = "PEER_JVM_UP"  # the JVM is up: bench/peer_bench.py times the restart from it too
SINKS = {
    "blackhole": "'connector' = 'blackhole'",
    "files": "'connector' = 'filesystem', 'path' = '{out}', 'format' = 'debezium-json'",
}


def newest_checkpoint(checkpoints: Path) -> Path | None:
    """The newest completed checkpoint (a ``chk-<n>`` directory with its ``_metadata``)."""
    done = [m.parent for m in checkpoints.glob("*/chk-*/_metadata")]
    return max(done, key=lambda p: p.stat().st_mtime) if done else None


def settings(home: Path, rest_port: int, restore: Path | None, managed_mib: int) -> dict[str, str]:
    conf = {
        "parallelism.default": "2",
        "rest.address": "127.0.0.1",
        "rest.bind-address": "127.0.0.1",
        "rest.port": str(rest_port),
        "state.backend.type": "rocksdb",
        # RocksDB as Cutline's: bloom filters, and by default about its memory (a 64 MiB block
        # cache per Python worker, write buffers beside it); Flink's local default is 128 MiB
        "state.backend.rocksdb.use-bloom-filter": "true",
        "taskmanager.memory.managed.size": f"{managed_mib}m",
        "execution.checkpointing.incremental": "true",
        "execution.checkpointing.interval": "3 s",
        "execution.checkpointing.mode": "EXACTLY_ONCE",
        "execution.checkpointing.dir": (home / "checkpoints").as_uri(),
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        "web.checkpoints.history": "100",
        "metrics.fetcher.update-interval": "500",
        "table.exec.mini-batch.enabled": "true",
        "table.exec.mini-batch.allow-latency": "1 s",
        "table.exec.mini-batch.size": "20000",
    }
    if restore is not None:
        conf["execution.state-recovery.path"] = restore.as_uri()
    return conf


def run(sink: str, home: Path, rest_port: int, managed_mib: int) -> None:
    from pyflink.common import Configuration
    from pyflink.datastream import StreamExecutionEnvironment
    from pyflink.table import StreamTableEnvironment

    restore = newest_checkpoint(home / "checkpoints")
    conf = Configuration()
    for key, value in settings(home, rest_port, restore, managed_mib).items():
        conf.set_string(key, value)
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    print(JVM_UP, "restoring", restore, flush=True)
    tables = StreamTableEnvironment.create(env)
    tables.execute_sql(
        "CREATE TABLE events (`user` STRING, amount DOUBLE, payload STRING, ts BIGINT) WITH ("
        f"'connector' = 'filesystem', 'path' = '{(home / 'files').as_uri()}', "
        "'format' = 'json', 'source.monitor-interval' = '1 s')"
    )
    tables.execute_sql(
        "CREATE TABLE updates (`user` STRING, events BIGINT, amount DOUBLE, payload STRING, "
        f"last_ts BIGINT) WITH ({SINKS[sink].format(out=(home / 'out').as_uri())})"
    )
    job = tables.execute_sql(
        "INSERT INTO updates SELECT `user`, COUNT(*), SUM(amount), "
        "SUBSTRING(MAX(LPAD(CAST(ts AS STRING), 20, '0') || payload) FROM 21), MAX(ts) "
        "FROM events GROUP BY `user`"
    )
    report(str(job.get_job_client().get_job_id()), rest_port)


def report(job_id: str, rest_port: int) -> None:
    """Prints one line per completed checkpoint until the job ends."""
    base = f"http://127.0.0.1:{rest_port}/jobs/{job_id}"
    seen, emitted = -1, 0
    while True:
        time.sleep(0.25)
        job = _get(base)
        if job is None:
            continue
        if job["state"] in ("FAILED", "CANCELED", "FINISHED"):
            raise SystemExit(f"the job ended: {job['state']}")
        source = next(v for v in job["vertices"] if v["name"].startswith("Source"))
        records = int(source["metrics"]["read-records"])  # what the source read
        history = (_get(base + "/checkpoints") or {}).get("history", [])
        done = sorted(
            (c for c in history if c["status"] == "COMPLETED" and c["id"] > seen),
            key=lambda c: c["id"],
        )
        for c in done:
            line = {
                "batch": c["id"],
                "records": records - emitted if c is done[-1] else 0,
                "ms": c["end_to_end_duration"],
                "uploaded_bytes": c["checkpointed_size"],
                "state_bytes": c["state_size"],
            }
            print(EVENT + json.dumps(line), flush=True)
            seen, emitted = c["id"], emitted + line["records"]


def _get(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return json.loads(resp.read())
    except OSError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sink", choices=sorted(SINKS))
    parser.add_argument("home", type=Path)
    parser.add_argument("--rest-port", type=int, required=True)
    parser.add_argument("--managed-mib", type=int, default=256, help="RocksDB's memory, both slots")
    args = parser.parse_args()
    run(args.sink, args.home, args.rest_port, args.managed_mib)


if __name__ == "__main__":
    main()
