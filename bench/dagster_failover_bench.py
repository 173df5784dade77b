"""Failover under Dagster, as ``make demo`` runs it: from ``kill -9`` of the streaming run's
driver (its Python process, the pid the demo prints) to the first completed checkpoint of
the attempt that replaces it, in one invocation, one Dagster instance (a real webserver and
daemon) and one input:

- standby: the run launched with ``standby: true`` (the demo's default); the warm standby takes
  over within the run. Each kill waits until the next standby is warm.
- restore: a run without a standby; ``restore_on_failure`` launches a restore run (its restart
  backoff included: 1 s, then 2 s, ... as Flink's exponential-delay strategy).

``clicks_per_user`` at the demo's rate (2,000 clicks/s), parallelism 2, its checkpoint interval
(3 s); each driver killed 2 s after its attempt's first checkpoint (with a standby: and
the standby's being warm). The first checkpoint of the
new attempt is its catalog row's completion time (the driver's clock, the same machine's); the
takeover's own figure (the supervisor seeing the death to the end of the first micro-batch, on
the driver's clock) is its ``streaming_jobs`` materialization's ``takeover_s``.

    .venv/bin/python bench/dagster_failover_bench.py --repeat 3

Prints each failover and the medians; writes bench/results/dagster_failover.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dagster import AssetKey, DagsterRunStatus, RunsFilter  # noqa: E402
from deltalake.exceptions import TableNotFoundError  # noqa: E402

from orchestration.demo import (  # noqa: E402
    DagsterProcesses,
    instance,
    launch_streaming_run,
    register_partitions,
)
from orchestration.partitions import DRIVER_PID_TAG, JOB_TAG  # noqa: E402
from spark_jobs.catalog.tables import read_delta  # noqa: E402
from spark_jobs.deploy.standalone import free_port  # noqa: E402

JOB = "clicks_per_user"
RATE = 2_000.0  # the demo's
POLL_S = 0.1


def checkpoints(home: Path) -> list[dict]:
    try:
        return read_delta(home / "warehouse" / "catalog" / "completed_checkpoints", JOB).to_pylist()
    except TableNotFoundError:  # no commit yet
        return []


def wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(POLL_S)
    raise TimeoutError(f"no {what} in {timeout_s} s")


def newest_run(home: Path):
    with instance(home) as inst:
        runs = inst.get_runs(RunsFilter(job_name="streaming_job", tags={JOB_TAG: JOB}), limit=1)
    return runs[0] if runs else None


def warm_standbys(home: Path, run_id: str) -> int:
    with instance(home) as inst:
        return sum("warm, waiting" in (e.message or "") for e in inst.all_logs(run_id))


def takeover_seconds(home: Path, run_id: str) -> list[float]:
    with instance(home) as inst:
        records = inst.fetch_materializations(AssetKey("streaming_jobs"), limit=100).records
    return sorted(
        (
            r.asset_materialization.metadata["takeover_s"].value
            for r in records
            if r.run_id == run_id and "takeover_s" in r.asset_materialization.metadata
        ),
    )


def kill_and_time(home: Path, attempt: int, standby: bool, warm: int) -> dict:
    """Kill the newest run's driver (``kill -9 PID``, as the demo says) 2 s after attempt
    ``attempt``'s first checkpoint (with a standby: and its ``warm``-th standby warm); the
    seconds to the replacing attempt's first completed checkpoint."""
    wait(lambda: [r for r in checkpoints(home) if r["attempt"] == attempt], 300, "a checkpoint")
    run = wait(lambda: newest_run(home), 60, "a run")
    if standby:
        wait(lambda: warm_standbys(home, run.run_id) >= warm, 300, "a warm standby")
    time.sleep(2.0)
    pid = int(wait(lambda: newest_run(home).tags.get(DRIVER_PID_TAG), 60, "a driver"))
    killed = time.time()
    os.kill(pid, signal.SIGKILL)
    first = wait(
        lambda: [r for r in checkpoints(home) if r["attempt"] > attempt], 300, "a new checkpoint"
    )
    seconds = min(r["complete_time_ms"] for r in first) / 1000 - killed
    return {"attempt": attempt + 1, "to_first_checkpoint_s": round(seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "dagster_failover.json"))
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"standby": [], "restore": []}
    with tempfile.TemporaryDirectory(prefix="cutline-dagster-failover-") as scratch:
        home = Path(scratch) / "home"
        (home / "log").mkdir(parents=True)
        generator = subprocess.Popen(
            [sys.executable, "-m", "spark_jobs.commands", "--home", str(home), "generate",
             "clicks", "--count", "50000000", "--rate", str(RATE)],
            cwd=ROOT, start_new_session=True,
        )  # fmt: skip
        dagster = DagsterProcesses(home, free_port()).start()
        try:
            register_partitions(home)
            client = dagster.client()
            for mode in ("standby", "restore"):
                attempt = max((r["attempt"] for r in checkpoints(home)), default=0) + 1
                run_id = launch_streaming_run(client, JOB, {"standby": mode == "standby"})
                for i in range(args.repeat):
                    row = kill_and_time(home, attempt, mode == "standby", warm=i + 1)
                    results[mode].append(row)
                    attempt = row["attempt"]
                    print(f"{mode} {i + 1}: {row}", flush=True)
                if mode == "standby":  # the op reports the last takeover's metadata
                    wait(
                        lambda r=run_id: len(takeover_seconds(home, r)) >= args.repeat,
                        60,
                        "every takeover's metadata",
                    )
                    for row, seconds in zip(
                        results[mode], takeover_seconds(home, run_id), strict=False
                    ):
                        row["takeover_s"] = seconds
                run = newest_run(home)
                client.terminate_run(run.run_id)
                wait(
                    lambda r=run: (
                        newest_run(home).status
                        in (DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE)
                    ),
                    120,
                    "the run's end",
                )
        finally:
            generator.terminate()
            dagster.stop()
    medians = {
        mode: statistics.median(r["to_first_checkpoint_s"] for r in rows)
        for mode, rows in results.items()
    }
    print(", ".join(f"{mode}: median {s:.2f} s" for mode, s in medians.items()))
    Path(args.out).write_text(json.dumps({
        "what": "kill -9 of the streaming run's driver to the first completed checkpoint of the "
                f"attempt replacing it, under Dagster as make demo runs it: {JOB}, "
                f"{RATE:.0f} clicks/s, parallelism 2, local Spark",
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "runs": results,
        "median_to_first_checkpoint_s": medians,
    }, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
