"""Snapshot benchmark: incremental checkpoint size, sync/async time, local vs remote restore.

Builds keyed state of ``--state-mib`` MiB in one subtask's RocksDB store (100-byte values), then
takes ``--checkpoints`` checkpoints, changing the fraction ``--churn`` of the keys before each.
Uploads go to an S3 server (moto's standalone server, started on 127.0.0.1 unless
``--s3-endpoint`` is given) and to a local directory, one after the other in one invocation
(``--storage both``, the default), or to one of them. On S3 it counts the requests each
checkpoint made, by S3 operation (what object storage bills).

Prints progress, then one JSON object per storage with full_bytes_median,
incremental_bytes_median, sync_ms_median, sync_ms_p95, async_ms_median, restore_local_s,
restore_remote_s and, on S3, requests_per_checkpoint; each is written to
``bench/results/snapshot_<N>mib_<storage>.json``.

    .venv/bin/python bench/snapshot_bench.py --state-mib 100 --churn 0.01 --checkpoints 20
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from state.keygroups import DEFAULT_MAX_PARALLELISM, KeyGroupRange, key_groups  # noqa: E402
from state.local_copies import LocalCopies  # noqa: E402
from state.paths import JobLayout  # noqa: E402
from state.restore import restore_subtask  # noqa: E402
from state.rocksdb_store import RocksDBStore  # noqa: E402
from state.snapshot import SubtaskSnapshotter  # noqa: E402
from state.storage import DurableStorage, LocalFileStorage, S3Storage  # noqa: E402
from tests.moto_server import MotoServer  # noqa: E402

KEY_BYTES = 16
VALUE_BYTES = 100
JOB = "bench"


class RequestCounter:
    """Counts the S3 requests a boto3 client makes, by operation (retries included)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()

    def __call__(self, model, **_: object) -> None:
        self.counts[model.name] += 1


def open_bench_storage(
    storage: str, args: argparse.Namespace, work: Path
) -> tuple[DurableStorage, object, RequestCounter | None]:
    if storage == "local":
        return LocalFileStorage(work / "remote"), None, None
    proc = None
    endpoint = args.s3_endpoint
    if endpoint is None:
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        proc = MotoServer(work / "moto.stderr").start()
        endpoint = proc.endpoint
    import boto3
    from botocore.config import Config

    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    counter = RequestCounter()
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        config=Config(retries={"mode": "standard", "total_max_attempts": 8}),
    )
    client.meta.events.register("before-call.s3", counter)
    return S3Storage(bucket, "checkpoints", client=client), proc, counter


def write_keys(store: RocksDBStore, ids: np.ndarray, batch: int) -> None:
    """Set every key in ``ids`` to a fresh random 100-byte value, ``batch`` keys per write batch
    (one write batch is what one subtask commits per micro-batch)."""
    for start in range(0, len(ids), batch):
        chunk = ids[start : start + batch]
        keys = [b"%016d" % i for i in chunk.tolist()]
        groups = key_groups(keys, "binary", DEFAULT_MAX_PARALLELISM)
        noise = os.urandom(VALUE_BYTES * len(keys))
        values = [noise[i * VALUE_BYTES : (i + 1) * VALUE_BYTES] for i in range(len(keys))]
        txn = store.begin()
        txn.put("v", groups, keys, values)
        txn.commit()


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-mib", type=int, default=100)
    parser.add_argument("--churn", type=float, default=0.01)
    parser.add_argument("--checkpoints", type=int, default=20)
    parser.add_argument("--storage", choices=["both", "s3", "local"], default="both")
    parser.add_argument("--s3-endpoint", default=None)
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--batch-keys",
        type=int,
        default=20_000,
        help="keys per write batch, i.e. per micro-batch of the subtask (default 20000)",
    )
    args = parser.parse_args()
    results = [
        run(args, storage)
        for storage in (["s3", "local"] if args.storage == "both" else [args.storage])
    ]
    if len(results) == 2:
        print(f"\n{'':<26} {'s3':>10} {'local':>10}")
        for key in (
            "incremental_bytes_median",
            "sync_ms_median",
            "async_ms_median",
            "restore_local_s",
            "restore_remote_s",
        ):
            print(f"{key:<26} {results[0][key]:>10} {results[1][key]:>10}")  # fmt: skip
        print(f"S3 requests per checkpoint (median): {results[0]['requests_per_checkpoint']}")


