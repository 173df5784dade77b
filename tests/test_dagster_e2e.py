"""Automatic recovery through Dagster, end to end, with a real dagster-daemon and webserver, of a
user's job: ``sessions`` from the separately installed package examples/sessions, which Dagster
finds through the ``cutline.jobs`` entry point (its partition, the streaming run, the sensors).

Clicks keep arriving; the checkpoint root is on the S3 server, given only in the run's resource
config (not in the deployment's settings), and snapshot uploads are slowed down so that
checkpoints are pending. The Spark driver is killed with SIGKILL while a checkpoint's uploads
are in flight: ``restore_on_failure`` launches a restore run with the failed run's whole config
(the S3 root included) that restores the latest checkpoint from the local copies, with the failed
attempt's allocation as hints. The restore run's driver is killed with SIGKILL too, and then the
third run's own Dagster process: its driver notices and stops, ``streaming_heartbeat`` marks the
run failed, and a fourth run restores. Then ``upgrade_streaming_job`` is launched as from the UI
with parallelism 3: it stops the fourth run with a savepoint, and ``restart_from_savepoint``
starts the job from it with the same roots and idle timeout at parallelism 3 (its keyed state
and timers rescaled), which runs to the end. No checkpoint is marked CORRUPT, and the sessions
equal what pandas computes from the input (tests/reference.py): nothing lost, nothing
duplicated.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterRunStatus

from orchestration.demo import DagsterProcesses, instance, launch_streaming_run, register_partitions
from orchestration.partitions import (
    DRIVER_PID_TAG,
    RESTORE_OF_TAG,
    UPGRADE_OF_TAG,
    WORKER_PID_TAG,
)
from spark_jobs.catalog.tables import CatalogReader, read_delta
from spark_jobs.deploy.standalone import free_port, parent_pid
from state.restore import read_manifest
from state.storage import open_storage
from tests.e2e_util import ROOT, checkpoints_so_far, completed_checkpoints, report, wait_for
from tests.reference import check

pytestmark = [pytest.mark.slow, pytest.mark.landing, pytest.mark.spark]

JOB = "sessions"  # registered by examples/sessions through the cutline.jobs entry point
HOST = socket.gethostname()
# Two partitions of clicks, CLICKS in total, arriving at RATE records/s; the generator appends
# to them in turn, so one runs ahead of the other in event time. The job's watermark is the
# minimum over the partitions (as in Flink), so the one behind holds it and none of its clicks
# is late; the reference computes the same rule from the records' partitions.
CLICKS = 440_000
RATE = 2_400.0
UPLOAD_DELAY_S = "3"  # every snapshot's asynchronous part starts this late


def runs(home: Path) -> list:
    with instance(home) as inst:
        return list(reversed(inst.get_runs()))


def run_where(home: Path, **tags) -> object | None:
    for r in runs(home):
        if all(r.tags.get(k) == v for k, v in tags.items()):
            return r
    return None


def status(home: Path, run_id: str) -> DagsterRunStatus:
    with instance(home) as inst:
        return inst.get_run_by_id(run_id).status


def first_batch_at(home: Path, run_id: str) -> float | None:
    """When the run's driver finished its first micro-batch (its streaming_jobs report)."""
    with instance(home) as inst:
        records = inst.fetch_materializations(AssetKey("streaming_jobs"), limit=50).records
    for record in records:
        if record.run_id == run_id:
            return record.asset_materialization.metadata["first_batch_at"].value
    return None


def failure_message(home: Path, run_id: str) -> str:
    with instance(home) as inst:
        return " ".join(
            e.message or ""
            for e in inst.all_logs(run_id)
            if e.is_dagster_event and e.dagster_event.event_type_value == "PIPELINE_FAILURE"
        )


def attempts(home: Path) -> list[dict]:
    return table_rows_dicts(home / "warehouse" / "catalog" / "streaming_jobs")


def table_rows_dicts(path: Path) -> list[dict]:
    return read_delta(path, JOB).to_pylist()


def pending_checkpoints(home: Path, root: str, endpoint: str) -> list[int]:
    """Checkpoint ids triggered (claimed) whose completion is not in the catalog yet: their
    snapshots' uploads are in flight."""
    paths = [info.path.split("/") for info in open_storage(root, endpoint_url=endpoint).list(JOB)]
    claimed = {
        int(p[1].removeprefix("chk-"))
        for p in paths
        if len(p) == 3 and p[1].startswith("chk-") and p[2] == "_claim"
    }
    return sorted(claimed - {r["checkpoint_id"] for r in completed_checkpoints(home, JOB)})


