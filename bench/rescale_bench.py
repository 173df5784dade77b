"""Rescale benchmark: restoring keyed state at another parallelism against restoring it at the
same one, from the same checkpoint (state core: RocksDB, S3 = moto server on 127.0.0.1).

Builds ``--state-mib`` MiB of keyed state (100-byte values) split over the subtasks of each
old parallelism in ``--rescales`` (``2:4 4:2``: scale-out and scale-in), takes one full
checkpoint of it, then restores every subtask of the new parallelism from durable storage (no
local copy: the worst case), one after the other, and every subtask at the old parallelism the
same way. Prints, per rescale, the total and slowest subtask's restore time for both, their ratio
(the target: a rescaled restore within 1.5x of a same-parallelism remote restore), the keys
copied across, and, at each new subtask's first barrier (where the runtime compacts away the
key groups a rescaled subtask dropped), the compaction's time and the first snapshot's size
against the state. Beside it, the same rescaled restore with every other old subtask's keys
copied in (the path taken when files cannot be merged: state/sst_merge.py). Writes
``bench/results/rescale_<N>mib_<storage>.json``.

    .venv/bin/python bench/rescale_bench.py --state-mib 1024 --rescales 2:4 4:2
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

from bench.snapshot_bench import KEY_BYTES, VALUE_BYTES, open_bench_storage  # noqa: E402
from state.keygroups import DEFAULT_MAX_PARALLELISM, key_group_range, key_groups  # noqa: E402
from state.local_copies import LocalCopies  # noqa: E402
from state.paths import JobLayout  # noqa: E402
from state.rescale import restore_rescaled  # noqa: E402
from state.restore import restore_subtask  # noqa: E402
from state.rocksdb_store import RocksDBStore  # noqa: E402
from state.snapshot import SubtaskSnapshotter  # noqa: E402

JOB, OPERATOR, BATCH = "bench", "keyed", 200_000
MAX = DEFAULT_MAX_PARALLELISM


def build(work: Path, storage, parallelism: int, n_keys: int, pool) -> list:
    """``n_keys`` keys split over ``parallelism`` subtasks by key group; one full checkpoint."""
    stores = [
        RocksDBStore(
            LocalCopies(work / "build", JOB, OPERATOR, i).db_dir,
            key_group_range(i, parallelism, MAX),
        )
        for i in range(parallelism)
    ]
    owner = np.arange(MAX) * parallelism // MAX  # subtask of each key group
    rng = np.random.default_rng(7)
    for start in range(0, n_keys, BATCH):
        keys = [b"%016d" % i for i in range(start, min(start + BATCH, n_keys))]
        groups = key_groups(keys, "binary", MAX)
        values = rng.bytes(VALUE_BYTES * len(keys))
        for i, store in enumerate(stores):
            mine = np.flatnonzero(owner[groups] == i)
            txn = store.begin()
            txn.put(
                "v",
                groups[mine],
                [keys[j] for j in mine],
                [values[j * VALUE_BYTES : (j + 1) * VALUE_BYTES] for j in mine],
            )
            txn.commit()
    handles = []
    for i, store in enumerate(stores):
        store.compact()
        copies = LocalCopies(work / "build", JOB, OPERATOR, i)
        snapshotter = SubtaskSnapshotter(storage, copies, JOB, OPERATOR, i, executor=pool)
        handles.append(snapshotter.snapshot(store, parallelism, None).result())
        store.close()
    return handles


def first_snapshot(work: Path, storage, subtask: int, parallelism: int, pool) -> tuple[int, float]:
    """A new subtask's first barrier as the runtime takes it after a rescale: the compaction
    of the key groups it dropped, then a full snapshot. Its size, and the compaction's time."""
    copies = LocalCopies(work / "restored", JOB, OPERATOR, subtask)
    snapshotter = SubtaskSnapshotter(storage, copies, JOB, OPERATOR, subtask, executor=pool)
    with RocksDBStore(copies.db_dir, key_group_range(subtask, parallelism, MAX)) as store:
        started = time.perf_counter()
        store.compact()
        compact_s = time.perf_counter() - started
        return snapshotter.snapshot(store, 1000 + parallelism, None).result().full_size, compact_s


