"""Test-harness benchmark: how long cutline.testing takes to run a user's function in-process,
the figure that decides whether users write many small state tests.

Runs the sessions example's ``Sessionize`` (two list states, a TTL map, an event-time timer per
click) over ``--records`` clicks of ``--users`` users in micro-batches of ``--batch``, closes
every session with a last watermark, takes a snapshot halfway and restores it into a second
harness. Prints the times (median of ``--repeat`` runs) and writes bench/results/harness.json.

    .venv/bin/python bench/harness_bench.py --records 10000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cutline_sessions.jobs import sessions  # noqa: E402

from cutline.testing import Harness  # noqa: E402


def clicks(n: int, users: int) -> pd.DataFrame:
    rng = np.random.default_rng(42)
    ts = np.sort(rng.integers(0, 3_600_000, n))
    return pd.DataFrame(
        {"user": [f"u{u}" for u in rng.integers(0, users, n)], "url": "/", "ts": ts}
    )


def once(df: pd.DataFrame, batch: int) -> dict[str, float]:
    started = time.perf_counter()
    with Harness(sessions()) as h:
        opened = time.perf_counter()
        half = len(df) // 2
        rows = 0
        for i in range(0, len(df), batch):
            rows += h.process(df.iloc[i : i + batch]).num_rows
            if i + batch == half:
                snapshot_started = time.perf_counter()
                snapshot = h.snapshot()
                snapshot_s = time.perf_counter() - snapshot_started
        rows += h.advance_watermark(int(df.ts.max()) + 10_000).num_rows
        total = time.perf_counter() - started
        restore_started = time.perf_counter()
        with Harness(sessions(), restore=snapshot):
            restore_s = time.perf_counter() - restore_started
    return {
        "total_s": total,
        "open_s": opened - started,
        "snapshot_s": snapshot_s,
        "restore_s": restore_s,
        "sessions": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    df = clicks(args.records, args.users)
    runs = [once(df, args.batch) for _ in range(args.repeat)]
    result = {
        "records": args.records,
        "users": args.users,
        "batch": args.batch,
        "repeat": args.repeat,
        **{k: statistics.median(r[k] for r in runs) for k in runs[0]},
    }
    print(
        f"sessionize {args.records:,} records in batches of {args.batch:,}: "
        f"{result['total_s'] * 1000:.0f} ms (harness open {result['open_s'] * 1000:.0f} ms, "
        f"snapshot {result['snapshot_s'] * 1000:.0f} ms), restore into a new harness "
        f"{result['restore_s'] * 1000:.0f} ms; {int(result['sessions']):,} sessions; "
        f"median of {args.repeat}"
    )
    out = ROOT / "bench" / "results" / "harness.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
