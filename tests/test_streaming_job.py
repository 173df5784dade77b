"""The streaming Dagster job without Spark: one active run per streaming job."""

from __future__ import annotations

from dagster import DagsterRunStatus, instance_for_test

from orchestration.definitions import defs
from orchestration.partitions import JOB_TAG
from orchestration.resources import CutlinePaths
from orchestration.streaming import streaming_job

JOB = "clicks_per_user"


def test_a_second_active_run_of_the_same_streaming_job_is_refused(tmp_path):
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("streaming_jobs", [JOB])
        running = instance.create_run_for_job(
            job_def=streaming_job, tags={JOB_TAG: JOB}, status=DagsterRunStatus.STARTED
        )
        result = defs.get_job_def("streaming_job").execute_in_process(
            partition_key=JOB,
            instance=instance,
            resources={"cutline_paths": CutlinePaths(home=str(tmp_path))},
            raise_on_error=False,
        )
    assert not result.success
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert f"already has an active run: {running.run_id}" in str(failure.step_failure_data.error)
    assert not (tmp_path / "warehouse").exists()  # no driver was submitted
