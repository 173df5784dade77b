"""Page cache benchmark: one subtask's multi-get of ``--keys`` random keys over a store of
``--state-mib`` MiB, opened as a micro-batch's task opens it, with the store's files

- ``warm``: all in the page cache;
- ``cold``: evicted from it (``POSIX_FADV_DONTNEED``), as a kernel leaves the pages of a state
  idle for a while, opened without reading them ahead (``StoreOptions(prefetch_mib=0)``);
- ``prefetched``: evicted, then opened with the default options, whose open reads the files
  into the page cache (state/page_cache.py) before the multi-get.

The lookups share the process's RocksDB block cache (``StoreOptions.block_cache_mib``), as a
Python worker's tasks do, so the state must be many times its size (``--state-mib`` at least
ten times), or the multi-get reads the cache and not the files. Each round takes the three in
turn, the open included in the time; prints them and the bytes the process read from storage
(``/proc/self/io``), and writes bench/results/page_cache.json.

    .venv/bin/python bench/page_cache_bench.py --state-mib 600 --rounds 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from snapshot_bench import KEY_BYTES, VALUE_BYTES, write_keys  # noqa: E402

from state.keygroups import DEFAULT_MAX_PARALLELISM, KeyGroupRange, key_groups  # noqa: E402
from state.page_cache import drop  # noqa: E402
from state.rocksdb_options import StoreOptions  # noqa: E402
from state.rocksdb_store import RocksDBStore  # noqa: E402

KEY_GROUPS = KeyGroupRange(0, DEFAULT_MAX_PARALLELISM - 1)
MODES = ("warm", "cold", "prefetched")


def read_from_storage() -> int:
    """Bytes this process has had read from storage (not from the page cache)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes"))


def set_cache(db: Path, warm: bool) -> None:
    """Read the store's SST files whole (``warm``), or drop them from the page cache."""
    if not warm:
        drop(db.glob("*.sst"))
        return
    for sst in db.glob("*.sst"):
        with open(sst, "rb") as f:
            while f.read(1 << 20):
                pass


def lookup(db: Path, mode: str, ids: np.ndarray) -> dict:
    """Open the store as ``mode`` says and multi-get ``ids``; the open is timed too."""
    set_cache(db, warm=mode == "warm")
    options = StoreOptions(prefetch_mib=0) if mode == "cold" else StoreOptions()
    keys = [b"%016d" % i for i in ids.tolist()]
    groups = key_groups(keys, "binary", DEFAULT_MAX_PARALLELISM)
    before, started = read_from_storage(), time.perf_counter()
    with RocksDBStore(db, KEY_GROUPS, options, compactions=False) as store:
        opened = time.perf_counter()
        values = store.get_many("v", groups, keys)
        done = time.perf_counter()
    assert all(v is not None for v in values), "every key looked up was written"
    return {
        "mode": mode,
        "open_s": round(opened - started, 3),
        "multi_get_s": round(done - opened, 3),
        "total_s": round(done - started, 3),
        "read_from_storage_mb": round((read_from_storage() - before) / 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-mib", type=int, default=600)
    parser.add_argument("--keys", type=int, default=100_000, help="looked up per multi-get")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "page_cache.json")
    args = parser.parse_args()
    if not hasattr(os, "posix_fadvise"):
        sys.exit("this benchmark needs posix_fadvise (Linux)")
    cache_mib = StoreOptions().block_cache_mib
    if args.state_mib < 10 * cache_mib:
        sys.exit(f"--state-mib must be at least ten times the block cache's {cache_mib} MiB")
    rng = np.random.default_rng(7)
    n = (args.state_mib << 20) // (KEY_BYTES + VALUE_BYTES)
    runs = []
    with tempfile.TemporaryDirectory(prefix="cutline-page-cache-") as tmp:
        db = Path(tmp) / "db"
        started = time.perf_counter()
        with RocksDBStore(db, KEY_GROUPS) as store:
            write_keys(store, rng.permutation(n), 200_000)
        with RocksDBStore(db, KEY_GROUPS) as store:
            store.compact()  # one sorted run: what a lookup costs, without level 0's filters
        size = sum(f.stat().st_size for f in db.glob("*.sst"))
        built_s = time.perf_counter() - started
        print(f"{n:,} keys, {size / 1e6:.0f} MB of SST files, built in {built_s:.0f} s")
        for i in range(args.rounds):
            for mode in MODES:
                run = {"round": i + 1, **lookup(db, mode, np.sort(rng.integers(0, n, args.keys)))}
                runs.append(run)
                print(json.dumps(run), flush=True)
    medians = {
        mode: {
            field: statistics.median(r[field] for r in runs if r["mode"] == mode)
            for field in ("open_s", "multi_get_s", "total_s", "read_from_storage_mb")
        }
        for mode in MODES
    }
    for mode, m in medians.items():
        print(f"{mode}: median {json.dumps(m)}")
    result = {
        "what": f"multi-get of {args.keys:,} random keys over one store of {size / 1e6:.0f} MB of "
        f"SST files ({n:,} keys of {KEY_BYTES + VALUE_BYTES} bytes), its open included",
        "runs": runs,
        "medians": medians,
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
