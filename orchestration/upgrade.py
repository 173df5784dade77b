"""The upgrade (or rescale) flow, launchable from the Dagster UI: stop a streaming job with a
savepoint, then start it again from that savepoint, with the code the code location now loads
and, if given, another parallelism (its state rescaled on restore).

``upgrade_streaming_job`` (partitioned by streaming job) takes the stop-with-savepoint and tags
its run with the savepoint's location; ``restart_from_savepoint`` sees it succeed and launches
the streaming run from the savepoint, with the stopped run's config (its idle timeout, say) and
the upgrade's parallelism. A failure of that run is restored from the job's latest
checkpoint as any other (orchestration/sensors/restore.py): the savepoint became one.
"""

from dagster import (
    AssetMaterialization,
    Config,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    OpExecutionContext,
    RunRequest,
    RunsFilter,
    RunStatusSensorContext,
    SkipReason,
    job,
    op,
    run_status_sensor,
)
from pydantic import Field

from orchestration.assets.savepoints import savepoint_metadata
from orchestration.partitions import (
    JOB_TAG,
    SAVEPOINT_TAG,
    UPGRADE_OF_TAG,
    streaming_job_partitions,
)
from orchestration.resources import CutlinePaths, S3Resource
from orchestration.streaming import streaming_job
from spark_jobs.commands.savepoints import take_savepoint


class UpgradeConfig(Config):
    """The new run's parallelism (None: the job's), and where the savepoint goes."""

    parallelism: int | None = Field(default=None, description="rescale to this parallelism")
    target: str = Field(default="", description="a directory (path or URL); empty: the root")
    timeout_s: float = Field(default=600.0, description="how long to wait for the savepoint")


@op(description="Stops the streaming job (the partition) with a savepoint")
def stop_with_savepoint(
    context: OpExecutionContext, config: UpgradeConfig, cutline_paths: CutlinePaths, s3: S3Resource
) -> None:
    job_name = context.partition_key
    with s3.environment():
        row = take_savepoint(
            job_name,
            cutline_paths.paths(),
            target=config.target,
            stop=True,
            timeout_s=config.timeout_s,
            log=context.log.info,
        )
    context.log_event(
        AssetMaterialization("savepoints", partition=job_name, metadata=savepoint_metadata(row))
    )
    context.instance.add_run_tags(context.run_id, {SAVEPOINT_TAG: row["location"]})


@job(
    partitions_def=streaming_job_partitions,
    description="Upgrades or rescales a streaming job (the partition): stop with a savepoint, "
    "then (restart_from_savepoint) run it from the savepoint with today's code and the "
    "configured parallelism",
)
def upgrade_streaming_job() -> None:
    stop_with_savepoint()


# what a streaming run's config says of how it starts, not of how the job runs: not carried over
STARTING = ("restore", "hints", "delay_s")


def kept_config(instance: DagsterInstance, job_name: str) -> dict:
    """The config of the job's latest streaming run, less how that run started: an upgrade
    changes the code and perhaps the parallelism, not how the job runs (its idle timeout, say)."""
    records = instance.get_run_records(
        RunsFilter(job_name=streaming_job.name, tags={JOB_TAG: job_name}), limit=1
    )
    if not records:
        return {}
    ops = records[0].dagster_run.run_config.get("ops", {})
    config = ops.get("streaming_driver", {}).get("config", {})
    return {k: v for k, v in config.items() if k not in STARTING}


@run_status_sensor(
    name="restart_from_savepoint",
    run_status=DagsterRunStatus.SUCCESS,
    monitored_jobs=[upgrade_streaming_job],
    request_job=streaming_job,
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=5,
    description="Starts a streaming job again from the savepoint its upgrade run stopped it with",
)
def restart_from_savepoint(context: RunStatusSensorContext):
    upgrade = context.dagster_run
    job_name = upgrade.tags.get("dagster/partition")
    location = upgrade.tags.get(SAVEPOINT_TAG)
    if not job_name or not location:
        return SkipReason(f"run {upgrade.run_id} has no partition or savepoint tag")
    ops = upgrade.run_config.get("ops", {})
    parallelism = ops.get("stop_with_savepoint", {}).get("config", {}).get("parallelism")
    config = kept_config(context.instance, job_name) | {"restore": location}
    if parallelism:
        config["parallelism"] = parallelism
    resources = {k: v for k, v in upgrade.run_config.items() if k == "resources"}
    return RunRequest(
        run_key=f"upgrade-{upgrade.run_id}",
        partition_key=job_name,
        run_config={"ops": {"streaming_driver": {"config": config}}, **resources},
        tags={JOB_TAG: job_name, UPGRADE_OF_TAG: upgrade.run_id},
    )
