"""The streaming Dagster job: one run is one attempt of one streaming job (its partition).

The op submits the Spark driver (``spark-submit ... cutline run JOB``) and talks to it through
Dagster Pipes: the driver reports each completed checkpoint, which the op logs as a
materialization of ``completed_checkpoints`` for the job's partition while the run goes on, and
the start of processing as a materialization of ``streaming_jobs`` (orchestration/driver_events.py).
With ``standby``, the op runs ``cutline run JOB --standby`` instead: an active driver and a warm
standby that takes over, within the run, when the active one dies (spark_jobs/driver/standby.py).
If the driver exits non-zero or is killed (with a standby: both drivers, or their supervisor),
the run fails and ``restore_on_failure`` takes over.
"""

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from dagster import (
    Config,
    DagsterRunStatus,
    Failure,
    OpExecutionContext,
    PartitionedConfig,
    PipesEnvContextInjector,
    PipesTempFileMessageReader,
    RunsFilter,
    in_process_executor,
    job,
    op,
    open_pipes_session,
)
from dagster_pipes import PipesDefaultMessageWriter
from pydantic import Field

from orchestration.driver_events import DriverEvents
from orchestration.driver_exit import (
    close_pipes_for_signalled,
    exit_description,
    record_driver_exit,
)
from orchestration.metadata import ident
from orchestration.partitions import (
    EXIT_CODE_TAG,
    JOB_TAG,
    SUBMIT_PID_TAG,
    WORKER_PID_TAG,
    streaming_job_partitions,
)
from orchestration.resources import CutlinePaths, S3Resource, SparkSubmit
from spark_jobs.catalog import open_catalog
from spark_jobs.job_loader import get_job
from state.redaction import redact_argv


class StreamingRunConfig(Config):
    """How this attempt starts; the defaults run the job from its latest checkpoint."""

    restore: str = Field(
        default="latest",
        description="latest, none, a checkpoint id, or a savepoint's location (path or URL)",
    )
    parallelism: int | None = Field(
        default=None,
        description="another parallelism than the job's: its state is rescaled on restore",
    )
    hints: dict[str, str] = Field(
        default_factory=dict,
        description="executor hints: subtask -> host that holds its local state copy",
    )
    delay_s: float = Field(default=0.0, description="restart backoff before the driver starts")
    max_batches: int | None = Field(default=None, description="stop after N micro-batches")
    idle_timeout_s: float | None = Field(
        default=None, description="stop after S seconds without input (None: run until stopped)"
    )
    until_caught_up: bool = Field(
        default=False,
        description="stop, after a final checkpoint, once the job has read all its input "
        "(a backfill or a batch rerun)",
    )
    standby: bool = Field(
        default=False,
        description="keep a second driver warm beside the active one: it takes over within "
        "this run, in seconds, when the active driver dies",
    )


def _refuse_concurrent(context: OpExecutionContext, job_name: str) -> None:
    """At most one active run per streaming job (the run queue enforces it by tag; this also
    covers runs that bypassed the queue). The catalog's attempt fencing stands behind both."""
    active = context.instance.get_runs(
        RunsFilter(
            tags={JOB_TAG: job_name},
            statuses=[DagsterRunStatus.STARTED, DagsterRunStatus.STARTING],
        )
    )
    others = [r.run_id for r in active if r.run_id != context.run_id]
    if others:
        raise Failure(
            description=f"streaming job {job_name!r} already has an active run: {others[0]}",
            allow_retries=False,
        )


@op(description="Submits the Spark driver of this partition's streaming job and follows it")
def streaming_driver(
    context: OpExecutionContext,
    config: StreamingRunConfig,
    cutline_paths: CutlinePaths,
    spark_submit: SparkSubmit,
    s3: S3Resource,
) -> None:
    job_name = context.partition_key
    definition = get_job(job_name)  # unknown names fail here, clearly
    _refuse_concurrent(context, job_name)
    if config.delay_s > 0:
        context.log.info(f"restart backoff: waiting {config.delay_s:.1f} s before the driver")
        time.sleep(config.delay_s)
    with tempfile.TemporaryDirectory(prefix="cutline-run-") as tmp:
        args = ["--home", cutline_paths.home, "run", job_name, *cutline_paths.cli_args()]
        args += ["--restore", config.restore]
        args += ["--run-id", context.run_id]
        if config.hints:
            hints = Path(tmp) / "hints.json"
            hints.write_text(json.dumps(config.hints))
            args += ["--hints", str(hints)]
        if config.parallelism is not None:
            args += ["--parallelism", str(config.parallelism)]
        if config.max_batches is not None:
            args += ["--max-batches", str(config.max_batches)]
        if config.idle_timeout_s is not None:
            args += ["--idle-timeout", str(config.idle_timeout_s)]
        if config.until_caught_up:
            args.append("--until-caught-up")
        if config.standby:
            submit = spark_submit.standby_command(args)
        else:
            submit = spark_submit.command(args, needs=definition.spark_dependencies())
        forward = DriverEvents(context, job_name)
        with open_pipes_session(
            context=context,
            context_injector=PipesEnvContextInjector(),
            message_reader=PipesTempFileMessageReader(),
        ) as session:
            env = {
                **os.environ,
                **session.get_bootstrap_env_vars(),
                **s3.env(),
                **submit.env,
                "CUTLINE_WATCH_PID": str(os.getpid()),  # the driver stops if this worker dies
            }
            context.log.info("submitting: " + " ".join(redact_argv(submit.argv)))
            driver = subprocess.Popen(submit.argv, env=env)
            context.instance.add_run_tags(
                context.run_id, {WORKER_PID_TAG: str(os.getpid()), SUBMIT_PID_TAG: str(driver.pid)}
            )
            while driver.poll() is None:
                forward(session.get_custom_messages())
                time.sleep(0.5)
            path = session.message_reader_params.get(PipesDefaultMessageWriter.FILE_PATH_KEY)
            if path is not None:  # a signal ended the driver: closed on its behalf
                close_pipes_for_signalled(path, driver.returncode)
            forward(session.get_custom_messages())
    code = driver.returncode
    context.instance.add_run_tags(context.run_id, {EXIT_CODE_TAG: str(code)})
    if code != 0:
        why = exit_description(code)
        try:  # the catalog says it too, where the driver could not
            left = record_driver_exit(
                open_catalog(cutline_paths.paths().catalog), job_name, context.run_id, code
            )
        except Exception as e:  # the run fails as below all the same
            context.log.warning(f"the catalog could not record the driver's end: {e}")
        else:
            if left:
                context.log.error(f"attempt {left} of {job_name} ended without a word: {why}")
        raise Failure(
            description=f"the driver of {job_name} failed ({why})",
            metadata={"exit_code": ident(code), "checkpoints_completed": forward.checkpoints},
            allow_retries=False,
        )


@job(
    name="streaming_job",
    description="Runs a streaming job (the partition) from its latest completed checkpoint",
    # one process per run: the run worker is the op's process, which the driver watches
    executor_def=in_process_executor,
    config=PartitionedConfig(
        partitions_def=streaming_job_partitions,
        run_config_for_partition_key_fn=lambda key: {},
        tags_for_partition_key_fn=lambda key: {JOB_TAG: key},
    ),
)
def streaming_job() -> None:
    streaming_driver()
