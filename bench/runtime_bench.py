"""Runtime benchmark: a clicks job (default clicks_per_user; ``--job`` names another, e.g. the
example package's ``sessions`` or ``country_clicks``) on local Spark with checkpoints off, every
1 s and every 10 s.

For each setting, on the same generated input and after a warm-up run: records/s over the run,
micro-batch duration p50/p99 with and without a checkpoint in flight, and checkpoint durations
(trigger to completion, from the catalog). "Off" means an interval longer than the run: one
checkpoint at the first micro-batch and the final one, none in between. Prints one JSON object as
its last line and writes it to bench/results/runtime.json (runtime-<job>.json for another job).

    .venv/bin/python bench/runtime_bench.py --records-per-partition 1000000
    .venv/bin/python bench/runtime_bench.py --job sessions --records-per-partition 300000
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spark_jobs.catalog.tables import CatalogReader  # noqa: E402
from spark_jobs.deploy.session import build_spark  # noqa: E402
from spark_jobs.deploy.settings import RuntimePaths  # noqa: E402
from spark_jobs.driver.run import run_job  # noqa: E402
from spark_jobs.job_loader import get_job  # noqa: E402
from spark_jobs.sources.generate import generate  # noqa: E402

# "warmup" runs first and is not reported: it absorbs JVM and Python worker warm-up.
SETTINGS = {"warmup": 10**9, "off": 10**9, "10s": 10_000, "1s": 1_000}


def pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records-per-partition", type=int, default=1_000_000)
    parser.add_argument("--batch-records", type=int, default=50_000, help="per partition")
    parser.add_argument("--users", type=int, default=200_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--job", default="clicks_per_user", help="a job that reads clicks")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="cutline-runtime-bench-"))
    log = work / "input"
    generate(log, "clicks", "clicks", count=args.records_per_partition, users=args.users, seed=3)
    spark = build_spark(args.master, "cutline-runtime-bench")
    base = get_job(args.job)
    source = dataclasses.replace(base.sources[0], max_records_per_partition=args.batch_records)
    results = {}
    try:
        for name, interval in SETTINGS.items():
            home = work / name
            home.mkdir()
            (home / "log").symlink_to(log, target_is_directory=True)
            job = dataclasses.replace(
                base,
                sources=(source,),
                checkpoint=dataclasses.replace(base.checkpoint, interval_ms=interval),
            )
            started = time.perf_counter()
            summary = run_job(
                spark, job, RuntimePaths.under(home), idle_timeout_s=15, log=lambda *_: None
            )
            wall = time.perf_counter() - started
            busy = sum(summary.batch_ms) / 1000
            during = [
                ms for ms, c in zip(summary.batch_ms, summary.batch_checkpointing, strict=True) if c
            ]
            outside = [
                ms
                for ms, c in zip(summary.batch_ms, summary.batch_checkpointing, strict=True)
                if not c
            ]
            checkpoints = CatalogReader(RuntimePaths.under(home).catalog).checkpoints(job.name)
            sizes = [c.full_size for c in checkpoints] if checkpoints else [0]
            durations = [c.complete_time_ms - c.trigger_time_ms for c in checkpoints]
            results[name] = {
                "records": summary.records,
                "batches": summary.batches,
                "records_per_s": round(summary.records / busy),
                "wall_s_incl_startup": round(wall, 1),
                "batch_ms_p50_no_checkpoint": pct(outside, 50),
                "batch_ms_p99_no_checkpoint": pct(outside, 99),
                "batch_ms_p50_checkpoint_in_flight": pct(during, 50),
                "batch_ms_p99_checkpoint_in_flight": pct(during, 99),
                "checkpoints": len(checkpoints),
                "checkpoint_ms_median": statistics.median(durations) if durations else None,
                "checkpoint_ms_max": max(durations) if durations else None,
                "checkpoint_full_bytes_max": max(sizes),
            }
            print(name, json.dumps(results[name]), flush=True)
        results.pop("warmup")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    off = results["off"]["records_per_s"]
    results["throughput_ratio_10s"] = round(results["10s"]["records_per_s"] / off, 3)
    results["throughput_ratio_1s"] = round(results["1s"]["records_per_s"] / off, 3)
    p99_off = results["off"]["batch_ms_p99_no_checkpoint"]
    p99_ckpt = results["10s"]["batch_ms_p99_checkpoint_in_flight"]
    if p99_off and p99_ckpt:
        results["p99_ratio_10s"] = round(p99_ckpt / p99_off, 3)
    results["job"] = args.job
    name = "runtime.json" if args.job == "clicks_per_user" else f"runtime-{args.job}.json"
    out = ROOT / "bench" / "results" / name
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
