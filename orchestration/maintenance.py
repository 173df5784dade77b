"""Jobs that write to the catalog in-process, on a Spark session from dagster-pyspark."""

from dagster import Config, OpExecutionContext, job, op
from dagster_pyspark import PySparkResource

from orchestration.resources import CutlinePaths
from spark_jobs.delta_catalog import DeltaCatalog


class StopConfig(Config):
    job_name: str
    run_id: str
    reason: str


@op(description="Records in the catalog that the restart strategy stopped restoring a job")
def record_stopped(
    context: OpExecutionContext,
    config: StopConfig,
    pyspark: PySparkResource,
    cutline_paths: CutlinePaths,
) -> None:
    catalog = DeltaCatalog(pyspark.spark_session, cutline_paths.paths().warehouse)
    rows = catalog.jobs(config.job_name)
    # the failed run's attempt, or the newest if its driver died before writing one
    mine = [r for r in rows if r["run_id"] == config.run_id] or rows[-1:]
    if not mine:
        context.log.warning(f"{config.job_name} has no attempt in the catalog to mark")
        return
    row = mine[-1]
    reason = f"restarts stopped: {config.reason}; last failure: {row['failure_reason'] or '?'}"
    catalog.set_job_status(config.job_name, row["attempt"], "STOPPED", reason)
    context.log.info(f"{config.job_name} attempt {row['attempt']} marked STOPPED: {reason}")


@job(description="Marks a streaming job STOPPED in the catalog (restart strategy gave up)")
def stop_streaming_job() -> None:
    record_stopped()
