"""The S3 server's own cost per request against the objects in its bucket: what the catalog
bench's S3 seconds include beside Cutline's requests (bench/catalog_bench.py).

moto's standalone server on 127.0.0.1 (the suite's and the benches' S3), one bucket: a table's
log of 20 objects under one prefix, then the bucket filled with objects under another prefix;
at each size the median of ``--repeat`` LISTs of the log's prefix (``start-after`` its tenth
entry, as delta-rs lists a log) and GETs of one log object.

    .venv/bin/python bench/s3_server_bench.py --sizes 20 1000 5000 20000

Prints a line per size and writes bench/results/s3_server.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.moto_server import MotoServer  # noqa: E402

BUCKET, LOG = "bench-bucket", "t/_delta_log/"


def _timed(call, repeat: int) -> float:
    """The median milliseconds of ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20, 1_000, 5_000, 20_000])
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args(argv)
    for name, value in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):  # fmt: skip
        os.environ.setdefault(name, value)
    import boto3

    results = []
    with tempfile.TemporaryDirectory() as scratch:
        server = MotoServer(Path(scratch) / "moto.stderr").start()
        try:
            s3 = boto3.client("s3", endpoint_url=server.endpoint)
            s3.create_bucket(Bucket=BUCKET)
            for i in range(20):
                s3.put_object(Bucket=BUCKET, Key=f"{LOG}{i:020d}.json", Body=b"{}")
            stored = 20
            with ThreadPoolExecutor(8) as pool:
                for size in sorted(args.sizes):
                    others = range(stored, size)
                    list(pool.map(lambda i: s3.put_object(Bucket=BUCKET, Key=f"other/{i:08d}",
                                                          Body=b"x"), others))  # fmt: skip
                    stored = max(stored, size)
                    after = f"{LOG}{10:020d}.json"
                    list_ms = _timed(lambda a=after: s3.list_objects_v2(
                        Bucket=BUCKET, Prefix=LOG, StartAfter=a), args.repeat)  # fmt: skip

                    def get(a: str = after) -> bytes:
                        return s3.get_object(Bucket=BUCKET, Key=a)["Body"].read()

                    get_ms = _timed(get, args.repeat)
                    row = {"objects": stored, "list_ms": round(list_ms, 1),
                           "get_ms": round(get_ms, 1)}  # fmt: skip
                    print(f"{stored:>7,} objects in the bucket: LIST of a 20-key prefix "
                          f"{list_ms:6.1f} ms, GET {get_ms:5.1f} ms", flush=True)  # fmt: skip
                    results.append(row)
        finally:
            server.stop()
    out = ROOT / "bench" / "results" / "s3_server.json"
    out.write_text(json.dumps({
        "what": "moto server: LIST of a 20-key prefix and GET, against the objects in the bucket",
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "repeat": args.repeat,
        "results": results,
    }, indent=1) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
