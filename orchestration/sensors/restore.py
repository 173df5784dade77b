"""``restore_on_failure``: a failed streaming run is followed by a restore-from-latest run of the
same streaming job, placed where the failed attempt's state lives (executor hints)."""

from datetime import datetime, timedelta, timezone

from dagster import (
    DefaultSensorStatus,
    RunFailureSensorContext,
    RunRequest,
    RunsFilter,
    SkipReason,
    run_failure_sensor,
)

from orchestration.maintenance import stop_streaming_job
from orchestration.partitions import (
    ATTEMPT_TAG,
    EXIT_CODE_TAG,
    JOB_TAG,
    RESTART_TAG,
    RESTORE_OF_TAG,
)
from orchestration.resources import CutlinePaths, run_paths
from orchestration.restart import RestartStrategy, decide
from orchestration.streaming import streaming_job

STRATEGY = RestartStrategy()


def restores_in_window(context: RunFailureSensorContext, job_name: str) -> int:
    since = datetime.now(timezone.utc) - timedelta(seconds=STRATEGY.window_s)
    runs = context.instance.get_runs(
        RunsFilter(job_name=streaming_job.name, tags={JOB_TAG: job_name}, created_after=since)
    )
    return sum(RESTORE_OF_TAG in r.tags for r in runs)


@run_failure_sensor(
    name="restore_on_failure",
    monitored_jobs=[streaming_job],
    request_jobs=[streaming_job, stop_streaming_job],
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=5,
    description=(
        "Restores a failed streaming run from the latest completed checkpoint, with the failed "
        "attempt's allocation as executor hints; exponential backoff, at most "
        f"{STRATEGY.max_restores} restores per {STRATEGY.window_s:.0f} s, then it stops"
    ),
)
def restore_on_failure(context: RunFailureSensorContext, cutline_paths: CutlinePaths):
    failed = context.dagster_run
    job_name = failed.tags.get(JOB_TAG)
    if not job_name:
        return SkipReason(f"run {failed.run_id} has no {JOB_TAG} tag")
    code = failed.tags.get(EXIT_CODE_TAG)
    decision = decide(STRATEGY, restores_in_window(context, job_name), int(code) if code else None)
    if not decision.restart:
        context.instance.add_run_tags(failed.run_id, {RESTART_TAG: "stopped: " + decision.reason})
        return RunRequest(
            run_key=f"stop-{failed.run_id}",
            job_name=stop_streaming_job.name,
            run_config={
                "ops": {
                    "record_stopped": {
                        "config": {
                            "job_name": job_name,
                            "run_id": failed.run_id,
                            "reason": decision.reason,
                        }
                    }
                }
            },
            tags={RESTORE_OF_TAG: failed.run_id},
        )
    # everything the failed run was launched with (op config and resources: roots, S3, master)
    ops = failed.run_config.get("ops", {})
    previous = ops.get("streaming_driver", {}).get("config", {})
    config = {
        **previous,
        "restore": "latest",
        # where the failed run's attempt (or the latest that recorded one) placed its subtasks
        "hints": run_paths(failed.run_config, cutline_paths)
        .catalog()
        .allocation(job_name, failed.run_id),
        "delay_s": decision.delay_s,
    }
    run_config = {**failed.run_config, "ops": {**ops, "streaming_driver": {"config": config}}}
    context.instance.add_run_tags(
        failed.run_id, {RESTART_TAG: f"{decision.reason}, after {decision.delay_s:.0f} s"}
    )
    return RunRequest(
        run_key=f"restore-{failed.run_id}",
        job_name=streaming_job.name,
        partition_key=job_name,
        run_config=run_config,
        tags={JOB_TAG: job_name, RESTORE_OF_TAG: failed.run_id, ATTEMPT_TAG: str(decision.number)},
    )
