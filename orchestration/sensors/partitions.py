"""``register_streaming_jobs``: one dynamic partition per registered streaming job."""

from dagster import (
    DefaultSensorStatus,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from orchestration.partitions import streaming_job_partitions
from spark_jobs.job_loader import job_names


@sensor(
    name="register_streaming_jobs",
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=30,
    description="Adds a streaming_jobs partition for every job in the job registry",
)
def register_streaming_jobs(context: SensorEvaluationContext):
    existing = set(context.instance.get_dynamic_partitions(streaming_job_partitions.name))
    new = [name for name in job_names() if name not in existing]
    if not new:
        return SkipReason("every registered streaming job has its partition")
    return SensorResult(
        dynamic_partitions_requests=[streaming_job_partitions.build_add_request(new)]
    )