def driver_of(home: Path, **tags) -> int:
    """The Spark driver's pid of the run with ``tags``, once it has reported it."""
    wait_for(lambda: DRIVER_PID_TAG in getattr(run_where(home, **tags), "tags", {}), 120, "pid")
    return int(run_where(home, **tags).tags[DRIVER_PID_TAG])


def test_dagster_restores_a_users_job_after_driver_kills_and_a_lost_run_process(
    tmp_path, s3_server, s3_bucket
):
    home = tmp_path / "home"
    root = f"s3://{s3_bucket}/checkpoints"
    resources = {"cutline_paths": {"checkpoint_root": root}, "s3": {"endpoint_url": s3_server}}
    (home / "log").mkdir(parents=True)
    generator = subprocess.Popen(
        [sys.executable, "-m", "spark_jobs.commands", "--home", str(home), "generate", "clicks",
         "--count", str(CLICKS), "--partitions", "2", "--rate", str(RATE), "--users", "5000"],
        cwd=ROOT,
    )  # fmt: skip
    slow_uploads = {"CUTLINE_FAULT_UPLOAD_DELAY_S": UPLOAD_DELAY_S}
    dagster = DagsterProcesses(home, free_port(), env=slow_uploads).start()
    try:
        register_partitions(home)
        first = launch_streaming_run(dagster.client(), JOB, {"idle_timeout_s": 20.0}, resources)

        # 1. kill -9 the Spark driver while a checkpoint's uploads are in flight, once two
        # checkpoints completed
        wait_for(lambda: len(checkpoints_so_far(home, JOB)) >= 2, 300, "2 checkpoints")
        assert run_where(home, **{"cutline/job": JOB}).run_id == first
        driver = driver_of(home, **{"cutline/job": JOB})
        wait_for(lambda: pending_checkpoints(home, root, s3_server), 60, "a pending checkpoint")
        pending = pending_checkpoints(home, root, s3_server)
        killed_at = time.time()
        os.kill(driver, signal.SIGKILL)
        done = {r["checkpoint_id"] for r in completed_checkpoints(home, JOB)}
        in_flight = [i for i in pending if i not in done]
        report(f"\nkill -9 of the driver with checkpoints {in_flight} in flight")
        assert in_flight, f"checkpoints {pending} completed before the kill"

        wait_for(lambda: run_where(home, **{RESTORE_OF_TAG: first}), 300, "a restore run")
        second = run_where(home, **{RESTORE_OF_TAG: first})
        assert status(home, first) == DagsterRunStatus.FAILURE
        config = second.run_config["ops"]["streaming_driver"]["config"]
        assert second.run_config["resources"] == {k: {"config": v} for k, v in resources.items()}
        assert config["hints"] == {"0": HOST, "1": HOST}  # the failed attempt's allocation
        assert config["restore"] == "latest" and config["idle_timeout_s"] == 20.0
        wait_for(lambda: first_batch_at(home, second.run_id), 300, "the restored first batch")
        # a figure, not a bound: the restart's time is measured in bench/ (issue 39); a loaded CI
        # machine took 152 s where this one takes 38-49 s
        recovery_s = first_batch_at(home, second.run_id) - killed_at
        report(f"kill -9 of the driver -> first micro-batch of the restore run: {recovery_s:.1f} s")

        recoveries = table_rows_dicts(home / "warehouse" / "catalog" / "recoveries")
        (recovery,) = [r for r in recoveries if r["attempt"] == 2]
        assert (recovery["subtasks_local"], recovery["subtasks_remote"]) == (2, 0)
        assert json.loads(recovery["hints"]) == {"0": HOST, "1": HOST}

        # 2. kill -9 the restore run's driver too, once it completed a checkpoint
        wait_for(
            lambda: any(r["attempt"] == 2 for r in completed_checkpoints(home, JOB)),
            300,
            "a checkpoint of attempt 2",
        )
        os.kill(driver_of(home, **{RESTORE_OF_TAG: first}), signal.SIGKILL)
        wait_for(lambda: run_where(home, **{RESTORE_OF_TAG: second.run_id}), 300, "a 2nd restore")
        third = run_where(home, **{RESTORE_OF_TAG: second.run_id})
        assert status(home, second.run_id) == DagsterRunStatus.FAILURE

        # 3. after a checkpoint, kill -9 the third run's own process (the run worker) and the
        # code server that launched it, which would otherwise report the death: as when the
        # host goes away, nobody says the run ended; its driver stops heartbeating.
        wait_for(
            lambda: any(r["attempt"] == 3 for r in completed_checkpoints(home, JOB)),
            300,
            "a checkpoint of attempt 3",
        )
        killed_at = time.time()
        worker = int(run_where(home, **{RESTORE_OF_TAG: second.run_id}).tags[WORKER_PID_TAG])
        os.kill(parent_pid(worker), signal.SIGKILL)
        os.kill(worker, signal.SIGKILL)
        wait_for(lambda: run_where(home, **{RESTORE_OF_TAG: third.run_id}), 300, "a third restore")
        detected_s = time.time() - killed_at
        report(f"run process killed -> marked failed, restore requested: {detected_s:.1f} s")
        assert status(home, third.run_id) == DagsterRunStatus.FAILURE
        assert "driver lost" in failure_message(home, third.run_id)  # streaming_heartbeat
        fourth = run_where(home, **{RESTORE_OF_TAG: third.run_id})

        # 4. the upgrade flow, launched as from the UI: once the fourth run checkpointed,
        # upgrade_streaming_job stops it with a savepoint and restart_from_savepoint starts the
        # job from that savepoint at parallelism 3 (its state rescaled), which runs to the end
        wait_for(
            lambda: any(r["attempt"] == 4 for r in completed_checkpoints(home, JOB)),
            300,
            "a checkpoint of attempt 4",
        )
        upgrade = dagster.client().submit_job_execution(
            "upgrade_streaming_job",
            run_config={
                "ops": {"stop_with_savepoint": {"config": {"parallelism": 3}}},
                "resources": {k: {"config": v} for k, v in resources.items()},
            },
            tags={"dagster/partition": JOB},
        )
        wait_for(lambda: run_where(home, **{UPGRADE_OF_TAG: upgrade}), 300, "the upgraded run")
        assert status(home, upgrade) == DagsterRunStatus.SUCCESS
        upgraded = run_where(home, **{UPGRADE_OF_TAG: upgrade})
        [saved] = CatalogReader(home / "warehouse" / "catalog").savepoints(JOB)
        assert saved["stopped"] and saved["status"] == "COMPLETED"
        config = upgraded.run_config["ops"]["streaming_driver"]["config"]
        assert config == {"restore": saved["location"], "parallelism": 3, "idle_timeout_s": 20.0}
        assert upgraded.run_config["resources"] == second.run_config["resources"]

        # 5. the upgraded run runs to the end of the input
        assert generator.wait(timeout=400) == 0
        finished = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
        wait_for(lambda: status(home, upgraded.run_id) in finished, 400, "the last run to end")
        assert status(home, upgraded.run_id) == DagsterRunStatus.SUCCESS
        assert status(home, fourth.run_id) == DagsterRunStatus.SUCCESS, "stopped, FINISHED"
    finally:
        if generator.poll() is None:
            generator.kill()
        dagster.stop()

    rows = sorted(attempts(home), key=lambda r: r["attempt"])
    assert [r["status"] for r in rows] == [
        "FAILED",  # killed -9: the run's op saw spark-submit report it and said so
        "FAILED",
        "FAILED",  # its run process died: the driver stopped itself
        "FINISHED",  # stopped with a savepoint by the upgrade
        "FINISHED",
    ]
    for killed in rows[:2]:
        assert "(exit code 137: killed by signal 9 (SIGKILL))" in killed["failure_reason"]
    assert all(r["status"] != "CORRUPT" for r in completed_checkpoints(home, JOB))
    latest = max(completed_checkpoints(home, JOB), key=lambda r: r["checkpoint_id"])
    manifest = read_manifest(open_storage(root, endpoint_url=s3_server), latest["metadata_path"])
    assert latest["attempt"] == 5 and {h.subtask for h in manifest.subtasks} == {0, 1, 2}
    assert not (home / "checkpoints").exists(), "nothing was written under the default root"
    report(check("sessions", home))
