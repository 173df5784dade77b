"""A standby driver under Dagster, end to end, with a real dagster-daemon and webserver: the
streaming run of ``clicks_per_user`` is launched with ``standby`` (as ``make demo`` launches it)
while clicks keep arriving.

1. The active driver is killed with SIGKILL (its process group: the JVM too) once its standby is
   warm: the standby takes over within the same run; the run's tags name the new active driver,
   and its ``streaming_jobs`` materialization says it was a takeover and how many seconds it took
   from the death to the first micro-batch. The time from the kill to the first completed
   checkpoint of the new attempt is reported.
2. Once the next standby is warm, both drivers are killed (the standby first, so that no takeover
   is ordered to it): the run fails, and ``restore_on_failure`` launches a restore run with the
   failed run's config (a standby again), which runs to the end of the input.

The output equals what pandas computes from the input (tests/reference.py); the catalog shows one
attempt per takeover and per restore, none left RUNNING and no checkpoint CORRUPT.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterRunStatus

from orchestration.demo import DagsterProcesses, instance, launch_streaming_run, register_partitions
from orchestration.partitions import DRIVER_PID_TAG, RESTORE_OF_TAG, STANDBY_PID_TAG
from spark_jobs.catalog.tables import CatalogReader
from spark_jobs.deploy.settings import RuntimePaths
from spark_jobs.deploy.standalone import free_port
from tests.e2e_util import ROOT, completed_checkpoints, report, wait_for
from tests.reference import check
from tests.test_dagster_e2e import run_where, status

pytestmark = [pytest.mark.slow, pytest.mark.landing, pytest.mark.spark]

JOB = "clicks_per_user"
CLICKS = 240_000  # about 100 s of input at RATE: the first run and the restore run share it
RATE = 2_400.0


def warm_standbys(home: Path, run_id: str) -> int:
    """How many standby drivers of the run said they are warm (their log lines, relayed through
    the supervisor and Dagster Pipes into the run's log)."""
    with instance(home) as inst:
        return sum("warm, waiting" in (e.message or "") for e in inst.all_logs(run_id))


def drivers(home: Path, run_id: str) -> tuple[int, int | None]:
    """The run's active driver and its standby (None: none now), from its tags."""
    with instance(home) as inst:
        tags = inst.get_run_by_id(run_id).tags
    standby = tags.get(STANDBY_PID_TAG, "none")
    return int(tags[DRIVER_PID_TAG]), None if standby == "none" else int(standby)


def starts(home: Path, run_id: str) -> list[dict]:
    """The metadata of the run's ``streaming_jobs`` materializations (one per attempt start)."""
    with instance(home) as inst:
        records = inst.fetch_materializations(AssetKey("streaming_jobs"), limit=100).records
    rows = [r for r in records if r.run_id == run_id]
    return [
        {k: v.value for k, v in r.asset_materialization.metadata.items()}
        for r in sorted(rows, key=lambda r: r.timestamp)
    ]


def test_a_standby_takes_over_within_the_run_and_the_sensor_restores_when_both_die(tmp_path):
    home = tmp_path / "home"
    (home / "log").mkdir(parents=True)
    generator = subprocess.Popen(
        [sys.executable, "-m", "spark_jobs.commands", "--home", str(home), "generate", "clicks",
         "--count", str(CLICKS), "--rate", str(RATE), "--users", "3000"],
        cwd=ROOT,
    )  # fmt: skip
    dagster = DagsterProcesses(home, free_port()).start()
    try:
        register_partitions(home)
        first = launch_streaming_run(
            # idle for 45 s before it stops: the input (about 100 s) must not run out, and the
            # active driver stop, before the second standby is warm on a loaded machine
            dagster.client(),
            JOB,
            {"standby": True, "idle_timeout_s": 45.0},
        )

        # 1. kill the active driver once its standby is warm: the standby takes over in the run
        wait_for(lambda: warm_standbys(home, first) >= 1, 300, "a warm standby")
        active, standby = drivers(home, first)
        assert standby is not None
        killed_at = time.time()
        os.killpg(active, signal.SIGKILL)
        wait_for(lambda: len(starts(home, first)) >= 2, 120, "the takeover's first micro-batch")
        wait_for(
            lambda: any(r["attempt"] == 2 for r in completed_checkpoints(home, JOB)),
            120,
            "a checkpoint of the new attempt",
        )
        first_checkpoint_ms = min(
            r["complete_time_ms"] for r in completed_checkpoints(home, JOB) if r["attempt"] == 2
        )
        takeover = starts(home, first)[1]
        report(
            f"kill -9 of the active driver -> the standby's first micro-batch: "
            f"{takeover['takeover_s']:.1f} s from the death seen; -> first completed checkpoint "
            f"of the new attempt {first_checkpoint_ms / 1000 - killed_at:.1f} s"
        )
        assert takeover["attempt"] == "2" and takeover["takeover"] == "1"
        assert takeover["replaced_driver"] == str(active) and takeover["replaced_exit"] == "-9"
        assert drivers(home, first)[0] == standby
        assert status(home, first) == DagsterRunStatus.STARTED

        # 2. kill both drivers (the standby first): the run fails, the sensor restores
        wait_for(lambda: warm_standbys(home, first) >= 2, 300, "the next warm standby")
        active, standby = drivers(home, first)
        assert standby is not None
        os.killpg(standby, signal.SIGKILL)
        os.killpg(active, signal.SIGKILL)
        wait_for(lambda: run_where(home, **{RESTORE_OF_TAG: first}), 300, "a restore run")
        second = run_where(home, **{RESTORE_OF_TAG: first})
        assert status(home, first) == DagsterRunStatus.FAILURE
        config = second.run_config["ops"]["streaming_driver"]["config"]
        assert config["standby"] is True and config["restore"] == "latest"

        assert generator.wait(timeout=400) == 0
        finished = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
        wait_for(lambda: status(home, second.run_id) in finished, 400, "the restore run to end")
        assert status(home, second.run_id) == DagsterRunStatus.SUCCESS
    finally:
        if generator.poll() is None:
            generator.kill()
        dagster.stop()

    attempts = CatalogReader(RuntimePaths.under(home).catalog).jobs(JOB)
    assert [(a["attempt"], a["status"]) for a in attempts] == [
        (1, "LOST"),  # taken over: superseded by the takeover's attempt
        (2, "FAILED"),  # both drivers killed: the op recorded the run's end
        (3, "FINISHED"),  # the restore run, to the end of the input
    ]
    assert [a["run_id"] for a in attempts] == [first, first, second.run_id]
    assert all(r["status"] != "CORRUPT" for r in completed_checkpoints(home, JOB))
    report(check(JOB, home))