def run(args: argparse.Namespace, storage_kind: str) -> dict:
    """One benchmark run against ``storage_kind``; prints and writes its result."""
    work = Path(args.workdir or tempfile.mkdtemp(prefix="cutline-bench-")) / storage_kind
    work.mkdir(parents=True, exist_ok=True)
    storage, server, counter = open_bench_storage(storage_kind, args, work)
    rng = np.random.default_rng(args.seed)
    n_keys = args.state_mib * 2**20 // (KEY_BYTES + VALUE_BYTES)
    churn_keys = max(1, int(n_keys * args.churn))
    kg_range = KeyGroupRange(0, DEFAULT_MAX_PARALLELISM - 1)
    copies = LocalCopies(work / "local", JOB, "bench", 0)
    pool = ThreadPoolExecutor(1)
    snapshotter = SubtaskSnapshotter(
        storage, copies, JOB, "bench", 0, incremental=True, local_recovery=True, executor=pool
    )
    try:
        store = RocksDBStore(copies.db_dir, kg_range)
        t0 = time.perf_counter()
        write_keys(store, np.arange(n_keys), 200_000)
        store.compact()
        print(f"built {n_keys:,} keys in {time.perf_counter() - t0:.1f}s", flush=True)

        handle = snapshotter.snapshot(store, 0, None).result()
        copies.confirm(0)
        print(f"initial full checkpoint: {handle.full_size / 2**20:.1f} MiB", flush=True)
        full, incremental, sync_ms, async_ms = [], [], [], []
        requests: list[collections.Counter[str]] = []
        for n in range(1, args.checkpoints + 1):
            write_keys(store, rng.choice(n_keys, churn_keys, replace=False), args.batch_keys)
            before = collections.Counter(counter.counts) if counter else None
            handle = snapshotter.snapshot(store, n, handle).result()
            copies.confirm(n)
            if counter:
                requests.append(counter.counts - before)
            full.append(handle.full_size)
            incremental.append(handle.uploaded_bytes)
            sync_ms.append(handle.sync_ms)
            async_ms.append(handle.async_ms)
            print(
                f"chk {n:3d}: full {handle.full_size / 2**20:8.1f} MiB  "
                f"uploaded {handle.uploaded_bytes / 2**20:8.2f} MiB  files {len(handle.files):3d}  "
                f"sync {handle.sync_ms:6.1f} ms  async {handle.async_ms:8.1f} ms",
                flush=True,
            )
        store.close()

        layout = JobLayout(JOB)
        local = restore_subtask(handle, storage, layout, copies.db_dir, copies)
        assert local.source == "local", local
        remote_target = work / "remote-restore" / "db"
        remote = restore_subtask(handle, storage, layout, remote_target, None)
        assert remote.source == "remote", remote
        with RocksDBStore(remote_target, kg_range) as check:
            probe = [b"%016d" % i for i in range(0, n_keys, max(1, n_keys // 1000))]
            groups = key_groups(probe, "binary")
            assert all(v is not None for v in check.get_many("v", groups, probe))

        result = {
            "state_mib": args.state_mib,
            "churn": args.churn,
            "checkpoints": args.checkpoints,
            "storage": storage_kind,
            "batch_keys": args.batch_keys,
            "keys": n_keys,
            "full_bytes_median": int(statistics.median(full)),
            "incremental_bytes_median": int(statistics.median(incremental)),
            "incremental_ratio_median": round(
                statistics.median(incremental) / statistics.median(full), 4
            ),
            "incremental_bytes_p95": int(percentile(incremental, 95)),
            "sync_ms_median": round(statistics.median(sync_ms), 2),
            "sync_ms_p95": round(percentile(sync_ms, 95), 2),
            "async_ms_median": round(statistics.median(async_ms), 2),
            "restore_local_s": round(local.duration_s, 3),
            "restore_remote_s": round(remote.duration_s, 3),
            "restore_speedup": round(remote.duration_s / max(local.duration_s, 1e-9), 1),
        }
        if requests:
            operations = sorted(set().union(*requests))
            result["requests_per_checkpoint"] = {
                op: statistics.median(r[op] for r in requests) for op in operations
            }
        out = ROOT / "bench" / "results" / f"snapshot_{args.state_mib}mib_{storage_kind}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result))
        return result
    finally:
        pool.shutdown()
        if server is not None:
            server.stop()
        if args.workdir is None:
            shutil.rmtree(work.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