def run(args: argparse.Namespace) -> dict:
    work = Path(args.workdir or tempfile.mkdtemp(prefix="cutline-rescale-bench-"))
    storage, server, _ = open_bench_storage(args.storage, args, work)
    pool = ThreadPoolExecutor(1)
    n_keys = args.state_mib * 2**20 // (KEY_BYTES + VALUE_BYTES)
    layout = JobLayout(JOB)
    results = []
    try:
        for pair in args.rescales:
            old, new = (int(x) for x in pair.split(":"))
            shutil.rmtree(work / "build", ignore_errors=True)
            t0 = time.perf_counter()
            handles = build(work, storage, old, n_keys, pool)
            full = sum(h.full_size for h in handles)
            print(f"{old} subtasks, {n_keys:,} keys, {full / 2**20:.0f} MiB checkpoint "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
            same = []
            for h in handles:
                target = work / "same" / str(h.subtask)
                same.append(restore_subtask(h, storage, layout, target, None).duration_s)
                shutil.rmtree(target)
            by_copy = []  # the baseline: every other old subtask's keys copied in
            for j in range(new):
                target = LocalCopies(work / "restored", JOB, OPERATOR, j).db_dir
                r = restore_rescaled(
                    handles, j, key_group_range(j, new, MAX), storage, layout, target,
                    lambda _: None, by_files=False,
                )  # fmt: skip
                by_copy.append(r.duration_s)
                shutil.rmtree(target.parent, ignore_errors=True)
            rescaled, copied, merged, snap, compaction = [], 0, 0, [], []
            for j in range(new):
                target = LocalCopies(work / "restored", JOB, OPERATOR, j).db_dir
                shutil.rmtree(target.parent, ignore_errors=True)
                r = restore_rescaled(
                    handles, j, key_group_range(j, new, MAX), storage, layout, target,
                    lambda _: None,
                )  # fmt: skip
                rescaled.append(r.duration_s)
                copied += r.keys_copied
                merged += r.merged_by_files
                size, compact_s = first_snapshot(work, storage, j, new, pool)
                snap.append(size)
                compaction.append(compact_s)
                shutil.rmtree(target.parent, ignore_errors=True)
            result = {
                "from": old,
                "to": new,
                "state_bytes": full,
                "same_parallelism_restore_s": round(sum(same), 2),
                "same_parallelism_slowest_subtask_s": round(max(same), 2),
                "rescaled_restore_s": round(sum(rescaled), 2),
                "rescaled_slowest_subtask_s": round(max(rescaled), 2),
                "ratio_total": round(sum(rescaled) / sum(same), 2),
                "ratio_slowest_subtask": round(max(rescaled) / max(same), 2),
                "keys_copied": copied,
                "subtasks_merged_by_files": merged,
                "by_copying_keys_restore_s": round(sum(by_copy), 2),
                "by_copying_keys_slowest_subtask_s": round(max(by_copy), 2),
                "first_snapshot_bytes": sum(snap),
                "first_snapshot_over_state": round(sum(snap) / full, 3),
                "first_barrier_compaction_slowest_s": round(max(compaction), 2),
            }
            print(json.dumps(result), flush=True)
            results.append(result)
        out = {"state_mib": args.state_mib, "storage": args.storage, "rescales": results}
        path = ROOT / "bench" / "results" / f"rescale_{args.state_mib}mib_{args.storage}.json"
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
    parser.add_argument("--rescales", nargs="+", default=["2:4", "4:2"])
    parser.add_argument("--s3-endpoint", default=None)
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a temp dir)")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
