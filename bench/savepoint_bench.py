"""Savepoint benchmark: what a savepoint costs against a checkpoint of the same state (state
core: RocksDB, S3 = moto server on 127.0.0.1).

Builds ``--state-mib`` MiB of keyed state (100-byte values) over ``--parallelism`` subtasks and
takes one full checkpoint of it, then an incremental one after ``--churn`` of the keys changed
(what a running job uploads per checkpoint). Then, from the incremental checkpoint: writes a
savepoint (every file copied into its directory: on S3 inside the service), checks it as a
restore does (every file's size and checksum: every byte read), and imports it into another
job as its checkpoint (copied again). Prints, side by side, the checkpoints' upload time and
bytes and the savepoint's steps, and writes ``bench/results/savepoint_<N>mib_<storage>.json``.

    .venv/bin/python bench/savepoint_bench.py --state-mib 1024
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.rescale_bench import JOB, MAX, OPERATOR, build  # noqa: E402
from bench.snapshot_bench import KEY_BYTES, VALUE_BYTES, open_bench_storage  # noqa: E402
from state.keygroups import key_group_range, key_groups  # noqa: E402
from state.local_copies import LocalCopies  # noqa: E402
from state.manifest import CheckpointManifest  # noqa: E402
from state.rocksdb_store import RocksDBStore  # noqa: E402
from state.savepoint import import_savepoint, read_savepoint, write_savepoint  # noqa: E402
from state.snapshot import SubtaskSnapshotter  # noqa: E402
from state.storage import LocalFileStorage, S3Storage  # noqa: E402


def churn(work: Path, storage, handles, fraction: float, n_keys: int, pool) -> tuple[list, float]:
    """Change ``fraction`` of the keys in every subtask's database and take the incremental
    checkpoint 2 on the full one; returns its handles and the slowest subtask's upload time."""
    parallelism = len(handles)
    owner = np.arange(MAX) * parallelism // MAX
    rng = np.random.default_rng(11)
    changed = rng.choice(n_keys, int(n_keys * fraction), replace=False)
    keys = [b"%016d" % i for i in changed]
    groups = key_groups(keys, "binary", MAX)
    out, slowest = [], 0.0
    for h in handles:
        copies = LocalCopies(work / "build", JOB, OPERATOR, h.subtask)
        with RocksDBStore(copies.db_dir, key_group_range(h.subtask, parallelism, MAX)) as store:
            mine = np.flatnonzero(owner[groups] == h.subtask)
            txn = store.begin()
            values = [rng.bytes(VALUE_BYTES) for _ in mine]
            txn.put("v", groups[mine], [keys[j] for j in mine], values)
            txn.commit()
            snapshotter = SubtaskSnapshotter(
                storage, copies, JOB, OPERATOR, h.subtask, executor=pool
            )
            started = time.perf_counter()
            out.append(snapshotter.snapshot(store, 2, h).result())
            slowest = max(slowest, time.perf_counter() - started)
    return out, slowest


def beside(storage, work: Path, name: str):
    """A directory next to the checkpoints: a sibling directory, or a prefix of the bucket."""
    if isinstance(storage, LocalFileStorage):
        return LocalFileStorage(work / name)
    return S3Storage(storage.bucket, f"savepoints/{name}", client=storage._client)


def run(args: argparse.Namespace) -> dict:
    work = Path(args.workdir or tempfile.mkdtemp(prefix="cutline-savepoint-bench-"))
    storage, server, _ = open_bench_storage(args.storage, args, work)
    pool = ThreadPoolExecutor(1)
    n_keys = args.state_mib * 2**20 // (KEY_BYTES + VALUE_BYTES)
    try:
        started = time.perf_counter()
        full = build(work, storage, args.parallelism, n_keys, pool)
        full_s = time.perf_counter() - started  # building included: an upper bound
        handles, incremental_s = churn(work, storage, full, args.churn, n_keys, pool)
        manifest = CheckpointManifest(JOB, 2, 2, 1, 0, {}, tuple(handles))
        size = manifest.full_size
        print(f"{args.parallelism} subtasks, {n_keys:,} keys, {size / 2**20:.0f} MiB", flush=True)
        target = beside(storage, work, "sp-1")
        t0 = time.perf_counter()
        info = write_savepoint(manifest, storage, target)
        t1 = time.perf_counter()
        saved = read_savepoint(target)
        t2 = time.perf_counter()
        import_savepoint(saved, target, storage, "restored", 1, 1)
        t3 = time.perf_counter()
        result = {
            "state_bytes": size,
            "files": info.file_count,
            "full_checkpoint_uploaded_bytes": sum(h.uploaded_bytes for h in full),
            "full_checkpoint_build_and_upload_s": round(full_s, 2),
            "incremental_checkpoint_uploaded_bytes": manifest.uploaded_bytes,
            "incremental_checkpoint_slowest_upload_s": round(incremental_s, 2),
            "savepoint_bytes": info.size,
            "savepoint_write_s": round(t1 - t0, 2),
            "savepoint_check_s": round(t2 - t1, 2),
            "savepoint_import_s": round(t3 - t2, 2),
        }
        print(json.dumps(result), flush=True)
        out = {"state_mib": args.state_mib, "storage": args.storage, "churn": args.churn,
               "parallelism": args.parallelism, "result": result}  # fmt: skip
        path = ROOT / "bench" / "results" / f"savepoint_{args.state_mib}mib_{args.storage}.json"
        path.write_text(json.dumps(out, indent=1) + "\n")
        return out
    finally:
        pool.shutdown()
        if server is not None:
            server.stop()
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-mib", type=int, default=1024)
    parser.add_argument("--storage", choices=["s3", "local"], default="s3")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--churn", type=float, default=0.01)
    parser.add_argument("--s3-endpoint", default=None)
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a temp dir)")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
