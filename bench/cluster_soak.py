"""Placement soak: ``clicks_per_user`` with parallelism 4 on the two-worker standalone cluster
(spark_jobs/deploy/standalone.py, hosts 127.0.0.2 and 127.0.0.3) for ``--minutes``, checkpointing
every
``--interval-ms``, while input arrives at ``--rate`` records/s.

Every micro-batch task of a subtask must run on the host that restored it, or it fails on missing
working state and the attempt ends: one attempt that runs to the end (idle after the input stops)
is the evidence that Spark never moved a task. Prints and writes to
bench/results/cluster_soak.json: attempts, micro-batches, checkpoints, the allocation, and whether
the output equals the answer computed from the input.

    .venv/bin/python bench/cluster_soak.py --minutes 10 --interval-ms 5000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spark_jobs.catalog.tables import read_delta  # noqa: E402
from spark_jobs.deploy.standalone import StandaloneCluster  # noqa: E402
from tests.reference import check_clicks, read_log  # noqa: E402

JOB = "clicks_per_user"


def catalog(home: Path, table: str) -> list[dict]:
    rows = read_delta(home / "warehouse" / "catalog" / table, JOB).to_pylist()
    return [r for r in rows if r["job_id"] == JOB]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--interval-ms", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=2000.0, help="input records per second")
    parser.add_argument("--parallelism", type=int, default=4)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "cluster_soak.json"))
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="cutline-soak-"))
    home = work / "home"
    cli = [sys.executable, "-m", "spark_jobs.commands", "--home", str(home)]
    total = int(args.rate * args.minutes * 60)
    with StandaloneCluster(work / "cluster") as cluster:
        generator = subprocess.Popen(
            [*cli, "generate", "clicks", "--count", str(total), "--rate", str(args.rate),
             "--seed", "7", "--users", "20000"],
            cwd=ROOT,
        )  # fmt: skip
        time.sleep(2)
        started = time.monotonic()
        with open(work / "driver.log", "wb") as log:
            driver = subprocess.run(
                [*cli, "run", JOB, "--master", cluster.master_url,
                 "--parallelism", str(args.parallelism), "--interval-ms", str(args.interval_ms),
                 "--idle-timeout", "30"],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        elapsed = time.monotonic() - started
        generator.wait()
    attempts = catalog(home, "streaming_jobs")
    checkpoints = catalog(home, "completed_checkpoints")  # COMPLETED or SUBSUMED
    try:  # the pandas reference: fails on anything lost or doubled
        exact, check = True, check_clicks(home)
    except AssertionError as e:
        exact, check = False, str(e)[:2000]
    result = {
        "minutes": args.minutes,
        "interval_ms": args.interval_ms,
        "rate": args.rate,
        "parallelism": args.parallelism,
        "driver_exit": driver.returncode,
        "elapsed_s": round(elapsed, 1),
        "attempts": len(attempts),
        "status": [a["status"] for a in attempts],
        "allocation": json.loads(attempts[-1]["allocation"]) if attempts else {},
        "checkpoints_completed": len(checkpoints),
        "records": len(read_log(home, "clicks")),
        "output_exact": exact,
        "output_check": check,
        "driver_log": str(work / "driver.log"),
    }
    print(json.dumps(result, indent=2))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
