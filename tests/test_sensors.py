"""The sensors against a real catalog (Delta tables written by delta-rs) and a test Dagster
instance: restore_on_failure, streaming_heartbeat, register_streaming_jobs; and the job that
records a stop in the catalog."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from dagster import (
    DagsterEvent,
    DagsterEventType,
    DagsterRunStatus,
    RunRequest,
    build_run_status_sensor_context,
    build_sensor_context,
    instance_for_test,
)

import orchestration.sensors.heartbeat as heartbeat
from orchestration.definitions import defs
from orchestration.partitions import (
    ATTEMPT_TAG,
    EXIT_CODE_TAG,
    JOB_TAG,
    RESTART_TAG,
    RESTORE_OF_TAG,
    SAVEPOINT_TAG,
    UPGRADE_OF_TAG,
)
from orchestration.resources import CutlinePaths
from orchestration.restart import Liveness
from orchestration.sensors.partitions import register_streaming_jobs
from orchestration.sensors.restore import STRATEGY, restore_on_failure
from orchestration.streaming import streaming_job
from orchestration.upgrade import restart_from_savepoint, upgrade_streaming_job
from spark_jobs.catalog.delta_catalog import DeltaCatalog
from spark_jobs.job_loader import job_names

JOB = "clicks_per_user"


@pytest.fixture
def instance():
    with instance_for_test() as inst:
        yield inst


@pytest.fixture
def paths(tmp_path) -> CutlinePaths:
    return CutlinePaths(home=str(tmp_path / "home"))


@pytest.fixture
def catalog(paths) -> DeltaCatalog:
    return DeltaCatalog(paths.paths().catalog)


def make_run(instance, status=None, config=None, resources=None, **tags):
    run_config = {"ops": {"streaming_driver": {"config": config or {}}}}
    if resources:
        run_config["resources"] = resources
    return instance.create_run_for_job(
        job_def=defs.get_job_def(streaming_job.name),
        run_config=run_config,
        tags={JOB_TAG: JOB, "dagster/partition": JOB, **tags},
        status=status,
    )


def fail(instance, run):
    event = instance.report_run_failed(run, "driver exited")
    return instance.get_run_by_id(run.run_id), event


def evaluate_restore(instance, run, event, paths):
    context = build_run_status_sensor_context(
        sensor_name="restore_on_failure",
        dagster_instance=instance,
        dagster_run=run,
        dagster_event=event,
        resources={"cutline_paths": paths},
    ).for_run_failure()
    return restore_on_failure(context)


def test_a_failed_run_is_restored_from_latest_with_its_allocation_as_hints(
    instance, paths, catalog
):
    resources = {  # the failed run's own roots: the restore must use the same
        "cutline_paths": {"config": {"home": paths.home, "checkpoint_root": "s3://bucket/ckpt"}},
        "s3": {"config": {"endpoint_url": "http://127.0.0.1:9"}},
    }
    run = make_run(
        instance, config={"idle_timeout_s": 5.0}, resources=resources, **{EXIT_CODE_TAG: "-9"}
    )
    attempt = catalog.begin_attempt(JOB, run_id=run.run_id)
    catalog.set_restored(JOB, attempt, None, {"0": "host-a", "1": "host-b"})
    run, event = fail(instance, run)

    request = evaluate_restore(instance, run, event, paths)

    assert isinstance(request, RunRequest)
    assert request.run_key == f"restore-{run.run_id}"  # one restore per failed run
    assert request.partition_key == JOB
    config = request.run_config["ops"]["streaming_driver"]["config"]
    assert config == {
        "idle_timeout_s": 5.0,  # the failed run's own settings carry over
        "restore": "latest",
        "hints": {"0": "host-a", "1": "host-b"},
        "delay_s": STRATEGY.initial_backoff_s,
    }
    assert request.run_config["resources"] == resources  # everything it was launched with
    assert request.tags[RESTORE_OF_TAG] == run.run_id
    assert request.tags[JOB_TAG] == JOB and request.tags[ATTEMPT_TAG] == "1"
    assert instance.get_run_by_id(run.run_id).tags[RESTART_TAG].startswith("restore 1 of")


def test_restores_back_off_and_stop_after_the_limit_saying_so(instance, paths, catalog):
    previous = None
    delays = []
    for _ in range(STRATEGY.max_restores + 1):
        tags = {RESTORE_OF_TAG: previous.run_id} if previous else {}
        run, event = fail(instance, make_run(instance, **tags))
        request = evaluate_restore(instance, run, event, paths)
        if request.job_name == streaming_job.name:
            delays.append(request.run_config["ops"]["streaming_driver"]["config"]["delay_s"])
        previous = run
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0]
    # the restores themselves failed, as the last one does: the strategy gives up
    run, event = fail(instance, make_run(instance, **{RESTORE_OF_TAG: previous.run_id}))
    request = evaluate_restore(instance, run, event, paths)
    assert request.job_name == "stop_streaming_job"
    assert request.run_config["ops"]["record_stopped"]["config"]["run_id"] == run.run_id
    assert instance.get_run_by_id(run.run_id).tags[RESTART_TAG].startswith("stopped: ")


def test_bad_configuration_is_not_restored(instance, paths, catalog):
    run, event = fail(instance, make_run(instance, **{EXIT_CODE_TAG: "2"}))
    request = evaluate_restore(instance, run, event, paths)
    assert request.job_name == "stop_streaming_job"
    reason = instance.get_run_by_id(run.run_id).tags[RESTART_TAG]
    assert "configuration" in reason


def test_the_stop_job_marks_the_attempt_stopped_in_the_catalog(instance, paths, catalog):
    run = make_run(instance)
    attempt = catalog.begin_attempt(JOB, run_id=run.run_id)
    catalog.set_job_status(JOB, attempt, "FAILED", "driver exited 1")
    result = defs.get_job_def("stop_streaming_job").execute_in_process(
        instance=instance,
        run_config={
            "ops": {
                "record_stopped": {
                    "config": {"job_name": JOB, "run_id": run.run_id, "reason": "5 restores"}
                }
            }
        },
        resources={"cutline_paths": paths},
    )
    assert result.success
    row = catalog.jobs(JOB)[-1]
    assert row["status"] == "STOPPED"
    assert "5 restores" in row["failure_reason"] and "driver exited 1" in row["failure_reason"]


def test_heartbeat_sensor_fails_runs_whose_driver_went_silent(
    instance, paths, catalog, monkeypatch
):
    monkeypatch.setattr(heartbeat, "LIVENESS", Liveness(heartbeat_timeout_s=1.5))
    other = "windowed_revenue"
    silent = make_run(instance, status=DagsterRunStatus.STARTED)
    alive = make_run(
        instance, status=DagsterRunStatus.STARTED, **{JOB_TAG: other, "dagster/partition": other}
    )
    catalog.begin_attempt(JOB, run_id=silent.run_id)
    alive_attempt = catalog.begin_attempt(other, run_id=alive.run_id)
    time.sleep(2.0)
    beat = time.time()
    catalog.heartbeat(other, alive_attempt)
    # The sensor's clock stands 1 s after the heartbeat was taken, however long the commit and the
    # evaluation take on a loaded machine: the silent attempt is >= 3 s old, the alive one 1 s.
    monkeypatch.setattr(heartbeat, "time", SimpleNamespace(time=lambda: beat + 1.0))

    context = build_sensor_context(instance=instance, resources={"cutline_paths": paths})
    heartbeat.streaming_heartbeat.evaluate_tick(context)

    assert instance.get_run_by_id(silent.run_id).status == DagsterRunStatus.FAILURE
    assert instance.get_run_by_id(alive.run_id).status == DagsterRunStatus.STARTED


def test_every_registered_job_gets_a_partition(instance):
    instance.add_dynamic_partitions("streaming_jobs", [JOB])
    data = register_streaming_jobs.evaluate_tick(build_sensor_context(instance=instance))
    (request,) = data.dynamic_partitions_requests
    assert sorted(request.partition_keys) == sorted(n for n in job_names() if n != JOB)


def test_an_upgrade_restarts_the_job_from_its_savepoint_at_the_new_parallelism(instance, paths):
    """The upgrade run stopped the job with a savepoint (its tag); when it succeeds, the
    streaming job is launched from that savepoint with the parallelism the upgrade asked for,
    the stopped run's config (not how it started: its restore and hints) and the upgrade run's
    roots."""
    resources = {"cutline_paths": {"config": {"home": paths.home}}}
    running = {"restore": "7", "hints": {"0": "h"}, "idle_timeout_s": 30.0, "parallelism": 2}
    instance.create_run_for_job(  # the run the upgrade stopped: how it ran is kept
        job_def=defs.get_job_def(streaming_job.name),
        run_config={"ops": {"streaming_driver": {"config": running}}, "resources": resources},
        tags={"dagster/partition": JOB, JOB_TAG: JOB},
        status=DagsterRunStatus.SUCCESS,
    )
    upgrade = instance.create_run_for_job(
        job_def=defs.get_job_def(upgrade_streaming_job.name),
        run_config={
            "ops": {"stop_with_savepoint": {"config": {"parallelism": 4}}},
            "resources": resources,
        },
        tags={"dagster/partition": JOB, SAVEPOINT_TAG: "s3://b/savepoints/savepoint-7-abc"},
        status=DagsterRunStatus.SUCCESS,
    )
    context = build_run_status_sensor_context(
        sensor_name="restart_from_savepoint",
        dagster_instance=instance,
        dagster_run=upgrade,
        dagster_event=DagsterEvent(
            DagsterEventType.RUN_SUCCESS.value, job_name=upgrade_streaming_job.name
        ),
    )
    request = restart_from_savepoint(context)
    assert isinstance(request, RunRequest)
    assert request.job_name in (None, streaming_job.name) and request.partition_key == JOB
    assert request.run_config == {
        "ops": {
            "streaming_driver": {
                "config": {
                    "restore": "s3://b/savepoints/savepoint-7-abc",
                    "parallelism": 4,
                    "idle_timeout_s": 30.0,
                }
            }
        },
        "resources": resources,
    }
    assert request.tags == {JOB_TAG: JOB, UPGRADE_OF_TAG: upgrade.run_id}
    assert request.run_key == f"upgrade-{upgrade.run_id}"  # one restart per upgrade
