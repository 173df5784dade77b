"""Everything Dagster loads (``workspace.yaml``): the catalog assets and their checks, the
savepoints asset, the streaming job, the savepoint-and-stop and upgrade jobs, the sensors that
register jobs, restore failed runs, catch lost drivers and restart upgraded jobs from their
savepoints, the scheduled retention GC, catalog compaction and restore drill, and the
resources, which default to the embedded setup under ``$CUTLINE_HOME``."""

from __future__ import annotations

from dagster import Definitions

from orchestration.assets.catalog import completed_checkpoints, shared_state_files, streaming_jobs
from orchestration.assets.checks import (
    catalog_checks_job,
    checkpoint_freshness,
    checks_schedule,
    drill_schedule,
    no_dangling_references,
    restore_drill,
    restore_drill_job,
    storage_bounded,
)
from orchestration.assets.savepoints import savepoint_and_stop, savepoints
from orchestration.maintenance import (
    compaction_job,
    compaction_schedule,
    retention_job,
    retention_schedule,
    stop_streaming_job,
)
from orchestration.resources import CutlinePaths, S3Resource, SparkSubmit
from orchestration.sensors.heartbeat import streaming_heartbeat
from orchestration.sensors.partitions import register_streaming_jobs
from orchestration.sensors.restore import restore_on_failure
from orchestration.streaming import streaming_job
from orchestration.upgrade import restart_from_savepoint, upgrade_streaming_job

defs = Definitions(
    assets=[streaming_jobs, completed_checkpoints, shared_state_files, savepoints],
    asset_checks=[checkpoint_freshness, no_dangling_references, storage_bounded, restore_drill],
    jobs=[
        streaming_job,
        retention_job,
        compaction_job,
        stop_streaming_job,
        catalog_checks_job,
        restore_drill_job,
        savepoint_and_stop,
        upgrade_streaming_job,
    ],
    sensors=[
        register_streaming_jobs,
        restore_on_failure,
        streaming_heartbeat,
        restart_from_savepoint,
    ],
    schedules=[retention_schedule, compaction_schedule, checks_schedule, drill_schedule],
    resources={
        "cutline_paths": CutlinePaths(),
        "spark_submit": SparkSubmit(),
        "s3": S3Resource(),
    },
)
