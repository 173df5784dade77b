"""Recovery benchmark: restore time on the two-worker standalone cluster (hosts 127.0.0.2 and
127.0.0.3, spark_jobs/deploy/standalone.py) with task-local recovery on and off.

For each ``--state-mib`` size, a job with parallelism 4 whose state is the latest 100-byte payload
of every user (an ``EnrichWithLatest`` table side, so the state is as large as the input says)
runs to the end of its input on the cluster, checkpointing to an S3 server (moto's standalone
server on 127.0.0.1) with local copies on each worker's disk. Then the latest checkpoint is
restored twice, each time as a new attempt placed on the lost attempt's hosts: with local
recovery on (every subtask reads its worker's local copy) and off (every file comes from S3).
The restore times are the ``recoveries`` rows' ``duration_ms``: the placed restore job on the
cluster, from the catalog read to the last subtask's store opened.

Prints progress and writes bench/results/recovery.json.

    .venv/bin/python bench/recovery_bench.py --state-mib 256 1024
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import boto3

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cutline import DeltaSink, JobDefinition, LogSource  # noqa: E402
from cutline.operators import EnrichWithLatest  # noqa: E402
from cutline.sources.log_format import append_records  # noqa: E402
from spark_jobs.catalog.tables import CatalogReader  # noqa: E402
from spark_jobs.deploy.session import build_spark  # noqa: E402
from spark_jobs.deploy.settings import RuntimePaths  # noqa: E402
from spark_jobs.deploy.standalone import StandaloneCluster  # noqa: E402
from spark_jobs.driver.run import run_job  # noqa: E402
from state.config import CheckpointConfig  # noqa: E402
from tests.moto_server import MotoServer  # noqa: E402

JOB = "profile_state"
HOSTS = ("127.0.0.2", "127.0.0.3")
PAYLOAD = 100  # bytes of state per user, beside its key
BYTES_PER_USER = 128  # key, payload and RocksDB's own overhead, as measured at 256 MiB
PARTITIONS = 2  # of the input log
CHUNK = 250_000  # users written per append, and read per partition and micro-batch


def profile_job(local_recovery: bool) -> JobDefinition:
    """The latest payload per user; ``lookups`` (a handful of records) is the stream side."""
    return JobDefinition(
        name=JOB,
        description="Latest 100-byte payload per user (recovery benchmark)",
        sources=(
            LogSource("lookups", "lookups", "user string, ts long"),
            LogSource(
                "profiles",
                "profiles",
                "user string, payload string, ts long",
                max_records_per_partition=CHUNK,
            ),
        ),
        operator=EnrichWithLatest(
            name="latest_payload",
            stream="lookups",
            table="profiles",
            key="user",
            key_type="string",
            fields=("payload",),
            table_time="ts",
        ),
        sink=DeltaSink("out", JOB),
        checkpoint=CheckpointConfig(
            interval_ms=20_000,
            num_retained=1,
            incremental=True,
            local_recovery=local_recovery,
        ),
        parallelism=4,
    )


def write_input(log: Path, users: int) -> None:
    """``users`` distinct users with a random 100-character payload each, over two partitions."""
    for p in range(PARTITIONS):
        append_records(log, "lookups", p, [b'{"user":"u%d","ts":0}' % p])
    for start in range(0, users, CHUNK):
        n = min(CHUNK, users - start)
        payloads = base64.b64encode(os.urandom(n * PAYLOAD * 3 // 4))
        lines = [
            b'{"user":"u%010d","payload":"%s","ts":1}'
            % (start + i, payloads[i * PAYLOAD : (i + 1) * PAYLOAD])
            for i in range(n)
        ]
        append_records(log, "profiles", (start // CHUNK) % PARTITIONS, lines)


def restore(spark, paths: RuntimePaths, hints: dict[str, str], local: bool) -> dict:
    """Restore the latest checkpoint as a new attempt placed by ``hints``; its recoveries row."""
    summary = run_job(
        spark,
        profile_job(local_recovery=local),
        paths,
        restore="latest",
        hints=hints,
        idle_timeout_s=1,
        log=lambda *_: None,
    )
    assert summary.failure is None, summary.failure
    row = CatalogReader(paths.catalog).recoveries(JOB)[-1]
    assert row["attempt"] == summary.attempt
    placement = json.loads(row["placement"])
    assert all(p["host"] == hints[str(p["subtask"])] for p in placement), placement
    expected = "local" if local else "remote"
    assert all(p["source"] == expected for p in placement), placement
    slowest = max(r.duration_ms for r in summary.restore_reports)
    return {
        "restore_s": round(row["duration_ms"] / 1000, 2),
        "slowest_subtask_s": round(slowest / 1000, 2),
        "bytes_local": row["bytes_local"],
        "bytes_remote": row["bytes_remote"],
        "files": row["files_local"] + row["files_remote"],
    }


def bench_size(spark, work: Path, state_mib: int, bucket: str) -> dict:
    home = work / f"{state_mib}mib"
    paths = dataclasses.replace(
        RuntimePaths.under(home), checkpoint_root=f"s3://{bucket}/{state_mib}mib"
    )
    users = state_mib * 2**20 // BYTES_PER_USER
    started = time.perf_counter()
    write_input(Path(paths.log_root), users)
    print(f"{state_mib} MiB: {users:,} users written in {time.perf_counter() - started:.0f} s")

    spread = {str(i): HOSTS[i % 2] for i in range(4)}
    started = time.perf_counter()
    built = run_job(
        spark, profile_job(True), paths, restore=None, hints=spread, idle_timeout_s=3,
        log=lambda *_: None,
    )  # fmt: skip
    assert built.failure is None, built.failure
    assert built.records == users + PARTITIONS, f"read {built.records:,} of {users + PARTITIONS:,}"
    build_s = time.perf_counter() - started
    latest = CatalogReader(paths.catalog).checkpoints(JOB)[-1]
    print(
        f"{state_mib} MiB: built in {build_s:.0f} s ({built.records / build_s:,.0f} records/s), "
        f"checkpoint {latest.checkpoint_id}: {latest.full_size / 2**20:.0f} MiB"
    )
    allocation = json.loads(CatalogReader(paths.catalog).jobs(JOB)[-1]["allocation"])
    runs = {}
    for name, local in (("local", True), ("remote", False)):
        runs[name] = restore(spark, paths, allocation, local)
        print(
            f"{state_mib} MiB: restore with local recovery {'on' if local else 'off'}: {runs[name]}"
        )
    shutil.rmtree(home, ignore_errors=True)
    return {
        "state_mib": state_mib,
        "users": users,
        "checkpoint_bytes": latest.full_size,
        "build_records_per_s": round(built.records / build_s),
        "local": runs["local"],
        "remote": runs["remote"],
        "speedup": round(runs["remote"]["restore_s"] / max(runs["local"]["restore_s"], 1e-3), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-mib", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "recovery.json"))
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="cutline-recovery-"))
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        os.environ.setdefault(name, value)
    moto = MotoServer(work / "moto.stderr").start()
    endpoint = moto.endpoint
    os.environ["AWS_ENDPOINT_URL_S3"] = endpoint  # inherited by the workers' executors
    bucket = "recovery-bench"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    results = []
    try:
        with StandaloneCluster(work / "cluster", hosts=HOSTS) as cluster:
            spark = build_spark(cluster.master_url, "cutline-recovery-bench")
            try:
                for size in args.state_mib:
                    results.append(bench_size(spark, work, size, bucket))
            finally:
                spark.stop()
    finally:
        moto.stop()
        shutil.rmtree(work, ignore_errors=True)
    report = {"hosts": list(HOSTS), "parallelism": 4, "storage": "s3 (moto)", "sizes": results}
    print(json.dumps(report, indent=1))
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
