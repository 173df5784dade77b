"""Block format benchmark: what one subtask's multi-get of ``--keys`` random keys costs over a
store of ``--state-mib`` MiB whose blocks are

- ``plain``: uncompressed and read in place through memory maps, without a block cache (the
  store's default, state/rocksdb_options.py);
- ``zstd``: zstd and read through the process's block cache (the default before 2026-12-07);
- ``lz4``: LZ4 and read through the block cache.

The values are hex text of 150 bytes, as the peer benchmark's payloads (zstd about halves them,
LZ4 hardly shrinks them). Each store is one sorted run (compacted), its files in the page cache;
every multi-get runs in a fresh process, as a takeover's first task opens its store with an
empty block cache. The formats take turns in each round, so that they share the machine's
drift. Prints each multi-get and the medians; writes bench/results/block_format.json.

    .venv/bin/python bench/block_format_bench.py --state-mib 512 --rounds 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from page_cache_bench import set_cache  # noqa: E402

from state.keygroups import DEFAULT_MAX_PARALLELISM, KeyGroupRange, key_groups  # noqa: E402
from state.rocksdb_options import StoreOptions  # noqa: E402
from state.rocksdb_store import RocksDBStore  # noqa: E402

KEY_GROUPS = KeyGroupRange(0, DEFAULT_MAX_PARALLELISM - 1)
VALUE_BYTES = 150  # hex text of 75 random bytes
FORMATS = {
    "plain": StoreOptions(),
    "zstd": StoreOptions(compression="zstd", bottommost_compression="zstd"),
    "lz4": StoreOptions(compression="lz4", bottommost_compression="lz4"),
}


def key_bytes(ids: np.ndarray) -> list[bytes]:
    return [b"%016d" % i for i in ids.tolist()]


def build(db: Path, options: StoreOptions, n: int, seed: int) -> int:
    """``n`` keys of hex values in one sorted run; returns the SST files' bytes."""
    rng = np.random.default_rng(seed)
    with RocksDBStore(db, KEY_GROUPS, options) as store:
        for start in range(0, n, 200_000):
            keys = key_bytes(np.arange(start, min(n, start + 200_000)))
            noise = rng.bytes(VALUE_BYTES // 2 * len(keys)).hex().encode()
            values = [noise[i * VALUE_BYTES : (i + 1) * VALUE_BYTES] for i in range(len(keys))]
            txn = store.begin()
            txn.put("v", key_groups(keys, "binary", DEFAULT_MAX_PARALLELISM), keys, values)
            txn.commit()
    with RocksDBStore(db, KEY_GROUPS, options) as store:
        store.compact()
    return sum(f.stat().st_size for f in db.glob("*.sst"))


def multi_get(db: Path, fmt: str, ids: list[int]) -> float:
    """In this process: open the store as a task does and multi-get ``ids``; its seconds."""
    keys = key_bytes(np.asarray(ids))
    groups = key_groups(keys, "binary", DEFAULT_MAX_PARALLELISM)
    with RocksDBStore(db, KEY_GROUPS, FORMATS[fmt], compactions=False) as store:
        started = time.perf_counter()
        values = store.get_many("v", groups, keys)
        seconds = time.perf_counter() - started
    assert all(v is not None for v in values), "every key looked up was written"
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-mib", type=int, default=512)
    parser.add_argument("--keys", type=int, default=100_000, help="looked up per multi-get")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/block_format.json")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # db, format, ids file
    args = parser.parse_args()
    if args.one:
        db, fmt, ids = args.one
        print(multi_get(Path(db), fmt, json.loads(Path(ids).read_text())))
        return
    n = (args.state_mib << 20) // (16 + VALUE_BYTES)
    rng = np.random.default_rng(7)
    runs, sizes = [], {}
    with tempfile.TemporaryDirectory(prefix="cutline-block-format-") as tmp:
        for fmt in FORMATS:
            sizes[fmt] = build(Path(tmp) / fmt, FORMATS[fmt], n, seed=3)
            print(f"{fmt}: {n:,} keys, {sizes[fmt] / 1e6:.0f} MB of SST files", flush=True)
        for i in range(args.rounds):
            ids = Path(tmp) / "ids.json"
            ids.write_text(json.dumps(np.sort(rng.choice(n, args.keys, replace=False)).tolist()))
            for fmt in FORMATS:
                db = Path(tmp) / fmt
                set_cache(db, warm=True)
                out = subprocess.run(
                    [sys.executable, __file__, "--one", str(db), fmt, str(ids)],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                run = {"round": i + 1, "format": fmt, "multi_get_s": round(float(out.stdout), 3)}
                runs.append(run)
                print(json.dumps(run), flush=True)
    medians = {
        f: statistics.median(r["multi_get_s"] for r in runs if r["format"] == f) for f in FORMATS
    }
    print(f"medians: {json.dumps(medians)}")
    result = {
        "what": f"multi-get of {args.keys:,} random keys over one store of {n:,} keys of hex "
        f"values ({VALUE_BYTES} bytes), one sorted run, its files in the page cache, a fresh "
        "process and block cache each",
        "sst_mb": {f: round(s / 1e6) for f, s in sizes.items()},
        "runs": runs,
        "medians_s": medians,
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
