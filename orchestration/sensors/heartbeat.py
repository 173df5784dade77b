"""``streaming_heartbeat``: a streaming run marked running whose driver stopped heartbeating (its
run process was killed, so nobody will mark it failed) is marked failed, which lets
``restore_on_failure`` restore it."""

import time

from dagster import (
    DagsterRunStatus,
    DefaultSensorStatus,
    RunsFilter,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from orchestration.partitions import JOB_TAG
from orchestration.resources import CutlinePaths, run_paths
from orchestration.restart import Liveness, lost_reason
from orchestration.streaming import streaming_job

LIVENESS = Liveness()


@sensor(
    name="streaming_heartbeat",
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=10,
    description=(
        "Fails streaming runs whose driver stopped heartbeating in the catalog "
        f"({LIVENESS.heartbeat_timeout_s:.0f} s), so that restore_on_failure restores them"
    ),
)
def streaming_heartbeat(context: SensorEvaluationContext, cutline_paths: CutlinePaths):
    records = context.instance.get_run_records(
        RunsFilter(job_name=streaming_job.name, statuses=[DagsterRunStatus.STARTED])
    )
    now = int(time.time() * 1000)
    failed = []
    for record in records:
        run = record.dagster_run
        job_name = run.tags.get(JOB_TAG)
        if not job_name:
            continue
        catalog = run_paths(run.run_config, cutline_paths).catalog()
        attempts = [r for r in catalog.jobs(job_name) if r["run_id"] == run.run_id]
        started = int((record.start_time or record.create_timestamp.timestamp()) * 1000)
        reason = lost_reason(attempts[-1] if attempts else None, started, now, LIVENESS)
        if reason:
            context.instance.report_run_failed(run, f"driver lost: {reason}")
            failed.append(run.run_id)
    if not failed:
        return SkipReason(f"{len(records)} running streaming run(s), all alive")
    context.log.info(f"marked failed (driver lost): {failed}")
    return SkipReason(f"marked {len(failed)} run(s) failed: {', '.join(failed)}")
