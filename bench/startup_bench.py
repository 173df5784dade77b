"""Driver start benchmark: how long a restore takes to its first micro-batch with and without
the driver JVM's class-data archive (spark_jobs/deploy/class_archive.py), the Python worker
daemon that imports the runtime before it forks (spark_jobs/executor/worker_daemon.py), one
daemon for the RDD and the SQL tasks, PySpark imported compiled instead of from Spark's zip
(spark_jobs/executor/python_path.py), and the quick compiler alone (``-XX:TieredStopAtLevel=1``,
what the test suite uses). Each variant adds one of them to the one before.

One home with a ``clicks_per_user`` checkpoint; each variant restores it ``--repeat`` times
(``cutline run``, two micro-batches). Prints the median of the driver's own ``startup:`` line
and of the whole process, per variant, and writes bench/results/startup.json.

    .venv/bin/python bench/startup_bench.py --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spark_jobs.commands.class_archive import build  # noqa: E402
from spark_jobs.deploy.class_archive import archive_path  # noqa: E402
from spark_jobs.sources.generate import generate  # noqa: E402

RUN = ["run", "clicks_per_user", "--interval-ms", "500", "--idle-timeout", "1", "--max-batches"]
PYSPARK_DAEMON = ["--conf", "spark.python.daemon.module=pyspark.daemon"]
ZIP_PYSPARK = ["--conf", "spark.executorEnv.PYTHONPATH="]  # no sitecustomize: the zip's PySpark
TWO_DAEMONS = ["--conf", "spark.executorEnv.SPARK_SIMPLIFIED_TRACEBACK=0"]  # RDD != SQL workers
OFF = {"CUTLINE_CLASS_ARCHIVE": "off"}
# name -> (environment of the driver, extra arguments of ``cutline run``)
VARIANTS: dict[str, tuple[dict[str, str], list[str]]] = {
    "plain JVM, PySpark's daemon": (OFF, [*PYSPARK_DAEMON, *ZIP_PYSPARK, *TWO_DAEMONS]),
    "plain JVM": (OFF, [*ZIP_PYSPARK, *TWO_DAEMONS]),
    "class archive": ({}, [*ZIP_PYSPARK, *TWO_DAEMONS]),
    "+ one worker daemon": ({}, ZIP_PYSPARK),
    "+ compiled PySpark (the default)": ({}, []),
    "default, quick compiler only": ({"SPARK_SUBMIT_OPTS": "-XX:TieredStopAtLevel=1"}, []),
}
STARTUP = re.compile(r"^startup: ([0-9.]+) s from the process start", re.M)


def restore_once(home: Path, variant: tuple[dict[str, str], list[str]]) -> tuple[float, float]:
    variant_env, conf = variant
    env = {k: v for k, v in os.environ.items() if k != "SPARK_SUBMIT_OPTS"}
    env.update(variant_env)
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "spark_jobs.commands", "--home", str(home), *RUN, "2", *conf],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    whole = time.monotonic() - started
    match = STARTUP.search(out)
    if not match:
        raise RuntimeError(f"no startup line in:\n{out[-2000:]}")
    return float(match.group(1)), whole


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "startup.json"))
    args = parser.parse_args()
    build()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="cutline-startup-bench-") as tmp:
        home = Path(tmp)
        generate(home / "log", "clicks", "clicks", count=40_000, seed=7, users=3_000)
        # the checkpoint every variant restores
        restore_once(home, VARIANTS["+ compiled PySpark (the default)"])
        for name, variant in VARIANTS.items():
            runs = [restore_once(home, variant) for _ in range(args.repeat)]
            results[name] = {
                "startup_s": statistics.median(r[0] for r in runs),
                "process_s": statistics.median(r[1] for r in runs),
            }
            print(
                f"{name:36s} first micro-batch after {results[name]['startup_s']:5.1f} s, "
                f"process {results[name]['process_s']:5.1f} s (median of {args.repeat})",
                flush=True,
            )
    Path(args.out).write_text(
        json.dumps(
            {
                "what": "restore of clicks_per_user to its first micro-batch, 2 cores, local[*]",
                "archive": str(archive_path()),
                "repeat": args.repeat,
                "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
